#!/usr/bin/env bash
# GRPO on your own Strands environment and rows: the verl-native route (verl 0.9.1's own
# `python -m verl.trainer.main_ppo` with agentboost's strands_agent agent loop; no rLLM, nothing patched; its own
# environment: pip install "verl[vllm]==0.9.1" && pip install -c constraints/verl09.txt -e ".[verl09]").
# Data first, every row checked to build its environment:
#   agentboost prepare --data tasks.jsonl --env mypkg.envs:MyEnv --out data/mytasks
# then:
#   ENV_CLASS=mypkg.envs:MyEnv DATA=data/mytasks PYTHONPATH=$PWD bash examples/custom/train_verl.sh
#   AGENT_ARGS="agent_factory=mypkg.agents:make_agent" ENV_ARGS="reward_fn=mypkg.rewards:exact" ... (optional)
# Every other knob is an environment variable of examples/common/launch.sh (MODEL, GPUS, ROLLOUT_N, LR, ASYNC...);
# arguments are appended as Hydra overrides; DRY_RUN=1 prints the resolved command.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/launch.sh"
ab_load_example custom
if [[ $DRY_RUN != 1 ]] && ! ab_hydra_info "$@"; then
    for f in "$DATA_DIR/train.parquet" "$DATA_DIR/test.parquet"; do
        [[ -f $f ]] || ab_die "$f is missing: run agentboost prepare --data ROWS --env $ENV_CLASS --out $DATA first" \
            "(or set DATA to its --out directory)"
    done
fi
ab_run_verl "$@"
