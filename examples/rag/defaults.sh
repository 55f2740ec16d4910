# shellcheck shell=bash
# Defaults of the rag example for both of its launch scripts (train_rag_with_strands.sh, train_rag_verl.sh):
# multi-hop QA (HotpotQA) with a retrieve tool.
# Sourced by examples/common/launch.sh (which has the shared defaults); the environment wins over every line.
: "${TRAIN_BATCH_SIZE:=128}"
: "${VAL_BATCH_SIZE:=512}"
: "${MAX_PROMPT_LENGTH:=1024}"
: "${MAX_RESPONSE_LENGTH:=4096}"
: "${MAX_TOKEN_LEN_PER_GPU:=24000}"
: "${MAX_TURNS:=6}"
: "${EPISODE_TIMEOUT_S:=300}"
: "${TOOL_TIMEOUT_S:=15}"
: "${TEST_FREQ:=10}"
: "${TOTAL_EPOCHS:=1}"
# the verl route's +strands.env_class (train_rag_with_strands.py names the same class)
: "${STRANDS_ENV_CLASS:=agentboost.environments.rag_env:RagEnv}"
# The retrieval server every retrieve tool calls (rows prepared with --retrieval-url name their own).
: "${AGENTBOOST_RETRIEVAL_URL:=http://127.0.0.1:8010}"
AB_EXTRA_ENV+=("AGENTBOOST_RETRIEVAL_URL=$AGENTBOOST_RETRIEVAL_URL")
AB_FORWARD_ENV+=(AGENTBOOST_RETRIEVAL_URL)
