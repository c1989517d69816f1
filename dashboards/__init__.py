"""Grafana dashboards: builder and generated JSON."""
