#!/usr/bin/env bash
# GRPO on tau2-bench airline/retail with a Strands agent (one tau2 DB per episode, tau2's own reward): verl-native route
# (verl 0.9.1's own `python -m verl.trainer.main_ppo` with agentboost's strands_agent agent loop; no rLLM,
# nothing patched; its own environment: docs/gpu-verl.md, constraints/verl09.txt).
# User side: solo by default. Simulated user (tau2's protocol): an OpenAI-compatible endpoint, e.g.
#   AGENTBOOST_TAU2_USER_URL=http://user-host:8001/v1 AGENTBOOST_TAU2_USER_MODEL=Qwen/Qwen3-32B bash $0
# (or prepare the data with --user-url/--user-model). Key: $OPENAI_API_KEY if the endpoint needs one.
# Data first: python examples/tau2/prepare_tau2_data.py --verl-out   (writes data/strands_tau2/verl/*.parquet)
# One 8-GPU node by default, verl's synchronous trainer; ASYNC=1 overlaps rollout and training on the same
# GPUs (colocate_async, partial rollouts), ASYNC=separate ROLLOUT_GPUS=N gives rollouts their own GPUs.
# Every knob is an environment variable (examples/common/launch.sh, this example's defaults.sh); arguments
# are appended as Hydra overrides; DRY_RUN=1 prints the resolved command.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/launch.sh"
ab_load_example tau2
if [[ -n ${AGENTBOOST_TAU2_USER_URL:-} ]]; then
    # The user simulator configured by $AGENTBOOST_TAU2_USER_*, sent to every episode as env_args (the
    # rLLM route's train_tau2_with_strands.py does the same): Ray workers on other nodes do not see this shell.
    user=$("$PYTHON" -c 'import dataclasses, json
from agentboost.environments.tau2_env import UserConfig
config = UserConfig.from_environ()
print(json.dumps(dataclasses.asdict(config)) if config is not None else "")')
    [[ -z $user ]] || AB_STRANDS_OPTIONS+=("+strands.env_args.user=$(ab_hydra "$user")")
fi
ab_run_verl "$@"
