"""kcops.agent: the sidecar. Imports without torch."""
