#!/usr/bin/env bash
# GRPO on math with a Strands agent + sandboxed python tool: verl-native route
# (verl 0.9.1's own `python -m verl.trainer.main_ppo` with agentboost's strands_agent agent loop; no rLLM,
# nothing patched; its own environment: docs/gpu-verl.md, constraints/verl09.txt).
# Data first: python examples/math/prepare_math_data.py --verl-out   (writes data/strands_math/verl/*.parquet)
# One 8-GPU node by default, verl's synchronous trainer; ASYNC=1 overlaps rollout and training on the same
# GPUs (colocate_async, partial rollouts), ASYNC=separate ROLLOUT_GPUS=N gives rollouts their own GPUs.
# Every knob is an environment variable (examples/common/launch.sh, this example's defaults.sh); arguments
# are appended as Hydra overrides; DRY_RUN=1 prints the resolved command.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/launch.sh"
ab_load_example math
ab_run_verl "$@"
