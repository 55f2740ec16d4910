"""The adapters on rLLM v0.3.0-pre + veRL 0.7.1 against fakes of those interfaces (tests/fake_stack.py).

veRL 0.7.1's rollout server is used as upstream ships it (it honours ``max_tokens``); rLLM's engine and
trainer carry the same adapters as on v0.2.1.post1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from agentboost.backends.base import GenerationRequest
from agentboost.backends.verl_server import VerlServerBackend
from agentboost.environments.arithmetic import make_tasks
from agentboost.errors import BackendContextOverflow, BackendError
from agentboost.integration.verl_batch import MASKED_KEY
from agentboost.testing.fake_vllm import fake_logprob
from agentboost.types import SamplingParams, Termination
from modified_rllm_files import agent_execution_engine as engine_adapter
from modified_rllm_files import agent_ppo_trainer as trainer_adapter
from tests import fake_stack
from tests.fake_stack import FakeActorHandle, FakeServer071, load_rows, make_engine

RELEASE = "0.3.0rc0"


def backend_over(server: Any) -> VerlServerBackend:
    return VerlServerBackend([FakeActorHandle(server)])


async def collect(engine: Any, **meta: Any) -> list[dict]:
    return [item async for item in engine.trajectory_generator(mode="Token", meta_info=meta)]


# -- veRL 0.7.1's server, unpatched, through agentboost's backend ---------------------------------------
async def test_verl071_server_honours_max_tokens_and_the_finish_is_derived(qwen25_tokenizer, qwen25_template) -> None:
    server = FakeServer071(qwen25_tokenizer, prompt_length=300, response_length=100)
    backend = backend_over(server)
    eot = qwen25_template.info.eot_token_id
    prompt = qwen25_template.encode("What is 4 * 5?")
    server.engine.ramble = 30
    result = await backend.generate(GenerationRequest(prompt, SamplingParams(temperature=0.5, seed=3), 7, "ep-1",
                                                      stop_token_ids=(eot,)))  # fmt: skip
    sent = server.engine.requests[-1][1]
    assert (sent.max_tokens, sent.temperature, sent.seed, sent.stop_token_ids) == (7, 0.5, 3, [eot])
    assert len(result.token_ids) == 7 and result.finish_reason == "length"  # verl said "completed"
    assert result.logprobs == [fake_logprob(i, t) for i, t in enumerate(result.token_ids)]
    assert result.weight_version is None and result.stop_reason is None  # no step pushed yet

    server.engine.ramble = 0
    await server.set_global_steps(3)  # what the trainer's weight sync tells the server
    result = await backend.generate(GenerationRequest(prompt, SamplingParams(), 50, "ep-2", stop_token_ids=(eot,)))
    assert result.finish_reason == "stop" and result.token_ids[-1] == eot and len(result.token_ids) < 50
    assert result.weight_version == 3


async def test_verl071_abort_is_an_infra_error_not_a_finished_turn(qwen25_tokenizer, qwen25_template) -> None:
    """verl 0.7.1 reports vLLM's abort only as stop_reason="aborted": read as a short "stop" it would end the
    turn as if the model had answered."""
    server = FakeServer071(qwen25_tokenizer)
    server.engine.abort = True
    request = GenerationRequest(qwen25_template.encode("What is 4 * 5?"), SamplingParams(), 50, "ep-1")
    with pytest.raises(BackendError, match="'aborted'"):
        await backend_over(server).generate(request)

    engine, servers = make_engine(qwen25_tokenizer, release=RELEASE)
    for s in servers:
        s.engine.abort = True
    load_rows(engine, make_tasks(1, seed=4, max_ops=1, max_value=9), n=2)
    items = await collect(engine)
    assert [i["episode"].termination for i in items] == [Termination.INFRA_ERROR] * 2
    assert all(i["episode"].masked and i["response_masks"].sum() == 0 for i in items)


async def test_verl071_prompt_without_room_is_a_context_overflow(qwen25_tokenizer) -> None:
    server = FakeServer071(qwen25_tokenizer, prompt_length=300, response_length=100)  # max_model_len 400
    backend = backend_over(server)
    with pytest.raises(BackendContextOverflow, match="maximum context length"):
        await backend.generate(GenerationRequest(list(range(401)), SamplingParams(), 5, "a"))
    # exactly full: verl clamps max_tokens to 0 and vLLM refuses it; no room is an overflow, not a server fault
    with pytest.raises(BackendContextOverflow, match="max_tokens must be at least 1"):
        await backend.generate(GenerationRequest(list(range(400)), SamplingParams(), 5, "b"))


# -- rLLM v0.3.0-pre's execution engine, adapted ------------------------------------------------------------
async def test_engine_runs_strands_episodes_token_exactly(qwen25_tokenizer) -> None:
    engine, servers = make_engine(qwen25_tokenizer, release=RELEASE)
    load_rows(engine, make_tasks(2, seed=1, max_ops=1, max_value=9), n=4)
    items = await collect(engine)
    # rLLM v0.3.0-pre's VerlEngine.wake_up/sleep are no-ops: the replicas are left as the trainer's weight sync
    # left them (a replica's own wake_up raises in hybrid mode)
    assert engine.rollout_engine.phases == ["wake_up", "sleep"] and all(s.slept == 0 for s in servers)
    assert [item["idx"] for item in items] == list(range(8))
    for item in items:
        episode = item["episode"]
        assert episode.termination is Termination.COMPLETED and item["trajectory_reward"] == 1.0
        episode.check_invariants()
        assert item["prompt_tokens"].tolist() == episode.prompt_ids
        assert item["response_tokens"].tolist() == episode.response_ids
        mask = item["response_masks"].tolist()
        assert mask == episode.response_mask and 0 < sum(mask) < len(mask)
        assert item["rollout_log_probs"].tolist() == pytest.approx(episode.response_logprobs)
        assert len({c.server for c in episode.calls}) == 1  # sticky: every call on one server
        assert {c.weight_version for c in episode.calls} == {1}  # the step the weights were pushed for
        assert {c.finish_reason for c in episode.calls} == {"stop"}
    sent = [params for s in servers for (_, params, _) in s.engine.requests]
    assert {(p.temperature, p.top_p) for p in sent} == {(0.7, 0.95)}
    assert all(p.max_tokens <= 256 and p.logprobs == 0 for p in sent)

    for s in servers:
        s.engine.requests.clear()
    load_rows(engine, make_tasks(2, seed=1, max_ops=1, max_value=9), n=2)
    items = await collect(engine, validate=True)
    sent = [params for s in servers for (_, params, _) in s.engine.requests]
    assert len(sent) == 2 * len(items) and {(p.temperature, p.top_k) for p in sent} == {(0.0, 5)}


async def test_engine_keeps_overlong_and_broken_episodes_as_rows(qwen25_tokenizer) -> None:
    config = fake_stack.training_config(**{"data.max_response_length": 24})
    engine, servers = make_engine(qwen25_tokenizer, config=config, release=RELEASE)
    for s in servers:
        s.engine.ramble = 60
    rows = make_tasks(2, seed=2, max_ops=1, max_value=9)
    rows[1] = {**rows[1], "tools": ["no.such.module:tool"]}
    load_rows(engine, rows, n=2)
    items = await collect(engine)
    assert len(items) == 4
    over, broken = items[0]["episode"], items[2]["episode"]
    assert over.termination is Termination.MAX_TOKENS and len(over.response_ids) <= 24
    assert over.calls[-1].finish_reason == "length"  # derived from the tokens (verl said "completed")
    assert broken.termination is Termination.INFRA_ERROR and items[2]["response_masks"].sum() == 0


# -- rLLM v0.3.0-pre's PPO trainer, adapted ------------------------------------------------------------------
def test_trainer_batch_unions_with_the_verl071_data_batch(qwen25_tokenizer, tmp_path) -> None:
    config = fake_stack.training_config(**{"trainer.default_local_dir": str(tmp_path)})
    engine, _ = make_engine(qwen25_tokenizer, config=config, release=RELEASE)
    ns = fake_stack.trainer_namespace(RELEASE)
    assert trainer_adapter.install(ns) is True and trainer_adapter.install(ns) is False
    trainer = ns["AgentPPOTrainer"](config, qwen25_tokenizer, agent_class=engine.agent_class,
                                    env_class=engine.env_class, engine=engine, world_size=4)  # fmt: skip
    rows = make_tasks(2, seed=5, max_ops=1, max_value=9)
    rows[1] = {**rows[1], "tools": ["no.such.module:tool"]}
    load_rows(engine, rows, n=3)
    # what v0.3.0-pre's fit_agent holds before the union: veRL 0.7.1's dataset rows, repeated, nothing popped
    data = fake_stack.FakeDataProto(
        {"dummy_tensor": torch.zeros(6, 1, dtype=torch.uint8)},
        {"uid": np.array(["p0"] * 3 + ["p1"] * 3, dtype=object), "raw_prompt": np.array([None] * 6, dtype=object)},
    )
    generated, metrics = trainer.generate_agent_trajectory(timing_raw={}, meta_info={})
    batch = data.union(generated)
    assert batch.batch["input_ids"].shape == (6, 768) and batch.non_tensor_batch["uid"].tolist()[0] == "p0"
    assert batch.non_tensor_batch[MASKED_KEY].tolist() == [False] * 3 + [True] * 3
    out = ns["compute_advantage"](batch, adv_estimator="grpo")
    assert out.batch["advantages"][3:].abs().sum() == 0  # the failed group: masked, no baseline, no signal
    assert metrics["strands/termination/infra_error"] == 0.5
    padded = trainer._pad_dataproto_to_world_size(out)
    assert len(padded) == 8 and padded.batch["response_mask"][6:].sum() == 0


def test_install_names_both_releases() -> None:
    with pytest.raises(RuntimeError, match="v0.3.0-pre"):
        engine_adapter.install({"SomethingElse": object})
    with pytest.raises(RuntimeError, match="v0.3.0-pre"):
        trainer_adapter.install({"SomethingElse": object})
