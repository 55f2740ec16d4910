# shellcheck shell=bash
# The launch base of every examples/<x>/train_<x>_with_strands.sh (rLLM route: rLLM + veRL 0.6.1 / 0.7.1) and
# train_<x>_verl.sh (verl-native route: verl 0.9.1's main_ppo with the strands_agent agent loop, no patches).
#
# A script sources this file, loads its example's defaults (examples/<x>/defaults.sh: the numbers that
# differ between examples) and calls ab_run_rllm or ab_run_verl. Every knob is an environment variable
# with a default; precedence: your environment > the example's defaults > the defaults below. Arguments
# given to the script are appended as Hydra overrides (the last one wins). DRY_RUN=1 prints the resolved
# command (environment included, one override per line, ready to paste) and exits without running it.
#
# Shared knobs (both routes):
#   MODEL (Qwen/Qwen3-4B-Instruct-2507)  GPUS per node (8)  NNODES (1)  PYTHON (python3)
#   TRAIN_BATCH_SIZE  VAL_BATCH_SIZE (prompts per validation batch)  MINI_BATCH_SIZE (= TRAIN_BATCH_SIZE:
#          prompts per optimizer step, TRAIN_BATCH_SIZE / MINI_BATCH_SIZE steps per training step; on the verl
#          route a mini-batch is whole prompt groups, however many trajectories (rows) their episodes have)
#   ROLLOUT_N (8)  VAL_N (4)
#   MAX_PROMPT_LENGTH  MAX_RESPONSE_LENGTH (the whole episode after the first prompt, tool tokens included)
#   LR (1e-6)  KL_COEF (0.0: no KL loss; anything else turns the k3 KL loss on, KL_TYPE low_var_kl)
#   CLIP_LOW (0.2)  CLIP_HIGH (0.28)  ENTROPY_COEFF (0)  MAX_TOKEN_LEN_PER_GPU (24000)
#   TP (rollout tensor parallel, 1)  GPU_MEMORY_UTILIZATION (0.8)  TEMPERATURE (1.0)  TOP_P (1.0)
#   VAL_TEMPERATURE (0.6)  VAL_TOP_P (0.95)
#   MAX_TURNS (model calls per episode)  EPISODE_TIMEOUT_S  TOOL_TIMEOUT_S
#   PROJECT_NAME (agentboost)  EXPERIMENT_NAME (<x>-strands, <x>-strands-verl)  LOGGER ([console,wandb])
#   WANDB_MODE (offline; online with WANDB_API_KEY to sync)  SAVE_FREQ (20)  TEST_FREQ (10)  TOTAL_EPOCHS (1)
# rLLM route only: LOGPROB_GAP_ALARM (1.0)
# verl route only:
#   DATA_DIR (data/strands_<x>/verl: what `prepare_<x>_data.py --verl-out` writes)
#   AGENT_WORKERS (8)  AGENT_LOOP_CONFIG (empty: the loop is registered by the external_lib plugin wherever
#          agentboost is importable; a YAML path adds per-entry options, e.g. the shipped
#          agentboost/integration/verl_agent_loop.yaml)
#   ROLLOUT (vllm | sglang: verl's SGLang server; install verl[sglang] instead of verl[vllm])
#   LORA_RANK (0: full fine-tuning; > 0 trains LoRA adapters and serves them to the rollout)  LORA_ALPHA (32)
#   LORA_TARGET_MODULES (all-linear, or a list like [q_proj,v_proj])
#   CHECKPOINT_DIR (verl's checkpoints/<project>/<experiment>)  RESUME (auto: the latest checkpoint in
#          CHECKPOINT_DIR if any; disable; or a global_step_N directory to resume from)
#   FORWARD_ENV (names of more variables to set on every Ray worker, e.g. "OPENAI_API_KEY"; their values are
#          printed with verl's config: for secrets prefer exporting them on every node before `ray start`)
#   Multi-node (NNODES > 1 or ROLLOUT_NODES > 1): DATA_DIR, MODEL (if a path), CHECKPOINT_DIR and AGENT_LOOP_CONFIG
#          must be the same path on every node (shared storage), and endpoints every episode calls
#          (AGENTBOOST_RETRIEVAL_URL, AGENTBOOST_TAU2_USER_URL) must not name this machine's loopback.
#   ASYNC: 0 (default) verl's V1 sync trainer; 1 = colocate_async (same GPUs; rollout of the next batch
#          overlaps training, in-flight generations are paused at the weight update and resumed on the new
#          weights: partial rollouts, handled by verl's client below the agent loop; ASYNC_WARMUP_BATCHES 1);
#          separate = separate_async (a pool of ROLLOUT_NODES (1) x ROLLOUT_GPUS GPUs serves rollouts only,
#          besides the trainer's NNODES x GPUS, e.g. GPUS=4 ROLLOUT_GPUS=4 on one 8-GPU node; weights go
#          over NCCL after every TRAIN_BATCH_SIZE / MINI_BATCH_SIZE updates).
#   An episode's waits on verl's servers (their queue, generation, the weight updates of both async modes) do
#   not count against EPISODE_TIMEOUT_S; +strands.request_timeout_s (1800) bounds each server call.

