"""The actions remediation runs, one module each, with their clients (Kubernetes, leases, Redis)."""
