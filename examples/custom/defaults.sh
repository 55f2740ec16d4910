# shellcheck shell=bash
# Defaults of the generic verl-route launch script (train_verl.sh): your own environment and rows.
# Sourced by examples/common/launch.sh (which has the shared defaults); the environment wins over every line.
#   ENV_CLASS   (required) your environment, module:Class; agentboost.environments.strands_env:StrandsEnv takes
#               each row's own tools and reward_fn (module:attr)
#   DATA        (data/custom) what `agentboost prepare --out DATA` wrote: DATA/verl/{train,test}.parquet
#   AGENT_ARGS  StrandsAgent options, space-separated KEY=VALUE: agent_factory=mypkg.agents:make_agent,
#               system_prompt='You are ...' (quote values with spaces; default: the parquet's system prompt)
#   ENV_ARGS    given to the environment with every row, space-separated KEY=VALUE: reward_fn=mypkg.rewards:exact
#   PYTHONPATH  where your modules are: forwarded to every Ray worker (relative entries made absolute)
[[ -n ${ENV_CLASS:-} ]] || ab_die "ENV_CLASS is required: your environment as module:Class" \
    "(e.g. ENV_CLASS=agentboost.environments.strands_env:StrandsEnv)"
: "${STRANDS_ENV_CLASS:=$ENV_CLASS}"
: "${DATA:=data/custom}"
: "${DATA_DIR:=$DATA/verl}"
: "${MAX_PROMPT_LENGTH:=2048}"
: "${MAX_RESPONSE_LENGTH:=4096}"
: "${MAX_TURNS:=8}"
: "${EPISODE_TIMEOUT_S:=600}"
: "${TOOL_TIMEOUT_S:=30}"

# ab_key_values PREFIX "K=V K2='V 2'": one +strands.PREFIX.K=V override per pair.
ab_key_values() {
    local prefix=$1 pair key value
    local -a pairs
    # split as a shell would (quotes keep a value with spaces whole), without evaluating anything
    mapfile -t pairs < <("${PYTHON:-python3}" -c 'import shlex, sys; print("\n".join(shlex.split(sys.argv[1])))' "$2") ||
        ab_die "$prefix: cannot split '$2' into KEY=VALUE words"
    for pair in "${pairs[@]}"; do
        [[ $pair == *=* && ${pair%%=*} =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || ab_die "$prefix: expected KEY=VALUE, got '$pair'"
        key=${pair%%=*}
        value=${pair#*=}
        AB_STRANDS_OPTIONS+=("+strands.$prefix.$key=$(ab_hydra "$value")")
    done
}
[[ -z ${AGENT_ARGS:-} ]] || ab_key_values agent_args "$AGENT_ARGS"
[[ -z ${ENV_ARGS:-} ]] || ab_key_values env_args "$ENV_ARGS"

if [[ -n ${PYTHONPATH:-} ]]; then
    ab_paths=()
    IFS=: read -ra ab_parts <<<"$PYTHONPATH"
    for ab_part in "${ab_parts[@]}"; do
        [[ -z $ab_part || $ab_part == /* ]] || ab_part="$PWD/$ab_part"
        ab_paths+=("$ab_part")
    done
    PYTHONPATH=$(IFS=:; printf '%s' "${ab_paths[*]}")
    export PYTHONPATH
    AB_EXTRA_ENV+=("PYTHONPATH=$PYTHONPATH")
    AB_FORWARD_ENV+=(PYTHONPATH)
fi
