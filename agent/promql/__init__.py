"""PromQL: parse and evaluate an expression over the store; knows nothing of alerts."""
