# shellcheck shell=bash
# Defaults of the math example for both of its launch scripts (train_math_with_strands.sh, train_math_verl.sh):
# math (DeepScaleR train, AIME 2024 test) with a sandboxed python tool.
# Sourced by examples/common/launch.sh (which has the shared defaults); the environment wins over every line.
: "${TRAIN_BATCH_SIZE:=64}"
: "${VAL_BATCH_SIZE:=512}"
: "${MAX_PROMPT_LENGTH:=2048}"
: "${MAX_RESPONSE_LENGTH:=8192}"
: "${MAX_TOKEN_LEN_PER_GPU:=24000}"
: "${MAX_TURNS:=8}"
: "${EPISODE_TIMEOUT_S:=900}"
: "${TOOL_TIMEOUT_S:=30}"
: "${TEST_FREQ:=10}"
: "${TOTAL_EPOCHS:=1}"
# the verl route's +strands.env_class (train_math_with_strands.py names the same class)
: "${STRANDS_ENV_CLASS:=agentboost.environments.math_env:MathEnv}"
