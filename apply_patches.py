#!/usr/bin/env python3
"""Install agentboost's adapters into the installed rLLM v0.2.1.post1 and veRL 0.6.1.

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
