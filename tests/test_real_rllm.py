"""The adapters inside the real rLLM v0.2.1.post1 (patched with apply_patches.py), rollout servers faked.

Skipped unless rLLM is installed and patched (it is not on PyPI; see README "Training on GPUs"). What
runs here is rLLM's own code: its ``AsyncAgentExecutionEngine`` constructor (building its real
``VerlEngine`` and veRL's ``AsyncLLMServerManager``), ``update_envs_and_agents``, the adapted
``trajectory_generator``, and the upstream trainer's ``_transform_agent_trajectories`` and veRL's
``DataProto`` consuming our rows.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from agentboost import StrandsAgent
from agentboost.compat import rllm as compat
from agentboost.environments.arithmetic import ArithmeticEnv, make_tasks
from agentboost.types import Termination
from tests import fake_stack

pytestmark = [
    pytest.mark.rllm,
    pytest.mark.skipif(not compat.RLLM_AVAILABLE, reason="rLLM v0.2.1 is not installed (it is not on PyPI)"),
]


def patched_modules():
    import rllm.engine.agent_execution_engine as engine_module

    if not hasattr(engine_module, "UpstreamAsyncAgentExecutionEngine"):
        pytest.skip("rLLM is installed but not patched (run `python apply_patches.py`)")
    import rllm.trainer.verl.agent_ppo_trainer as trainer_module

    return engine_module, trainer_module


def config(tmp_path):
    from omegaconf import OmegaConf

    return OmegaConf.create(fake_stack.training_config(**{
        "trainer.default_local_dir": str(tmp_path),
        "actor_rollout_ref.rollout.name": "vllm",
        "rllm.filter_token_mismatch": False,
        "rllm.disable_thinking": False,
    }))  # fmt: skip


def test_real_engine_runs_strands_and_real_trainer_code_consumes_it(qwen25_tokenizer, tmp_path) -> None:
    engine_module, trainer_module = patched_modules()
    servers = [fake_stack.adapted_server(qwen25_tokenizer) for _ in range(2)]
    handles = [fake_stack.FakeActorHandle(s) for s in servers]
    manager = SimpleNamespace(server_handles=handles, rollout_replicas=[fake_stack.FakeReplica(h) for h in handles])
    cfg = config(tmp_path)
    engine = engine_module.AsyncAgentExecutionEngine(
        rollout_engine=manager, config=cfg, engine_name="verl", tokenizer=qwen25_tokenizer,
        max_steps=4, max_response_length=256, max_prompt_length=512,
        agent_class=StrandsAgent, env_class=ArithmeticEnv, n_parallel_agents=8,
    )  # fmt: skip
    assert type(engine.rollout_engine).__name__ == "VerlEngine"  # rLLM's own
    rows = make_tasks(2, seed=11, max_ops=1, max_value=9)
    repeated = [r for r in rows for _ in range(3)]
    engine.update_envs_and_agents([ArithmeticEnv.from_dict(dict(r)) for r in repeated],
                                  [StrandsAgent() for _ in repeated])  # fmt: skip

    async def collect():
        return [t async for t in engine.trajectory_generator(mode="Token", meta_info={})]

    items = asyncio.run(collect())
    assert all(s.woken == 1 and s.slept == 1 for s in servers)  # through rLLM's VerlEngine.wake_up/sleep
    assert [i["episode"].termination for i in items] == [Termination.COMPLETED] * 6
    assert [i["trajectory_reward"] for i in items] == [1.0] * 6

    upstream = trainer_module.UpstreamAgentPPOTrainer
    fake_self = SimpleNamespace(config=cfg, tokenizer=qwen25_tokenizer, global_steps=0,
                                visualize_trajectory=lambda *a, **k: None)  # fmt: skip
    batch, metrics = upstream._transform_agent_trajectories(fake_self, items)  # rLLM's own conversion
    from agentboost.integration.verl_batch import episodes_to_verl

    ours, _ = episodes_to_verl([i["episode"] for i in items], pad_token_id=qwen25_tokenizer.pad_token_id,
                               max_prompt_length=512, max_response_length=256)  # fmt: skip
    for key in ("input_ids", "attention_mask", "position_ids", "responses", "prompts", "response_mask",
                "token_level_scores"):  # fmt: skip
        assert (batch.batch[key] == ours[key]).all(), key  # the same tensors as rLLM would build
    assert metrics["traj/steps_mean"] == 2.0
