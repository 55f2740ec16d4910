#!/usr/bin/env bash
# GRPO on math with a Strands agent + sandboxed python tool: rLLM route
# (rLLM v0.2.1.post1 + veRL 0.6.1 or v0.3.0-pre + veRL 0.7.1, patched by `python apply_patches.py`).
# Prerequisites: docs/gpu-rllm.md (stack installed, patches applied, data prepared and registered:
#   python examples/math/prepare_math_data.py).
# One 8-GPU node by default. Every knob is an environment variable (examples/common/launch.sh, this example's
# defaults.sh), e.g. MODEL=... GPUS=4 ROLLOUT_N=16; arguments are appended as Hydra overrides;
# DRY_RUN=1 prints the resolved command.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/launch.sh"
ab_load_example math
ab_run_rllm "$AB_EXAMPLE_DIR/train_math_with_strands.py" "$@"
