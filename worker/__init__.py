"""kcops.worker: the reference inference worker (`kcops serve`)."""
