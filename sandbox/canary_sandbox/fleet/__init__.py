"""Simulated model-server pods per revision and the metrics their exporters would serve."""
