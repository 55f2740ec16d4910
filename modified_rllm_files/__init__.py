"""agentboost's adapters for rLLM v0.2.1.post1, hooked into the installed rLLM by ``apply_patches.py``."""

SUPPORTED_RLLM = "0.2.1"
