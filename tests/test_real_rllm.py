"""The adapters inside the real rLLM (patched with apply_patches.py), rollout servers faked.

Covers both supported releases, whichever is installed: rLLM v0.2.1.post1 (with veRL 0.6.1; servers: the
adapted 0.6.1 fake) and rLLM v0.3.0-pre (with veRL 0.7.1; servers: the unpatched 0.7.1 fake, weights pushed
by a fake of veRL's checkpoint manager). Skipped unless rLLM is installed and patched (it is not on PyPI;
see docs/gpu-rllm.md). What runs here is rLLM's own code: its ``AsyncAgentExecutionEngine``
constructor (building its real ``VerlEngine`` and veRL's ``AsyncLLMServerManager``),
``update_envs_and_agents``, the adapted ``trajectory_generator``, rLLM's own ``Trajectory``/``Step`` types
behind ``StrandsAgent.trajectory``, and the upstream trainer's ``_transform_agent_trajectories`` and veRL's
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
    pytest.mark.skipif(
        not compat.RLLM_AVAILABLE, reason="rLLM v0.2.1.post1 / v0.3.0-pre is not installed (it is not on PyPI)"
    ),
]


def patched_modules():
    if compat.RLLM_VERSION not in fake_stack.RELEASES:
        pytest.skip(f"rLLM {compat.RLLM_VERSION} is installed; these checks cover {fake_stack.RELEASES}")
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


def rollout_manager(tokenizer):
    """The servers and the manager rLLM's ``VerlEngine`` is built on, for the installed release."""
    if compat.RLLM_VERSION == "0.2.1":
        servers = [fake_stack.adapted_server(tokenizer) for _ in range(2)]
        handles = [fake_stack.FakeActorHandle(s) for s in servers]
        manager = SimpleNamespace(server_handles=handles, rollout_replicas=[fake_stack.FakeReplica(h) for h in handles])
        return servers, manager
    servers = [fake_stack.FakeServer071(tokenizer) for _ in range(2)]
    handles = [fake_stack.FakeActorHandle(s) for s in servers]
    fake_stack.FakeCheckpointManager071(handles).update_weights(1)  # what fit_agent does before rolling out
    return servers, fake_stack.agent_loop_manager_071(handles)


def test_real_engine_runs_strands_and_real_trainer_code_consumes_it(qwen25_tokenizer, tmp_path) -> None:
    engine_module, trainer_module = patched_modules()
    servers, manager = rollout_manager(qwen25_tokenizer)
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
    if compat.RLLM_VERSION == "0.2.1":  # through rLLM's VerlEngine.wake_up/sleep (weights synced per phase)
        assert all(s.woken == 1 and s.slept == 1 for s in servers)
    else:  # v0.3.0-pre: VerlEngine's wake_up/sleep are no-ops; the weights are the ones pushed for step 1
        assert all(s.slept == 0 for s in servers)
    assert [i["episode"].termination for i in items] == [Termination.COMPLETED] * 6
    assert [i["trajectory_reward"] for i in items] == [1.0] * 6
    # the weight version that served every call: 0.6.1 adapted counts wake-ups, 0.7.1 reports the pushed step
    assert {c.weight_version for i in items for c in i["episode"].calls} == {1}
    from rllm.agents.agent import Trajectory

    for agent, item in zip(engine.agents, items, strict=True):  # rLLM's own types behind StrandsAgent.trajectory
        trajectory = agent.trajectory
        assert isinstance(trajectory, Trajectory) and len(trajectory.steps) == len(item["episode"].calls)
        assert [s.info["finish_reason"] for s in trajectory.steps] == ["stop"] * len(trajectory.steps)
        assert trajectory.steps[-1].reward == 1.0 and trajectory.info["termination"] == "completed"

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


