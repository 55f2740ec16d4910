# shellcheck shell=bash
# Defaults of the tau2 example for both of its launch scripts (train_tau2_with_strands.sh, train_tau2_verl.sh):
# tau2-bench airline/retail (one tau2 DB per episode, tau2's own reward).
# Sourced by examples/common/launch.sh (which has the shared defaults); the environment wins over every line.
: "${TRAIN_BATCH_SIZE:=32}"
: "${VAL_BATCH_SIZE:=64}"
: "${MAX_PROMPT_LENGTH:=6144}"
: "${MAX_RESPONSE_LENGTH:=10240}"
: "${MAX_TOKEN_LEN_PER_GPU:=24000}"
: "${MAX_TURNS:=30}"
: "${EPISODE_TIMEOUT_S:=1200}"
: "${TOOL_TIMEOUT_S:=10}"
: "${TEST_FREQ:=5}"
: "${TOTAL_EPOCHS:=20}"
# the verl route's +strands.env_class (train_tau2_with_strands.py names the same class)
: "${STRANDS_ENV_CLASS:=agentboost.environments.tau2_env:Tau2Env}"
# The agent: tau2's domain policy as the system prompt, tools run in call order (rLLM route: agent_args).
AB_STRANDS_OPTIONS+=(+strands.agent_args.agent_factory=agentboost.environments.tau2_env:tau2_agent)
