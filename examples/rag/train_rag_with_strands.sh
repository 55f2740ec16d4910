#!/usr/bin/env bash
# GRPO on multi-hop QA (HotpotQA) with a Strands agent + retrieve tool: rLLM route
# (rLLM v0.2.1.post1 + veRL 0.6.1 or v0.3.0-pre + veRL 0.7.1, patched by `python apply_patches.py`).
# The retrieval server must be running: AGENTBOOST_RETRIEVAL_URL (default http://127.0.0.1:8010).
# Prerequisites: docs/gpu-rllm.md (stack installed, patches applied, data prepared and registered:
#   python examples/rag/prepare_rag_data.py).
# One 8-GPU node by default. Every knob is an environment variable (examples/common/launch.sh, this example's
# defaults.sh), e.g. MODEL=... GPUS=4 ROLLOUT_N=16; arguments are appended as Hydra overrides;
# DRY_RUN=1 prints the resolved command.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/launch.sh"
ab_load_example rag
ab_run_rllm "$AB_EXAMPLE_DIR/train_rag_with_strands.py" "$@"
