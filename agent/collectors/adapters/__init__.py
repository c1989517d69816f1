"""Engine metrics adapters."""
