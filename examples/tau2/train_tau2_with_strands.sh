#!/usr/bin/env bash
# GRPO on tau2-bench airline/retail with a Strands agent (shared per-episode DB, official reward). 8 GPUs.
# User side: solo by default. Simulated user (tau2's protocol): an OpenAI-compatible endpoint, e.g.
#   AGENTBOOST_TAU2_USER_URL=http://user-host:8001/v1 AGENTBOOST_TAU2_USER_MODEL=Qwen/Qwen3-32B bash $0
# (or prepare the data with --user-url/--user-model). Key: $OPENAI_API_KEY if the endpoint needs one.
# Prerequisites: README "Training on GPUs" (stack installed, `python apply_patches.py`, data prepared).
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-4B-Instruct-2507}
GPUS=${GPUS:-8}
export WANDB_MODE=${WANDB_MODE:-offline}   # set WANDB_MODE=online (and WANDB_API_KEY) to sync
export VLLM_USE_V1=1
python3 "$(dirname "$0")/train_tau2_with_strands.py" \
    algorithm.adv_estimator=grpo \
    algorithm.norm_adv_by_std_in_grpo=true \
    data.train_batch_size=32 \
    data.val_batch_size=64 \
    data.max_prompt_length=6144 \
    data.max_response_length=10240 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.hybrid_engine=true \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.actor.kl_loss_coef=0.0 \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=false \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.val_kwargs.n=4 \
    actor_rollout_ref.rollout.val_kwargs.temperature=0.6 \
    actor_rollout_ref.rollout.val_kwargs.top_p=0.95 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=true \
    rllm.agent.max_steps=30 \
    rllm.agent.trajectory_timeout=1200 \
    rllm.stepwise_advantage.enable=false \
    +rllm.strands.budget.tool_timeout_s=10 \
    +rllm.strands.logprob_gap_alarm=1.0 \
    trainer.logger=[console,wandb] \
    trainer.project_name=agentboost \
    trainer.experiment_name=tau2-strands \
    trainer.n_gpus_per_node="$GPUS" \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=20 \
    "$@"
