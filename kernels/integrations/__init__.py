"""Engine integrations of the probe."""
