"""agentboost's adapters for veRL 0.6.1, hooked into the installed veRL by ``apply_patches.py``."""

SUPPORTED_VERL = "0.6.1"
