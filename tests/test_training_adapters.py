"""The rLLM / veRL adapters against faithful fakes of their v0.2.1.post1 / 0.6.1 interfaces (tests/fake_stack.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentboost import StrandsAgent
from agentboost.backends.base import GenerationRequest
from agentboost.backends.verl_server import VerlServerBackend
from agentboost.environments.arithmetic import ArithmeticEnv, make_tasks
from agentboost.errors import BackendContextOverflow, BackendError
from agentboost.integration.config import options_from_config
from agentboost.testing.fake_vllm import fake_logprob
from agentboost.types import SamplingParams, Termination
from modified_rllm_files import agent_execution_engine as engine_adapter
from modified_verl_files import vllm_async_server as server_adapter
from tests import fake_stack
from tests.fake_stack import adapted_server, load_rows, make_engine


# -- veRL server adapter -------------------------------------------------------------------------
async def test_upstream_server_cannot_take_max_tokens(qwen25_tokenizer) -> None:
    server = fake_stack.actor_server(fake_stack.server_namespace(), qwen25_tokenizer, 1024)
    with pytest.raises(TypeError, match="max_tokens"):
        await server.generate(prompt_ids=[1, 2, 3], sampling_params={"max_tokens": 5}, request_id="r")


async def test_server_adapter_honours_max_tokens_and_reports_finish(qwen25_tokenizer, qwen25_template) -> None:
    server = adapted_server(qwen25_tokenizer, max_model_len=600)
    prompt = qwen25_template.encode("What is 2 + 3? " * 10)
    server.engine.ramble = 40
    out = await server.generate(prompt, {"max_tokens": 10, "logprobs": True, "temperature": 1.0}, "r1")
    assert len(out.token_ids) == 10 and out.finish_reason == "length"
    assert out.log_probs == [fake_logprob(i, t) for i, t in enumerate(out.token_ids)]
    assert server.engine.requests[-1][1].max_tokens == 10

    server.engine.ramble = 0
    out = await server.generate(prompt, {"logprobs": False}, "r2")  # veRL's own agent loops: upstream semantics
    assert server.engine.requests[-1][1].max_tokens == 600 - len(prompt)
    assert out.finish_reason == "stop" and out.log_probs is None
    assert out.token_ids[-1] == qwen25_template.info.eot_token_id

    await server.generate(prompt, {"max_tokens": 10_000}, "r3")
    assert server.engine.requests[-1][1].max_tokens == 600 - len(prompt)  # capped by the room left

    with pytest.raises(ValueError, match="max_model_len=600"):
        await server.generate(list(range(600)), {"max_tokens": 5}, "r4")


async def test_server_adapter_reaches_the_ray_actor_class(qwen25_tokenizer, qwen25_template) -> None:
    # veRL's vLLMReplica starts vLLMHttpServer, which @ray.remote built before the adapter's block ran: Ray's copies
    # of upstream's methods on it shadowed the adapted base class, so real servers ran upstream code.
    ns = fake_stack.server_namespace()
    modified = ns["vLLMHttpServer"].__ray_metadata__.modified_class
    prompt = qwen25_template.encode("What is 2 + 3?")
    assert server_adapter.install(ns) is True
    base = ns["vLLMHttpServerBase"]
    assert modified.generate is base.generate and modified.wake_up is base.wake_up
    server = ns["vLLMHttpServer"].remote(qwen25_tokenizer, 600).server
    out = await server.generate(prompt, {"max_tokens": 3}, "r1")
    assert (len(out.token_ids), out.finish_reason, out.weight_version) == (3, "length", 0)
    await server.wake_up()
    assert server.woken == 1 and (await server.generate(prompt, {"max_tokens": 3}, "r2")).weight_version == 1


def test_server_adapter_refuses_an_actor_class_it_cannot_reach() -> None:
    ns = fake_stack.server_namespace()
    base, upstream = ns["vLLMHttpServerBase"], ns["vLLMHttpServerBase"].generate
    ns["vLLMHttpServer"] = type("vLLMHttpServer", (base,), {})  # not a Ray actor class
    with pytest.raises(RuntimeError, match="not a Ray actor class"):
        server_adapter.install(ns)

    class Overriding(base):  # a server class whose generate is not upstream's
        async def generate(self, prompt_ids, sampling_params, request_id, image_data=None):
            return None

    ns["vLLMHttpServer"] = fake_stack.ray_remote(num_cpus=1)(Overriding)
    with pytest.raises(RuntimeError, match="is not verl 0.6.1's"):
        server_adapter.install(ns)
    assert base.generate is upstream and not getattr(base, server_adapter.MARK, False)  # nothing changed


def test_server_adapter_reaches_a_real_ray_actor_class() -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed (it comes with veRL)")
    from ray import cloudpickle

    ns = fake_stack.server_namespace()
    actor = ray.remote(num_cpus=1)(ns["vLLMHttpServer"].__ray_metadata__.modified_class.__ray_actor_class__)
    ns["vLLMHttpServer"] = actor  # as `@ray.remote(num_cpus=1) class vLLMHttpServer(vLLMHttpServerBase)` builds it
    modified = actor.__ray_metadata__.modified_class
    assert modified.__dict__.get("generate") is not None  # Ray's copy of upstream's method
    assert server_adapter.install(ns) is True
    assert modified.generate is ns["vLLMHttpServerBase"].generate
    assert cloudpickle.loads(cloudpickle.dumps(modified)).generate is ns["vLLMHttpServerBase"].generate


async def test_server_adapter_counts_weight_versions(qwen25_tokenizer, qwen25_template) -> None:
    server = adapted_server(qwen25_tokenizer)
    prompt = qwen25_template.encode("What is 1 + 1?")
    assert (await server.generate(prompt, {}, "a")).weight_version == 0
    await server.wake_up()
    await server.wake_up()
    assert server.woken == 2  # upstream wake_up (weight sync) still runs
    assert (await server.generate(prompt, {}, "b")).weight_version == 2


async def test_backend_through_actor_handles(qwen25_tokenizer, qwen25_template) -> None:
    server = adapted_server(qwen25_tokenizer, max_model_len=400)
    backend = VerlServerBackend([fake_stack.FakeActorHandle(server)])
    prompt = qwen25_template.encode("What is 4 * 5?")
    request = GenerationRequest(prompt, SamplingParams(temperature=0.5, seed=3), 7, "ep-1",
                                stop_token_ids=(qwen25_template.info.eot_token_id,))  # fmt: skip
    server.engine.ramble = 30
    result = await backend.generate(request)
    assert len(result.token_ids) == 7 and result.finish_reason == "length"
    sent = server.engine.requests[-1][1]
    assert (sent.temperature, sent.seed, sent.max_tokens) == (0.5, 3, 7)
    assert sent.stop_token_ids == [qwen25_template.info.eot_token_id]
    assert result.weight_version == 0 and result.server == "replica-0"
    with pytest.raises(BackendContextOverflow):
        await backend.generate(GenerationRequest(list(range(400)), SamplingParams(), 5, "ep-2"))

    plain = fake_stack.actor_server(fake_stack.server_namespace(), qwen25_tokenizer, 400)
    with pytest.raises(BackendError, match="apply_patches"):
        await VerlServerBackend([fake_stack.FakeActorHandle(plain)]).generate(request)


async def test_aborted_generation_is_infra_error_not_a_finished_turn(qwen25_tokenizer, qwen25_template) -> None:
    server = adapted_server(qwen25_tokenizer, max_model_len=400)
    server.engine.abort = True  # 2 tokens, then vLLM aborts (shorter than max_tokens: looked like "stop")
    backend = VerlServerBackend([fake_stack.FakeActorHandle(server)])
    request = GenerationRequest(qwen25_template.encode("What is 4 * 5?"), SamplingParams(), 50, "ep-1")
    with pytest.raises(BackendError, match="finish_reason='abort'"):
        await backend.generate(request)

    engine, servers = make_engine(qwen25_tokenizer)
    for s in servers:
        s.engine.abort = True
    load_rows(engine, make_tasks(1, seed=4, max_ops=1, max_value=9), n=2)
    items = await collect(engine)
    assert [i["episode"].termination for i in items] == [Termination.INFRA_ERROR] * 2
    assert all(i["episode"].masked and i["response_masks"].sum() == 0 for i in items)


async def test_unreported_finish_reason_is_derived_from_the_tokens(qwen25_template) -> None:
    from agentboost.backends.verl_server import derive_finish_reason

    eot = qwen25_template.info.eot_token_id
    request = GenerationRequest([1, 2], SamplingParams(), 3, "r", stop_token_ids=(eot,))
    assert derive_finish_reason(None, [5, 6, 7], request, where="s") == "length"  # filled max_tokens
    assert derive_finish_reason(None, [5, 6, eot], request, where="s") == "stop"  # ...with a stop token
    assert derive_finish_reason(None, [5, eot], request, where="s") == "stop"
    with pytest.raises(BackendError):
        derive_finish_reason("abort", [5], request, where="s")


# -- config ----------------------------------------------------------------------------------------
def test_options_come_from_the_config_never_hard_coded() -> None:
    options = options_from_config(fake_stack.training_config())
    assert (options.train.sampling.temperature, options.train.sampling.top_p) == (0.7, 0.95)
    assert options.validate.sampling.temperature == 0.0  # val_kwargs.do_sample=False: greedy
    assert options.validate.sampling.top_k == 5
    assert (options.group_size, options.val_group_size) == (4, 2)
    budget = options.train.budget
    assert (budget.max_prompt_tokens, budget.max_response_tokens, budget.max_total_tokens) == (512, 256, 768)
    assert budget.max_turns == 4
    tuned = options_from_config(fake_stack.training_config(**{
        "rllm.strands": {"budget": {"tool_timeout_s": 5}, "mask_truncated": True, "logprob_gap_alarm": 0.4}
    }))  # fmt: skip
    assert tuned.train.budget.tool_timeout_s == 5 and tuned.train.mask_truncated and tuned.logprob_gap_alarm == 0.4
    with pytest.raises(ValueError, match="unknown rllm.strands.budget"):
        options_from_config(fake_stack.training_config(**{"rllm.strands": {"budget": {"max_turn": 3}}}))
    with pytest.raises(ValueError, match="unknown rllm.strands option"):
        options_from_config(fake_stack.training_config(**{"rllm.strands": {"temperature": 1.0}}))


# -- rLLM execution engine adapter ------------------------------------------------------------------
async def collect(engine: Any, **meta: Any) -> list[dict]:
    return [item async for item in engine.trajectory_generator(mode="Token", meta_info=meta)]


async def test_engine_runs_strands_episodes_token_exactly(qwen25_tokenizer, qwen25_template) -> None:
    engine, servers = make_engine(qwen25_tokenizer)
    rows = make_tasks(2, seed=1, max_ops=1, max_value=9)
    load_rows(engine, rows, n=4)
    items = await collect(engine)
    assert engine.rollout_engine.phases == ["wake_up", "sleep"]
    assert all(s.woken == 1 and s.slept == 1 for s in servers)
    assert [item["idx"] for item in items] == list(range(8))
    for item in items:
        episode = item["episode"]
        assert episode.termination is Termination.COMPLETED and item["trajectory_reward"] == 1.0
        episode.check_invariants()
        assert item["prompt_tokens"].tolist() == episode.prompt_ids
        assert item["response_tokens"].tolist() == episode.response_ids
        mask = item["response_masks"].tolist()
        assert mask == episode.response_mask and 0 < sum(mask) < len(mask)  # model tokens 1, tool tokens 0
        lps = item["rollout_log_probs"].tolist()
        assert lps == pytest.approx(episode.response_logprobs)
        assert all(lp != 0.0 for lp, m in zip(lps, mask, strict=True) if m)
        assert len({c.server for c in episode.calls}) == 1  # sticky: every call on one server
        assert {c.weight_version for c in episode.calls} == {1}  # served after this phase's weight sync
    sent = [params for s in servers for (_, params, _) in s.engine.requests]
    assert {(p.temperature, p.top_p) for p in sent} == {(0.7, 0.95)}
    assert all(p.max_tokens <= 256 for p in sent)

    for s in servers:
        s.engine.requests.clear()
    load_rows(engine, rows, n=2)
    items = await collect(engine, validate=True)
    sent = [params for s in servers for (_, params, _) in s.engine.requests]
    assert len(sent) == 2 * len(items)
    assert {(p.temperature, p.top_k) for p in sent} == {(0.0, 5)}
    assert all(item["episode"].metadata["group_id"].endswith(f"g{i // 2}") for i, item in enumerate(items))


async def test_engine_keeps_failed_episodes_as_masked_rows(qwen25_tokenizer) -> None:
    config = fake_stack.training_config(**{"data.max_response_length": 24})
    engine, servers = make_engine(qwen25_tokenizer, config=config)
    for s in servers:
        s.engine.ramble = 60
    rows = make_tasks(2, seed=2, max_ops=1, max_value=9)
    rows[1] = {**rows[1], "tools": ["no.such.module:tool"]}
    load_rows(engine, rows, n=2)
    items = await collect(engine)
    assert len(items) == 4  # nothing dropped
    over, broken = items[0]["episode"], items[2]["episode"]
    assert over.termination is Termination.MAX_TOKENS and len(over.response_ids) <= 24
    assert broken.termination is Termination.INFRA_ERROR and broken.masked
    assert items[2]["trajectory_reward"] == 0.0 and items[2]["response_masks"].sum() == 0
    assert items[2]["prompt_tokens"].numel() > 0 and items[2]["response_tokens"].numel() > 0  # rLLM asserts this
    assert engine.rollout_engine.phases == ["wake_up", "sleep"]


async def test_engine_puts_servers_to_sleep_when_the_phase_fails(qwen25_tokenizer, monkeypatch) -> None:
    engine, _ = make_engine(qwen25_tokenizer)
    load_rows(engine, make_tasks(1, seed=3), n=2)
    engine._backend = lambda: (_ for _ in ()).throw(RuntimeError("no servers"))
    with pytest.raises(RuntimeError, match="no servers"):
        await collect(engine)
    assert engine.rollout_engine.phases == []  # failed before waking: nothing to undo

    engine, _ = make_engine(qwen25_tokenizer)
    load_rows(engine, make_tasks(1, seed=3), n=2)
    from agentboost.integration import rollouts

    async def cancelled(*args: Any, **kwargs: Any) -> Any:
        raise asyncio.CancelledError

    monkeypatch.setattr(rollouts, "run_episode", cancelled)
    with pytest.raises(asyncio.CancelledError):
        await collect(engine)
    assert engine.rollout_engine.phases == ["wake_up", "sleep"]


async def test_engine_leaves_other_agents_to_rllm(qwen25_tokenizer) -> None:
    class OtherAgent:
        pass

    class OtherEnv:
        pass

    engine, _ = make_engine(qwen25_tokenizer, agent_class=OtherAgent, env_class=OtherEnv)
    assert await collect(engine) == [{"upstream": True}]
    assert await engine.execute_tasks([{}, {}]) == ["upstream", "upstream"]
    with pytest.raises(TypeError, match="go together"):
        make_engine(qwen25_tokenizer, agent_class=StrandsAgent, env_class=OtherEnv)
    servers = [adapted_server(qwen25_tokenizer)]
    ns = fake_stack.engine_namespace([fake_stack.FakeActorHandle(s) for s in servers])
    engine_adapter.install(ns)
    with pytest.raises(ValueError, match="'verl' engine"):
        ns["AsyncAgentExecutionEngine"](engine_name="openai", tokenizer=qwen25_tokenizer,
                                        config=fake_stack.training_config(),
                                        agent_class=StrandsAgent, env_class=ArithmeticEnv)  # fmt: skip


async def test_engine_refuses_stepwise_mode(qwen25_tokenizer) -> None:
    engine, _ = make_engine(qwen25_tokenizer)
    load_rows(engine, make_tasks(1), n=1)
    with pytest.raises(ValueError, match="stepwise_advantage"):
        [x async for x in engine.trajectory_generator(mode="Step")]


def test_install_refuses_a_foreign_module() -> None:
    with pytest.raises(RuntimeError, match="v0.2.1.post1"):
        engine_adapter.install({"SomethingElse": object})
    with pytest.raises(RuntimeError, match="verl 0.6.1"):
        server_adapter.install({"vLLMHttpServerBase": object})
