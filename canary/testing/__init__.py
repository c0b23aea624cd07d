"""Real components for tests, the demo and benchmarks: a Prometheus launcher and friends."""
