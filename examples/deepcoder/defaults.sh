# shellcheck shell=bash
# Defaults of the deepcoder example for both of its launch scripts (train_deepcoder_with_strands.sh,
# train_deepcoder_verl.sh): DeepCoder problems with a sandboxed run_tests tool.
# Sourced by examples/common/launch.sh (which has the shared defaults); the environment wins over every line.
: "${TRAIN_BATCH_SIZE:=64}"
: "${VAL_BATCH_SIZE:=512}"
: "${MAX_PROMPT_LENGTH:=2048}"
: "${MAX_RESPONSE_LENGTH:=16384}"
: "${MAX_TOKEN_LEN_PER_GPU:=32000}"
: "${MAX_TURNS:=6}"
: "${EPISODE_TIMEOUT_S:=900}"
: "${TOOL_TIMEOUT_S:=60}"
: "${TEST_FREQ:=10}"
: "${TOTAL_EPOCHS:=1}"
# the verl route's +strands.env_class (train_deepcoder_with_strands.py names the same class)
: "${STRANDS_ENV_CLASS:=agentboost.environments.code_env:CodeEnv}"
