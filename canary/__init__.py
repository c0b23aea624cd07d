"""kserve-canary: automated, evidence-driven canary rollouts for KServe InferenceServices."""

__version__ = "0.1.0.dev0"
