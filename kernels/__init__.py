"""kcops.kernels: in-engine attention instrumentation. Importing it does nothing by itself."""
