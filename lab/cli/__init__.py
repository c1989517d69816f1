"""The lab's ``kcops kc`` subcommands, one module each (listed in :mod:`kcops.cli.kc`)."""
