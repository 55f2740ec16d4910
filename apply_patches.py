#!/usr/bin/env python3
"""Install agentboost's adapters into the installed rLLM and veRL.

Supported pairs (anything else, mixed pairs included, is refused naming these):
rLLM v0.2.1.post1 + veRL 0.6.1 (patches rLLM's engine and trainer and veRL's vLLM server) and
rLLM v0.3.0-pre + veRL 0.7.1 (patches rLLM's engine and trainer; veRL 0.7.1's server needs no patch).

    python apply_patches.py            # check versions, hashes and that this interpreter imports agentboost; patch
    python apply_patches.py --check    # report; exit 1 unless everything is patched, unedited and importable
    python apply_patches.py --revert   # restore the original upstream files byte for byte
    python apply_patches.py --force    # also patch unknown upstream contents or files edited after patching
    python apply_patches.py --only rllm|verl   # one package's files (e.g. when the other is not installed)

See agentboost/patching.py for what is changed and how.
"""

import sys

from agentboost.patching import main

if __name__ == "__main__":
    sys.exit(main())
