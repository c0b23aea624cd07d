"""A simulated serving fleet (model pods, traffic, exporters) for the demo, end-to-end tests, benchmarks."""