AB_COMMON_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
AB_REPO=$(cd "$AB_COMMON_DIR/../.." && pwd)
AB_OVERRIDES=()
AB_ENV=()
AB_EXTRA_ENV=()       # NAME=VALUE set for the trainer process (examples' defaults.sh add to it)
AB_FORWARD_ENV=()     # names forwarded to every Ray worker on the verl route
AB_STRANDS_OPTIONS=() # more +strands.* overrides for the verl route

ab_die() {
    echo "$(basename "$0"): $*" >&2
    exit 2
}

# ab_load_example NAME: the example's defaults (examples/NAME/defaults.sh), then the shared ones.
ab_load_example() {
    AB_EXAMPLE=$1
    AB_EXAMPLE_DIR="$AB_REPO/examples/$1"
    # shellcheck source=/dev/null
    source "$AB_EXAMPLE_DIR/defaults.sh"
    : "${MODEL:=Qwen/Qwen3-4B-Instruct-2507}"
    : "${GPUS:=8}"
    : "${NNODES:=1}"
    : "${PYTHON:=python3}"
    : "${TRAIN_BATCH_SIZE:=64}"
    : "${VAL_BATCH_SIZE:=512}"
    : "${MINI_BATCH_SIZE:=$TRAIN_BATCH_SIZE}"
    : "${ROLLOUT_N:=8}"
    : "${VAL_N:=4}"
    : "${MAX_PROMPT_LENGTH:=2048}"
    : "${MAX_RESPONSE_LENGTH:=8192}"
    : "${LR:=1e-6}"
    : "${KL_COEF:=0.0}"
    : "${KL_TYPE:=low_var_kl}"
    : "${CLIP_LOW:=0.2}"
    : "${CLIP_HIGH:=0.28}"
    : "${ENTROPY_COEFF:=0}"
    : "${MAX_TOKEN_LEN_PER_GPU:=24000}"
    : "${TP:=1}"
    : "${GPU_MEMORY_UTILIZATION:=0.8}"
    : "${TEMPERATURE:=1.0}"
    : "${TOP_P:=1.0}"
    : "${VAL_TEMPERATURE:=0.6}"
    : "${VAL_TOP_P:=0.95}"
    : "${MAX_TURNS:=8}"
    : "${EPISODE_TIMEOUT_S:=900}"
    : "${TOOL_TIMEOUT_S:=30}"
    : "${LOGPROB_GAP_ALARM:=1.0}"
    : "${PROJECT_NAME:=agentboost}"
    : "${LOGGER:=[console,wandb]}"
    : "${WANDB_MODE:=offline}"
    : "${SAVE_FREQ:=20}"
    : "${TEST_FREQ:=10}"
    : "${TOTAL_EPOCHS:=1}"
    : "${DRY_RUN:=0}"
    export WANDB_MODE
}