def test_real_trainer_builds_the_batch_rllm_trains_on(qwen25_tokenizer, tmp_path, monkeypatch) -> None:
    """rLLM's own (adapted) ``AgentPPOTrainer``: its constructor, our ``generate_agent_trajectory`` into veRL's
    ``DataProto``, the union ``fit_agent`` makes with the data batch, veRL's ``compute_advantage`` through the
    wrapper and rLLM's ``_pad_dataproto_to_world_size``. Only ``RayPPOTrainer.__init__`` (Ray workers, GPUs) is
    replaced, and the engine is handed over as rLLM's ``init_workers`` would."""
    engine_module, trainer_module = patched_modules()
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from agentboost.integration.verl_batch import MASKED_KEY

    def bare_init(self, config, tokenizer, **kwargs):
        self.config, self.tokenizer = config, tokenizer

    monkeypatch.setattr(RayPPOTrainer, "__init__", bare_init)
    cfg = config(tmp_path)
    OmegaConf.update(cfg, "actor_rollout_ref.hybrid_engine", True, force_add=True)
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.mode", "async", force_add=True)
    OmegaConf.update(cfg, "algorithm.adv_estimator", "grpo", force_add=True)
    trainer = trainer_module.AgentPPOTrainer(
        config=cfg, tokenizer=qwen25_tokenizer, role_worker_mapping={}, resource_pool_manager=None,
        agent_class=StrandsAgent, env_class=ArithmeticEnv,
    )  # fmt: skip
    assert isinstance(trainer, trainer_module.UpstreamAgentPPOTrainer)
    _, manager = rollout_manager(qwen25_tokenizer)
    trainer.agent_execution_engine = engine_module.AsyncAgentExecutionEngine(
        rollout_engine=manager, config=cfg, engine_name="verl", tokenizer=qwen25_tokenizer,
        max_steps=4, max_response_length=256, max_prompt_length=512,
        agent_class=StrandsAgent, env_class=ArithmeticEnv, n_parallel_agents=8,
    )  # fmt: skip
    trainer.global_steps = 1
    rows = make_tasks(2, seed=12, max_ops=1, max_value=9)
    rows[1] = {**rows[1], "tools": ["no.such.module:tool"]}  # a broken row: infra_error, masked
    repeated = [r for r in rows for _ in range(3)]
    trainer.agent_execution_engine.update_envs_and_agents(
        [ArithmeticEnv.from_dict(dict(r)) for r in repeated], [StrandsAgent() for _ in repeated]
    )
    generated, metrics = trainer.generate_agent_trajectory(timing_raw={}, meta_info={})
    assert isinstance(generated, DataProto) and metrics["strands/termination/infra_error"] == 0.5
    # v0.3.0-pre's fit_agent unions without popping: veRL 0.7.1's dataset rows carry only `dummy_tensor`
    data = DataProto.from_dict(tensors={"dummy_tensor": torch.zeros(6, 1, dtype=torch.uint8)},
                               non_tensors={"uid": np.array(["a"] * 3 + ["b"] * 3, dtype=object)})  # fmt: skip
    batch = data.union(generated)
    assert batch.non_tensor_batch[MASKED_KEY].tolist() == [False] * 3 + [True] * 3
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch = trainer_module.compute_advantage(batch, adv_estimator="grpo", num_repeat=3, norm_adv_by_std_in_grpo=True)
    assert batch.batch["advantages"].abs().sum() == 0  # group a all solved, group b all masked: no signal
    trainer.use_critic = trainer.use_reference_policy = trainer.use_rm = False
    trainer.hybrid_engine, trainer.actor_rollout_wg = True, SimpleNamespace(world_size=4)
    padded = trainer._pad_dataproto_to_world_size(batch)  # rLLM's own padding, adapted
    assert len(padded) == 8 and padded.batch["response_mask"][6:].sum() == 0
    assert padded.batch["response_mask"][:3].sum() > 0


def test_apply_patches_check_reports_the_real_release_patched_over_its_known_files() -> None:
    """``apply_patches.py --check`` on the real installed release: every target ``patched`` over the upstream file
    of that release (not forced over an unknown one), exit 0, no traceback."""
    patched_modules()
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "apply_patches.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=300,
                          cwd=Path(script).parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stderr.splitlines() if line.startswith(("rllm.", "verl."))]
    states = {row[0]: row[1] for row in rows if not row[0].endswith(":")}
    assert states and set(states.values()) == {"patched"}, done.stderr
    assert "Traceback" not in done.stderr and "(--force)" not in done.stderr
