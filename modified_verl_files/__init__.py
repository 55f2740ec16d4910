"""agentboost's adapter for veRL 0.6.1, hooked into the installed veRL by ``apply_patches.py``.

veRL 0.7.1 (rLLM v0.3.0-pre's pin) is not patched: its server honours ``max_tokens`` and reports aborts.
"""

SUPPORTED_VERL = "0.6.1"
