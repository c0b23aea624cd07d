"""The KServe edge: InferenceServices read into the core's view, the percentage patched, the state store."""
