"""Data: the alert table (rules.yaml) and its promtool unit tests."""
