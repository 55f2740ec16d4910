#!/usr/bin/env bash
# GRPO on tau2-bench airline/retail with a Strands agent (one tau2 DB per episode, tau2's own reward): rLLM route
# (rLLM v0.2.1.post1 + veRL 0.6.1 or v0.3.0-pre + veRL 0.7.1, patched by `python apply_patches.py`).
# User side: solo by default. Simulated user (tau2's protocol): an OpenAI-compatible endpoint, e.g.
#   AGENTBOOST_TAU2_USER_URL=http://user-host:8001/v1 AGENTBOOST_TAU2_USER_MODEL=Qwen/Qwen3-32B bash $0
# (or prepare the data with --user-url/--user-model). Key: $OPENAI_API_KEY if the endpoint needs one.
# Prerequisites: docs/gpu-rllm.md (stack installed, patches applied, data prepared and registered:
#   python examples/tau2/prepare_tau2_data.py).
# One 8-GPU node by default. Every knob is an environment variable (examples/common/launch.sh, this example's
# defaults.sh), e.g. MODEL=... GPUS=4 ROLLOUT_N=16; arguments are appended as Hydra overrides;
# DRY_RUN=1 prints the resolved command.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/launch.sh"
ab_load_example tau2
ab_run_rllm "$AB_EXAMPLE_DIR/train_tau2_with_strands.py" "$@"
