"""Benchmarks: decision quality and controller scale, with baselines measured in the same run."""
