"""agentboost's adapters for rLLM v0.2.1.post1 and v0.3.0-pre, hooked into rLLM by ``apply_patches.py``."""

SUPPORTED_RLLM = ("0.2.1", "0.3.0rc0")