# ab_hydra VALUE: VALUE as a Hydra override value (quoted for Hydra when it holds anything but plain
# path/name characters, so a path with spaces or a model name with '=' stays one string).
ab_hydra() {
    if [[ $1 =~ ^[A-Za-z0-9_./:@%+-]+$ ]]; then
        printf '%s' "$1"
    elif [[ $1 == *"'"* || $1 == *'\'* ]]; then
        ab_die "value $1 holds a quote or a backslash: pass it as a Hydra override argument instead"
    else
        printf "'%s'" "$1"
    fi
}

ab_kl_on() { [[ ! $KL_COEF =~ ^[0.]*$ ]]; }

# The overrides both routes share (same keys in veRL 0.6.1, 0.7.1 and 0.9.1). $1: the advantage estimator.
ab_shared_overrides() {
    local use_kl=false
    ab_kl_on && use_kl=true
    AB_OVERRIDES+=(
        "algorithm.adv_estimator=$1"
        algorithm.norm_adv_by_std_in_grpo=true
        "data.train_batch_size=$TRAIN_BATCH_SIZE"
    )
    AB_OVERRIDES+=("data.val_batch_size=$VAL_BATCH_SIZE")
    AB_OVERRIDES+=(
        "data.max_prompt_length=$MAX_PROMPT_LENGTH"
        "data.max_response_length=$MAX_RESPONSE_LENGTH"
        "actor_rollout_ref.model.path=$(ab_hydra "$MODEL")"
        "actor_rollout_ref.hybrid_engine=${AB_HYBRID_ENGINE:-true}"
        "actor_rollout_ref.actor.optim.lr=$LR"
        "actor_rollout_ref.actor.ppo_mini_batch_size=$MINI_BATCH_SIZE"
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$MAX_TOKEN_LEN_PER_GPU"
        actor_rollout_ref.actor.use_dynamic_bsz=true
        actor_rollout_ref.actor.loss_agg_mode=token-mean
        "actor_rollout_ref.actor.clip_ratio_low=$CLIP_LOW"
        "actor_rollout_ref.actor.clip_ratio_high=$CLIP_HIGH"
        "actor_rollout_ref.actor.use_kl_loss=$use_kl"
        "actor_rollout_ref.actor.kl_loss_coef=$KL_COEF"
    )
    ab_kl_on && AB_OVERRIDES+=("actor_rollout_ref.actor.kl_loss_type=$KL_TYPE")
    AB_OVERRIDES+=(
        "actor_rollout_ref.actor.entropy_coeff=$ENTROPY_COEFF"
        actor_rollout_ref.actor.fsdp_config.param_offload=false
        actor_rollout_ref.model.enable_gradient_checkpointing=true
        "actor_rollout_ref.rollout.name=${AB_ROLLOUT:-vllm}"
        actor_rollout_ref.rollout.mode=async
        "actor_rollout_ref.rollout.tensor_model_parallel_size=$TP"
        "actor_rollout_ref.rollout.gpu_memory_utilization=$GPU_MEMORY_UTILIZATION"
        "actor_rollout_ref.rollout.n=$ROLLOUT_N"
        "actor_rollout_ref.rollout.temperature=$TEMPERATURE"
        "actor_rollout_ref.rollout.top_p=$TOP_P"
        "actor_rollout_ref.rollout.val_kwargs.n=$VAL_N"
        "actor_rollout_ref.rollout.val_kwargs.temperature=$VAL_TEMPERATURE"
        "actor_rollout_ref.rollout.val_kwargs.top_p=$VAL_TOP_P"
    )
    # rLLM's trainer (veRL 0.6.1/0.7.1's ray_trainer) reads it; verl 0.9.1's V1 trainer never does
    [[ ${AB_ROUTE:-} == rllm ]] && AB_OVERRIDES+=(actor_rollout_ref.rollout.val_kwargs.do_sample=true)
    return 0
}

ab_trainer_overrides() {
    AB_OVERRIDES+=(
        "trainer.logger=$LOGGER"
        "trainer.project_name=$(ab_hydra "$PROJECT_NAME")"
        "trainer.experiment_name=$(ab_hydra "$EXPERIMENT_NAME")"
        "trainer.n_gpus_per_node=$GPUS"
        "trainer.nnodes=$NNODES"
        "trainer.save_freq=$SAVE_FREQ"
        "trainer.test_freq=$TEST_FREQ"
        "trainer.total_epochs=$TOTAL_EPOCHS"
    )
}

# ab_quote ARG: ARG for a POSIX shell (as is when it holds only characters no shell treats specially).
ab_quote() {
    if [[ $1 =~ ^[A-Za-z0-9_./:,=+@%-]+$ ]]; then
        printf '%s' "$1"
    else
        printf "'%s'" "${1//\'/\'\\\'\'}"
    fi
}

# ab_exec ARGS...: run AB_PROGRAM ARGS... with AB_ENV set, or print it (DRY_RUN=1). The caller passes the
# overrides, then the script's own arguments (so they win).
ab_exec() {
    local -a cmd=("$@")
    if [[ $DRY_RUN == 1 ]]; then
        local line="" a
        for a in "${AB_ENV[@]}"; do line+="$(ab_quote "$a") "; done
        for a in "${AB_PROGRAM[@]}"; do line+="$(ab_quote "$a") "; done
        printf '%s \\\n' "${line% }"
        local n=${#cmd[@]} i sep
        for ((i = 0; i < n; i++)); do
            sep=' \'
            ((i + 1 < n)) || sep=''
            printf '    %s%s\n' "$(ab_quote "${cmd[i]}")" "$sep"
        done
        exit 0
    fi
    exec env "${AB_ENV[@]}" "${AB_PROGRAM[@]}" "${cmd[@]}"
}

# ab_run_rllm ENTRY.py [ARGS...]: the rLLM route (rLLM v0.2.1.post1 + veRL 0.6.1 or v0.3.0-pre + veRL 0.7.1,
# patched by apply_patches.py): ENTRY.py is the example's Hydra entry (rLLM's AgentTrainer).
ab_run_rllm() {
    local entry=$1
    shift
    AB_ROUTE=rllm
    : "${EXPERIMENT_NAME:=$AB_EXAMPLE-strands}"
    AB_ENV=("WANDB_MODE=$WANDB_MODE" VLLM_USE_V1=1 "${AB_EXTRA_ENV[@]}")
    AB_PROGRAM=("$PYTHON" "$entry")
    ab_shared_overrides grpo
    AB_OVERRIDES+=(
        "rllm.agent.max_steps=$MAX_TURNS"
        "rllm.agent.trajectory_timeout=$EPISODE_TIMEOUT_S"
        rllm.stepwise_advantage.enable=false
        "+rllm.strands.budget.tool_timeout_s=$TOOL_TIMEOUT_S"
        "+rllm.strands.logprob_gap_alarm=$LOGPROB_GAP_ALARM"
    )
    ab_trainer_overrides
    ab_exec "${AB_OVERRIDES[@]}" "$@"
}

# True when the script's arguments only ask Hydra to print or explain the config (--cfg job, --help ...).
ab_hydra_info() {
    local a
    for a in "$@"; do
        case $a in --cfg | -c | --help | -h | --hydra-help | --info | -i) return 0 ;; esac
    done
    return 1
}

# ab_forward_env NAME...: set variables reach every Ray worker of the verl route (runtime_env env_vars), on
# every node: a cluster started elsewhere (`ray start`) does not see this shell's environment.
ab_forward_env() {
    local name
    for name in "$@"; do
        [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || ab_die "cannot forward $name: not a variable name"
        if [[ -n ${!name:-} ]]; then
            [[ ${!name} == *"'"* || ${!name} == *'\'* ]] && ab_die "cannot forward $name: its value holds a quote or a backslash"
            # always quoted: Ray takes strings only, and Hydra would read 1 or true as a number or a boolean
            AB_OVERRIDES+=("++ray_kwargs.ray_init.runtime_env.env_vars.$name='${!name}'")
        fi
    done
}

# ab_check_endpoints NAME...: on a multi-node run, refuse endpoint URLs that name the launching machine's loopback
# (an agent-loop worker on another node would call itself and every episode would end infra_error).
ab_check_endpoints() {
    local name value
    for name in "$@"; do
        value=${!name:-}
        if [[ $value =~ ^[a-z]+://(127\.[0-9.]+|localhost|\[::1\]|0\.0\.0\.0)([:/]|$) ]]; then
            ab_die "$name=$value: with NNODES=$NNODES / ROLLOUT_NODES=$ROLLOUT_NODES the agent-loop workers run on" \
                "other nodes too and cannot reach this machine's loopback; serve it on an address every node reaches"
        fi
    done
}

# ab_run_verl [ARGS...]: the verl-native route (verl 0.9.1, no rLLM, nothing patched): verl's own
# main_ppo with agentboost's strands_agent agent loop, wired by the overrides the module docstring of
# agentboost/integration/verl_agent_loop.py lists. Needs STRANDS_ENV_CLASS ("module:Class") from the
# example's defaults; AB_STRANDS_OPTIONS may hold more +strands.* overrides.
ab_run_verl() {
    AB_ROUTE=verl
    : "${EXPERIMENT_NAME:=$AB_EXAMPLE-strands-verl}"
    : "${DATA_DIR:=data/strands_$AB_EXAMPLE/verl}"
    : "${AGENT_LOOP_CONFIG:=}"
    : "${AGENT_WORKERS:=8}"
    : "${ROLLOUT:=vllm}"
    : "${LORA_RANK:=0}"
    : "${LORA_ALPHA:=32}"
    : "${LORA_TARGET_MODULES:=all-linear}"
    : "${CHECKPOINT_DIR:=}"
    : "${RESUME:=auto}"
    : "${FORWARD_ENV:=}"
    : "${ASYNC:=0}"
    : "${ASYNC_WARMUP_BATCHES:=1}"
    : "${ROLLOUT_NODES:=1}"
    : "${ROLLOUT_GPUS:=0}"
    [[ $DATA_DIR == /* ]] || DATA_DIR="$PWD/$DATA_DIR" # Ray actors need not run in this directory
    [[ -z $AGENT_LOOP_CONFIG || $AGENT_LOOP_CONFIG == /* ]] || AGENT_LOOP_CONFIG="$PWD/$AGENT_LOOP_CONFIG"
    [[ -z $CHECKPOINT_DIR || $CHECKPOINT_DIR == /* ]] || CHECKPOINT_DIR="$PWD/$CHECKPOINT_DIR"
    if [[ $DRY_RUN != 1 ]] && ! ab_hydra_info "$@"; then
        local f
        for f in "$DATA_DIR/train.parquet" "$DATA_DIR/test.parquet"; do
            [[ -f $f ]] || ab_die "$f is missing: run" \
                "python examples/$AB_EXAMPLE/prepare_${AB_EXAMPLE}_data.py --verl-out first (or set DATA_DIR)"
        done
        [[ -z $AGENT_LOOP_CONFIG || -f $AGENT_LOOP_CONFIG ]] || ab_die "agent-loop config $AGENT_LOOP_CONFIG is missing"
    fi
    case $ROLLOUT in
        vllm | sglang) AB_ROLLOUT=$ROLLOUT ;;
        *) ab_die "ROLLOUT=$ROLLOUT: use vllm or sglang" ;;
    esac
    [[ $LORA_RANK =~ ^[0-9]+$ ]] || ab_die "LORA_RANK=$LORA_RANK: use 0 (off) or a positive rank"
    if ((NNODES > 1 || ROLLOUT_NODES > 1)); then
        ab_check_endpoints AGENTBOOST_RETRIEVAL_URL AGENTBOOST_TAU2_USER_URL
    fi
    local mode
    AB_HYBRID_ENGINE=true
    case $ASYNC in
        0 | sync | "") mode=sync ;;
        1 | colocate | colocate_async) mode=colocate_async ;;
        separate | separate_async)
            mode=separate_async
            AB_HYBRID_ENGINE=false
            ((ROLLOUT_GPUS > 0)) || ab_die "ASYNC=separate needs ROLLOUT_GPUS (GPUs per node that only serve rollouts)"
            ((TRAIN_BATCH_SIZE % MINI_BATCH_SIZE == 0)) ||
                ab_die "ASYNC=separate: TRAIN_BATCH_SIZE ($TRAIN_BATCH_SIZE) must be a multiple of" \
                    "MINI_BATCH_SIZE ($MINI_BATCH_SIZE)"
            ;;
        *) ab_die "ASYNC=$ASYNC: use 0 (sync), 1 (colocate_async) or separate (separate_async)" ;;
    esac
    AB_ENV=("WANDB_MODE=$WANDB_MODE" "${AB_EXTRA_ENV[@]}")
    AB_PROGRAM=("$PYTHON" -m verl.trainer.main_ppo)
    ab_shared_overrides agentboost_grpo
    AB_OVERRIDES+=(
        algorithm.use_kl_in_reward=false
        "data.train_files=$(ab_hydra "$DATA_DIR/train.parquet")"
        "data.val_files=$(ab_hydra "$DATA_DIR/test.parquet")"
        actor_rollout_ref.model.external_lib=agentboost.integration.verl_plugin
        actor_rollout_ref.rollout.calculate_log_probs=true
    )
    [[ -n $AGENT_LOOP_CONFIG ]] &&
        AB_OVERRIDES+=("actor_rollout_ref.rollout.agent.agent_loop_config_path=$(ab_hydra "$AGENT_LOOP_CONFIG")")
    AB_OVERRIDES+=(
        actor_rollout_ref.rollout.agent.default_agent_loop=strands_agent
        "actor_rollout_ref.rollout.agent.num_workers=$AGENT_WORKERS"
        "+strands.env_class=$STRANDS_ENV_CLASS"
        "+strands.max_turns=$MAX_TURNS"
        "+strands.wall_clock_s=$EPISODE_TIMEOUT_S"
        "+strands.budget.tool_timeout_s=$TOOL_TIMEOUT_S"
        "${AB_STRANDS_OPTIONS[@]}"
    )
    if ((LORA_RANK > 0)); then
        # verl's FSDP LoRA (peft); the rollout gets the adapters (vLLM/SGLang LoRA) after a first full sync
        AB_OVERRIDES+=(
            "actor_rollout_ref.model.lora_rank=$LORA_RANK"
            "actor_rollout_ref.model.lora_alpha=$LORA_ALPHA"
            "actor_rollout_ref.model.target_modules=$(ab_hydra "$LORA_TARGET_MODULES")"
            actor_rollout_ref.rollout.load_format=safetensors
            actor_rollout_ref.rollout.layered_summon=true
        )
    fi
    ab_trainer_overrides
    AB_OVERRIDES+=(trainer.use_v1=true "trainer.v1.trainer_mode=$mode")
    # Strands metrics (strands/*) at every training step: agentboost's replay buffer reports them
    AB_OVERRIDES+=(
        trainer.v1.sampler.custom_sampler.path=pkg://agentboost.integration.verl_sampler
        trainer.v1.sampler.custom_sampler.name=StrandsReplayBuffer
    )
    [[ -n $CHECKPOINT_DIR ]] && AB_OVERRIDES+=("trainer.default_local_dir=$(ab_hydra "$CHECKPOINT_DIR")")
    case $RESUME in
        auto | disable) AB_OVERRIDES+=("trainer.resume_mode=$RESUME") ;;
        *)
            [[ $RESUME == /* ]] || RESUME="$PWD/$RESUME"
            [[ $(basename "$RESUME") == global_step_* ]] || ab_die "RESUME=$RESUME: use auto, disable or a global_step_N directory"
            AB_OVERRIDES+=(trainer.resume_mode=resume_path "trainer.resume_from_path=$(ab_hydra "$RESUME")")
            ;;
    esac
    case $mode in
        colocate_async) AB_OVERRIDES+=("trainer.v1.colocate_async.num_warmup_batches=$ASYNC_WARMUP_BATCHES") ;;
        separate_async)
            AB_OVERRIDES+=(
                "trainer.v1.separate_async.num_warmup_batches=$ASYNC_WARMUP_BATCHES"
                "trainer.v1.separate_async.parameter_sync_step=$((TRAIN_BATCH_SIZE / MINI_BATCH_SIZE))"
                "actor_rollout_ref.rollout.nnodes=$ROLLOUT_NODES"
                "actor_rollout_ref.rollout.n_gpus_per_node=$ROLLOUT_GPUS"
                actor_rollout_ref.rollout.checkpoint_engine.backend=nccl
            )
            ;;
    esac
    local -a more=()
    read -r -a more <<<"$FORWARD_ENV"
    ab_forward_env WANDB_MODE "${AB_FORWARD_ENV[@]}" "${more[@]}"
    ab_exec "${AB_OVERRIDES[@]}" "$@"
}
