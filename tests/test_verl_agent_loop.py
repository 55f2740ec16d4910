"""The ``strands_agent`` verl agent loop against a fake of verl 0.9.1's contract (``tests/fake_verl09.py``).

Outputs are checked against what the fake rollout servers were actually sent and sampled (not against
agentboost's own bookkeeping): the prompt is the first call's prompt, prompt + response is the last
call's prompt + its reply, the loss mask is 1 exactly on sampled tokens, the log-probs are the server's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any

import pytest
import torch

from agentboost.backends.base import GenerationRequest
from agentboost.backends.verl_llm_client import VerlLLMClientBackend
from agentboost.chat.template import ChatTemplate
from agentboost.errors import BackendContextOverflow, BackendError, BackendTimeout
from agentboost.integration import verl_advantage, verl_agent_loop
from agentboost.types import SamplingParams
from tests import fake_verl09 as fv

ENV = "agentboost.environments.arithmetic:ArithmeticEnv"


@pytest.fixture(scope="module")
def loop_cls():
    return verl_agent_loop.build_loop_class(fv.AgentLoopBase, fv.AgentLoopOutput)


def stack(template: ChatTemplate, n_servers: int = 2, config: Any = None, **policy_kwargs: Any):
    config = config or fv.trainer_config()
    servers = [
        fv.FakeVLLMServer(f"s{i}", fv.arithmetic_policy(template, **policy_kwargs), config=config,
                          eos_token_id=template.tokenizer.eos_token_id, latency_s=0.002)
        for i in range(n_servers)
    ]  # fmt: skip
    return config, servers, fv.FakeLLMServerClient(servers)


def row(question: str, uid: str, **extra: Any) -> dict[str, Any]:
    return {
        "raw_prompt": [{"role": "user", "content": f"What is {question}?"}],
        "extra_info": {"prompt": f"What is {question}?", "answer": str(eval(question)), **extra},
        "uid": uid,
        "data_source": "arith",
        "index": 0,
    }


def run(loop_cls, template, rows, *, config, client, entry=None):
    return asyncio.run(
        fv.run_rows(loop_cls, rows, config=config, tokenizer=template.tokenizer, server_manager=client,
                    entry={"env_class": ENV, **(entry or {})})
    )  # fmt: skip


def check_exact(output: fv.AgentLoopOutput, calls: list) -> None:
    """The output is what the servers were sent and sampled, token for token."""
    assert calls, "the episode made no call"
    full = calls[-1].prompt_ids + calls[-1].token_ids
    assert output.prompt_ids == calls[0].prompt_ids
    assert output.prompt_ids + output.response_ids == full
    expected_mask = [0] * len(output.response_ids)
    expected_lps = [0.0] * len(output.response_ids)
    p = len(output.prompt_ids)
    for call in calls:
        assert full[: len(call.prompt_ids)] == call.prompt_ids  # each call's prompt is a prefix of the row
        start = len(call.prompt_ids) - p
        for i, lp in enumerate(call.log_probs):
            expected_mask[start + i] = 1
            expected_lps[start + i] = lp
    assert output.response_mask == expected_mask
    assert output.response_logprobs == pytest.approx(expected_lps)


def test_rows_are_exactly_what_the_servers_sampled_sticky_and_concurrent(loop_cls, qwen25_template) -> None:
    config, servers, client = stack(qwen25_template)
    questions = ["2 + 3", "7 * 6", "9 - 4", "12 + 30"]
    rows = [row(q, f"uid-{i}") for i, q in enumerate(questions) for _ in range(4)]  # 4 prompts x GRPO n=4
    outputs = run(loop_cls, qwen25_template, rows, config=config, client=client)

    assert len(outputs) == 16 and client.max_in_flight > 1  # the rows ran at the same time
    ids = [o.extra_fields["strands"]["episode_id"] for o in outputs]
    assert len(set(ids)) == 16
    for output, episode_id in zip(outputs, ids, strict=True):
        calls = [c for c in client.calls if c.request_id == episode_id]
        assert len(calls) == 2  # calculator call, then the answer
        assert len({c.server for c in calls}) == 1  # sticky: one episode, one replica
        check_exact(output, calls)
        assert output.reward_score == 1.0 and output.num_turns == 4  # user, call, tool result, answer
        strands = output.extra_fields["strands"]
        assert strands["termination"] == "completed" and strands["masked"] is False
        info = output.extra_fields["reward_extra_info"]
        assert info["strands_model_calls"] == 2.0 and info["strands_tool_calls"] == 1.0
        assert info["strands_termination_completed"] == 1.0 and info["strands_masked"] == 0.0
        assert output.extra_fields["min_global_steps"] == output.extra_fields["max_global_steps"] == 7
        assert output.metrics.generate_sequences > 0 and output.metrics.num_preempted == 0
    assert {c.server for c in client.calls} == {"s0", "s1"}  # load spread over both replicas
    # Every request asked for exactly the episode's remaining budget and stopped on the template's stops.
    for call in client.calls:
        assert set(call.params["stop_token_ids"]) >= set(qwen25_template.stop_token_ids)
    # verl's post-processing stacks the rows (same extra keys everywhere) with the reward on the last token.
    batch = fv.postprocess(outputs, config=config, pad_token_id=qwen25_template.tokenizer.pad_token_id)
    assert batch["rm_scores"].sum(-1).tolist() == [1.0] * 16
    assert batch["reward_extra_info/strands_masked"].tolist() == [0.0] * 16


def test_generation_cut_by_max_tokens_is_length_and_stays_trainable(loop_cls, qwen25_template) -> None:
    config = fv.trainer_config(**{"actor_rollout_ref.rollout.response_length": 24})
    config, _, client = stack(qwen25_template, config=config, ramble=40)
    [output] = run(loop_cls, qwen25_template, [row("2 + 3", "u")], config=config, client=client)
    [call] = client.calls
    assert call.stop_reason == "completed" and len(call.token_ids) == 24  # verl says nothing about the cut
    strands = output.extra_fields["strands"]
    assert strands["termination"] == "max_tokens" and not strands["masked"]  # the policy's ending: kept
    check_exact(output, client.calls)
    assert sum(output.response_mask) == 24


def test_failures_are_masked_rows_with_reward_zero(loop_cls, qwen25_template) -> None:
    config = fv.trainer_config(**{"actor_rollout_ref.rollout.prompt_length": 300})
    config, servers, client = stack(qwen25_template, config=config)
    rows = [
        row("2 + 3", "ok"),
        row("2 + 3", "long", prompt="What is " + " + ".join(["1"] * 400) + "?"),  # task prompt too long
        {"raw_prompt": [], "extra_info": {"answer": "1"}, "uid": "bad"},  # no prompt anywhere
        {**row("2 + 3", "bad-env"), "extra_info": {"prompt": "What is 2 + 3?", "tools": "no.such:module"}},
    ]
    outputs = run(loop_cls, qwen25_template, rows, config=config, client=client)
    good, long_prompt, no_prompt, bad_env = outputs
    assert good.extra_fields["strands"]["masked"] is False and good.reward_score == 1.0
    assert long_prompt.extra_fields["strands"]["termination"] == "context_overflow"
    assert no_prompt.extra_fields["strands"]["termination"] == "infra_error"
    assert "no prompt field" in no_prompt.extra_fields["strands"]["detail"]
    assert bad_env.extra_fields["strands"]["termination"] == "infra_error"
    for failed in (long_prompt, no_prompt, bad_env):
        assert failed.extra_fields["strands"]["masked"] is True
        assert failed.reward_score == 0.0 and set(failed.response_mask) == {0} and failed.response_ids
        assert failed.extra_fields["reward_extra_info"]["strands_masked"] == 1.0
        assert len(failed.prompt_ids) <= 300
    # An abort (weight sync, preemption) is an infrastructure failure, never a finished turn.
    servers[0].abort = servers[1].abort = True
    [aborted] = run(loop_cls, qwen25_template, [row("2 + 3", "abort")], config=config, client=client)
    assert aborted.extra_fields["strands"]["termination"] == "infra_error"
    assert aborted.reward_score == 0.0 and set(aborted.response_mask) == {0}
    # Rows still stack in verl's post-processing (same keys, logprobs everywhere).
    batch = fv.postprocess([*outputs, aborted], config=config, pad_token_id=0)
    assert batch["reward_extra_info/strands_masked"].tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]


def test_row_longer_than_verl_lengths_is_cut_and_masked_like_episodes_to_batch(loop_cls, qwen25_template) -> None:
    config = fv.trainer_config(**{"actor_rollout_ref.rollout.response_length": 16})
    config, _, client = stack(qwen25_template, config=config, ramble=3)
    entry = {"budget": {"max_response_tokens": 400, "max_total_tokens": 2000}}  # a budget past verl's lengths
    [output] = run(loop_cls, qwen25_template, [row("2 + 3", "u")], config=config, client=client, entry=entry)
    assert len(output.response_ids) == 16 and set(output.response_mask) == {0}
    assert output.reward_score == 0.0 and output.extra_fields["strands"]["batch_cut"]
    assert output.extra_fields["reward_extra_info"]["strands_batch_cut"] == 1.0
    full = client.calls[-1].prompt_ids + client.calls[-1].token_ids
    assert output.response_ids == full[len(output.prompt_ids) :][:16]


def test_task_and_system_prompt_from_the_row_and_options(loop_cls, qwen25_template) -> None:
    config = fv.trainer_config(strands={"env_class": "agentboost.environments.strands_env:StrandsEnv"})
    config, _, client = stack(qwen25_template, config=config)
    rows = [{
        "raw_prompt": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 4 + 4?"}],
        "extra_info": {"answer": "8"}, "uid": "u",
    }]  # fmt: skip
    # The YAML entry's keys win over +strands.*: the arithmetic env (calculator, exact answer) is used.
    [output] = run(loop_cls, qwen25_template, rows, config=config, client=client)
    prompt = qwen25_template.decode(output.prompt_ids)
    assert "You are terse." in prompt and "What is 4 + 4?" in prompt and '"calculator"' in prompt
    assert output.reward_score == 1.0
    with pytest.raises(ValueError, match="unknown strands option"):
        run(loop_cls, qwen25_template, rows, config=config, client=client, entry={"env_clas": ENV})


def test_full_determinism_uses_verls_request_id_rule(loop_cls, qwen25_template) -> None:
    config = fv.trainer_config(**{"actor_rollout_ref.rollout.full_determinism": True})
    config, _, client = stack(qwen25_template, config=config)
    [output] = run(loop_cls, qwen25_template, [{**row("2 + 3", "u"), "priority": 5}], config=config, client=client)
    assert output.extra_fields["strands"]["episode_id"] == "det-5"
    assert {c.request_id for c in client.calls} == {"det-5"}


def test_sampling_comes_from_verl_and_logprobs_only_when_asked(loop_cls, qwen25_template) -> None:
    rollout = "actor_rollout_ref.rollout"
    config = fv.trainer_config(
        **{f"{rollout}.calculate_log_probs": False, f"{rollout}.temperature": 0.0, f"{rollout}.top_k": 0}
    )
    config, _, client = stack(qwen25_template, config=config)
    outputs = run(loop_cls, qwen25_template, [row("2 + 3", "u"), {"raw_prompt": [], "uid": "x"}],
                  config=config, client=client)  # fmt: skip
    assert [o.response_logprobs for o in outputs] == [None, None]  # consistent across rows, failed ones too
    params = client.calls[0].params
    assert params["temperature"] == 0.0 and params["top_k"] == -1 and params["logprobs"] is False
    sampling, passthrough = verl_agent_loop.sampling_from_verl({"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                                                "logprobs": 1, "ignore_eos": False})  # fmt: skip
    assert sampling == SamplingParams(temperature=0.6, top_p=0.9, top_k=20, logprobs=True)
    assert passthrough == {"ignore_eos": False}


# -- the backend alone -------------------------------------------------------------------------------
class StubClient:
    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.seen: list[dict[str, Any]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.seen.append(sampling_params)
        sampling_params.pop("max_tokens")  # verl's server pops what it reads
        if isinstance(self.reply, BaseException):
            raise self.reply
        if self.reply == "hang":
            await asyncio.sleep(10)
        return self.reply


def generate(reply: Any, *, max_tokens: int = 4, stop: tuple[int, ...] = (9,), timeout_s: float | None = None):
    backend = VerlLLMClientBackend(StubClient(reply), passthrough={"ignore_eos": False})
    request = GenerationRequest([1, 2, 3], SamplingParams(), max_tokens, "ep", stop_token_ids=stop, timeout_s=timeout_s)
    return asyncio.run(backend.generate(request)), backend


def test_backend_derives_finish_reasons_verl_does_not_report() -> None:
    out = fv.TokenOutput

    def finish(ids: list[int], reported: str | None) -> str:
        return generate(out(token_ids=ids, log_probs=[-1.0] * len(ids), stop_reason=reported))[0].finish_reason

    assert finish([5, 6, 7, 8], "completed") == "length"  # filled max_tokens without a stop token: cut
    assert finish([5, 6, 7, 9], "completed") == "stop"
    assert finish([5, 9], "completed") == "stop"
    assert finish([5, 6, 7, 8], "length") == "length"  # the fully-async client's own report
    reply = out(token_ids=[5, 9], stop_reason=None, num_preempted=2, extra_fields={"global_steps": 3})
    result, backend = generate(reply)
    assert result.finish_reason == "stop" and result.weight_version == 3
    assert backend.global_steps == [3] and backend.preempted == 2
    spans = out(token_ids=[5, 9], stop_reason="completed", extra_fields={"global_steps": 5, "min_global_steps": 4})
    assert generate(spans)[1].global_steps == [4, 5]  # a resumed partial rollout: both versions recorded
    with pytest.raises(BackendError, match="aborted"):
        generate(out(token_ids=[], stop_reason="aborted"))
    with pytest.raises(BackendError, match="5 tokens for max_tokens=4"):
        generate(out(token_ids=[1, 2, 3, 4, 5], stop_reason="completed"))


def test_backend_maps_errors_and_sends_a_fresh_dict_per_call() -> None:
    with pytest.raises(BackendContextOverflow):
        generate(ValueError("Prompt length (9) leaves no room to generate within the model's maximum context length"))
    with pytest.raises(BackendError, match="RuntimeError"):
        generate(RuntimeError("No available servers in load balancer"))
    with pytest.raises(BackendTimeout):
        generate("hang", timeout_s=0.05)
    _, backend = generate(fv.TokenOutput(token_ids=[9], stop_reason="completed"))
    [sent] = backend.client.seen
    assert sent["ignore_eos"] is False and sent["stop_token_ids"] == [9] and "max_tokens" not in sent


# -- the advantage estimator and the registration ------------------------------------------------------
def test_estimator_leaves_masked_rows_out_and_zeroes_lone_survivors() -> None:
    core = fv.core_algos_module()
    assert verl_advantage.register(core) is True and verl_advantage.register(core) is False
    rewards = torch.zeros(7, 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    mask = torch.ones(7, 3, dtype=torch.long)
    mask[2] = mask[3] = mask[5] = 0  # masked rows (reward 0, no loss token)
    uids = ["a", "a", "a", "a", "b", "b", "c"]
    adv = fv.compute_advantage(core, "agentboost_grpo", {"rm_scores": rewards, "response_mask": mask}, uids)
    # group a: only rows 0, 1 count: (1 - .5) / std([1, 0]) = +-0.7071; b and c have one usable row each.
    assert adv[:, 0].tolist() == pytest.approx([0.70710, -0.70710, 0, 0, 0, 0, 0], abs=1e-4)
    assert (adv[mask == 0] == 0).all()
    no_std = fv.compute_advantage(core, "agentboost_grpo", {"rm_scores": rewards, "response_mask": mask}, uids,
                                  config=fv.Config(norm_adv_by_std_in_grpo=False))  # fmt: skip
    assert no_std[:2, 0].tolist() == pytest.approx([0.5, -0.5])
    other = fv.core_algos_module()
    other.register_adv_est("agentboost_grpo")(lambda **kw: None)
    with pytest.raises(ValueError, match="already registered"):
        verl_advantage.register(other)


def test_install_registers_loop_and_estimator_and_refuses_other_versions() -> None:
    module, core = fv.agent_loop_module(), fv.core_algos_module()
    cls = verl_agent_loop.install(module, core, version="0.9.1")
    assert issubclass(cls, fv.AgentLoopBase) and cls.__name__ == "StrandsAgentLoop"
    assert module._agent_loop_registry["strands_agent"] == {
        "_target_": "agentboost.integration.verl_agent_loop.StrandsAgentLoop"
    }
    assert "agentboost_grpo" in core.ADV_ESTIMATOR_REGISTRY
    verl_agent_loop.install(module, core, version="0.9.3")  # idempotent, patch releases accepted
    for version in ("0.6.1", "0.8.0", "0.9.0", "0.10.0", "1.0"):
        with pytest.raises(verl_agent_loop.UnsupportedVerl, match=r"supports verl >=0.9.1,<0.10 \(tested: 0.9.1\)"):
            verl_agent_loop.install(fv.agent_loop_module(), fv.core_algos_module(), version=version)
    assert "_target_: agentboost.integration.verl_agent_loop.StrandsAgentLoop" in (
        verl_agent_loop.AGENT_LOOP_CONFIG.read_text()
    )


# -- sync tools on their own threads (agentboost.tool_executor) -------------------------------------------
def slow_calculator(seconds: float, gate: threading.Event | None = None) -> Any:
    """A synchronous ``calculator`` tool that takes ``seconds`` (or hangs until ``gate`` is set)."""
    from strands import tool

    from agentboost.tools.calculator import calculator as real

    @tool(name="calculator", description="Evaluate an arithmetic expression.",
          inputSchema={"json": {"type": "object", "properties": {"expression": {"type": "string"}},
                                "required": ["expression"]}})  # fmt: skip
    def calculator(expression: str) -> dict:
        if gate is not None:
            gate.wait(60)
        else:
            time.sleep(seconds)
        return real._tool_func(expression)

    return calculator


def small_default_executor() -> None:
    """The default executor a 2-core verl worker actor has (min(32, cpus + 4) threads), whatever this machine is."""
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(6))


def run_with_small_executor(loop_cls, template, rows, *, config, client, entry):
    async def main():
        small_default_executor()
        return await fv.run_rows(loop_cls, rows, config=config, tokenizer=template.tokenizer, server_manager=client,
                                 entry={"env_class": ENV, **entry})  # fmt: skip

    return asyncio.run(main())


def test_concurrent_sync_tools_do_not_time_out_while_waiting_for_a_thread(loop_cls, qwen25_template) -> None:
    """24 episodes call a 2 s synchronous tool at once under a 3 s tool timeout. On the loop's default executor
    (6 threads on 2 cores) 18 of them waited in its queue while their timeout ran and were trained on as tool
    timeouts; on the tools' own threads, with the timeout started when the tool starts, none is."""
    config, _, client = stack(qwen25_template)
    rows = [row("2 + 3", f"u{i // 4}") for i in range(24)]
    entry = {"env_args": {"tools": [slow_calculator(2.0)]}, "budget": {"tool_timeout_s": 3.0}, "wall_clock_s": 120}
    outputs = run_with_small_executor(loop_cls, qwen25_template, rows, config=config, client=client, entry=entry)
    errors = [o.extra_fields["reward_extra_info"]["strands_tool_errors"] for o in outputs]
    assert errors == [0.0] * 24
    assert [o.reward_score for o in outputs] == [1.0] * 24  # the tool's real result reached every episode
    assert all(o.extra_fields["reward_extra_info"]["strands_tool_s"] >= 1.9 for o in outputs)


def test_hung_sync_tools_do_not_poison_the_next_episodes(loop_cls, qwen25_template) -> None:
    """6 tool calls hang past their timeout. Their threads cannot be killed; on the default executor they took
    all 6 threads and the next episodes' env.reset waited behind them until the wall clock ended them as
    infra_error. Here they are abandoned (counted as hung, replaced) and the next episodes run normally."""
    from agentboost import tool_executor

    config, _, client = stack(qwen25_template)
    gate = threading.Event()
    hung_entry = {"env_args": {"tools": [slow_calculator(0, gate)]}, "budget": {"tool_timeout_s": 0.5},
                  "wall_clock_s": 8}  # fmt: skip
    normal_entry = {"budget": {"tool_timeout_s": 5.0}, "wall_clock_s": 8}

    async def main():
        small_default_executor()
        kwargs = {"config": config, "tokenizer": qwen25_template.tokenizer, "server_manager": client}
        hung = await fv.run_rows(loop_cls, [row("2 + 3", f"h{i}") for i in range(6)],
                                 entry={"env_class": ENV, **hung_entry}, **kwargs)  # fmt: skip
        normal = await fv.run_rows(loop_cls, [row("4 * 4", f"n{i}") for i in range(4)],
                                   entry={"env_class": ENV, **normal_entry}, **kwargs)  # fmt: skip
        executor = tool_executor.installed()
        return hung, normal, executor.tools.stats() if executor is not None else None

    try:
        hung, normal, stats = asyncio.run(main())
    finally:
        gate.set()
    assert [o.extra_fields["strands"]["termination"] for o in hung] == ["completed"] * 6  # the tool timed out
    assert [o.extra_fields["reward_extra_info"]["strands_tool_errors"] for o in hung] == [1.0] * 6
    assert [o.extra_fields["strands"]["termination"] for o in normal] == ["completed"] * 4
    assert [o.reward_score for o in normal] == [1.0] * 4
    assert stats is not None and stats["hung"] == 6 and stats["abandoned_total"] == 6


def test_tool_pool_replaces_hung_threads_and_fails_past_its_limit() -> None:
    from agentboost.errors import ToolFatalError
    from agentboost.tool_executor import SyncToolPool, ToolClock

    gate = threading.Event()
    pool = SyncToolPool(max_threads=1, max_hung=2)

    async def call(fn, timeout_s):
        clock = ToolClock(timeout_s)
        loop = asyncio.get_running_loop()
        try:
            async with clock.step():
                return await asyncio.wrap_future(pool.submit(clock, fn), loop=loop)
        except TimeoutError:
            clock.abandon()
            return "timed out"

    async def main():
        first = await call(lambda: gate.wait(30), 0.2)
        second = await call(lambda: gate.wait(30), 0.2)  # one thread at most, but the hung one was replaced
        with pytest.raises(ToolFatalError, match="2 timed-out tool calls"):
            await call(lambda: "x", 5)
        return first, second, pool.stats()

    try:
        first, second, stats = asyncio.run(main())
    finally:
        gate.set()
    assert (first, second) == ("timed out", "timed out")
    assert stats["hung"] == 2 and stats["threads_started"] == 2 and stats["rejected_total"] == 1
    deadline = time.monotonic() + 10
    while pool.stats()["hung"] and time.monotonic() < deadline:  # released threads return and leave
        time.sleep(0.05)
    assert pool.stats()["hung"] == 0


def test_a_queued_sync_tool_starts_its_timeout_when_it_starts() -> None:
    from agentboost.tool_executor import SyncToolPool, ToolClock

    pool = SyncToolPool(max_threads=1)

    async def call(seconds):
        clock = ToolClock(0.6)
        async with clock.step():
            await asyncio.wrap_future(pool.submit(clock, time.sleep, seconds))
        return clock.queued_s

    async def main():
        return await asyncio.gather(call(0.4), call(0.4), call(0.4))  # 1.2 s in all, one thread, 0.6 s each

    queued = asyncio.run(main())
    assert sorted(queued)[-1] >= 0.7  # the last one waited ~0.8 s for the thread and still did not time out


# -- the episode clock on verl's servers -----------------------------------------------------------------
def test_time_waiting_on_verls_servers_is_off_the_episode_clock(loop_cls, qwen25_template) -> None:
    """verl's servers queue requests and, in the async trainer modes, pause for the whole weight update: an
    episode waiting on them is not the policy's slowness. With a 1 s wall clock and 1.5 s per server call the
    episode completes (it ended infra_error, 'waiting on the inference server'); its tool time still counts."""
    config = fv.trainer_config()
    servers = [fv.FakeVLLMServer("s0", fv.arithmetic_policy(qwen25_template), config=config,
                                 eos_token_id=qwen25_template.tokenizer.eos_token_id, latency_s=1.5)]  # fmt: skip
    client = fv.FakeLLMServerClient(servers)
    [output] = run(loop_cls, qwen25_template, [row("2 + 3", "u")], config=config, client=client,
                   entry={"wall_clock_s": 1.0})  # fmt: skip
    assert output.extra_fields["strands"]["termination"] == "completed", output.extra_fields["strands"]["detail"]
    assert output.reward_score == 1.0 and output.extra_fields["reward_extra_info"]["strands_model_s"] >= 3.0
    [slow_tool] = run(loop_cls, qwen25_template, [row("2 + 3", "v")], config=config, client=client,
                      entry={"wall_clock_s": 2.5, "env_args": {"tools": [slow_calculator(4.0)]},
                             "budget": {"tool_timeout_s": None}})  # fmt: skip
    assert slow_tool.extra_fields["strands"]["termination"] == "timeout"  # the agent's own time counts


# -- item 8: ids, finish reasons -------------------------------------------------------------------------
def test_full_determinism_gives_every_v1_episode_its_own_id(loop_cls, qwen25_template) -> None:
    """verl 0.9.1's V1 worker passes no ``priority``: ToolAgentLoop's det-<priority> rule makes every episode
    det-0 (one vLLM request id, one sticky replica). Stable ids per (step, row, sample) instead."""
    config = fv.trainer_config(**{"actor_rollout_ref.rollout.full_determinism": True})
    config, _, client = stack(qwen25_template, config=config)
    rows = [
        {**row("2 + 3", f"u{i}"), "index": i, "global_steps": 3, "session_id": s} for i in range(2) for s in range(2)
    ]
    outputs = run(loop_cls, qwen25_template, rows, config=config, client=client)
    ids = [o.extra_fields["strands"]["episode_id"] for o in outputs]
    assert ids == ["det-3-0-0", "det-3-0-1", "det-3-1-0", "det-3-1-1"]
    assert {c.server for c in client.calls} == {"s0", "s1"}


def test_backend_reads_the_fully_async_clients_length_after_a_stop_token_as_stop() -> None:
    out = fv.TokenOutput
    # FullyAsyncLLMServerClient sets "length" once the cumulative tokens reach max_tokens, EOS or not
    assert generate(out(token_ids=[5, 6, 7, 9], stop_reason="length"))[0].finish_reason == "stop"
    assert generate(out(token_ids=[5, 6, 7, 8], stop_reason="length"))[0].finish_reason == "length"


def test_backend_judges_a_cut_by_the_servers_context_window_as_length() -> None:
    """verl's server clamps max_tokens to max_model_len - len(prompt): 2 tokens for a 3-token prompt in a 5-token
    window. A 2-token reply without a stop token was cut (it was read as a finished turn)."""
    request = GenerationRequest([1, 2, 3], SamplingParams(), 4, "ep", stop_token_ids=(9,))
    reply = fv.TokenOutput(token_ids=[5, 6], stop_reason="completed")
    backend = VerlLLMClientBackend(StubClient(reply), max_model_len=5)
    assert asyncio.run(backend.generate(request)).finish_reason == "length"
    assert asyncio.run(VerlLLMClientBackend(StubClient(reply)).generate(request)).finish_reason == "stop"


def test_budget_comes_from_the_servers_effective_context(tmp_path, qwen25_template) -> None:
    """Without rollout.max_model_len verl's servers use the model's max_position_embeddings: the budget too."""
    from transformers import Qwen2Config

    Qwen2Config(max_position_embeddings=300, vocab_size=1000).save_pretrained(tmp_path)
    config = fv.trainer_config(**{"actor_rollout_ref.model.path": str(tmp_path)})
    options = verl_agent_loop.StrandsLoopOptions.from_mapping({"env_class": ENV})
    runner = verl_agent_loop.StrandsRowRunner(config, qwen25_template.tokenizer, options)
    assert runner.budget.max_total_tokens == 300  # not 512 + 256
    assert runner.max_model_len == 300
    config = fv.trainer_config(**{"actor_rollout_ref.rollout.max_model_len": 400})
    assert verl_agent_loop.StrandsRowRunner(config, qwen25_template.tokenizer, options).budget.max_total_tokens == 400


def test_train_aux_calls_reaches_the_episodes_settings(qwen25_template) -> None:
    config = fv.trainer_config()
    for value in (True, False):
        options = verl_agent_loop.StrandsLoopOptions.from_mapping({"env_class": ENV, "train_aux_calls": value})
        runner = verl_agent_loop.StrandsRowRunner(config, qwen25_template.tokenizer, options)
        assert runner.settings(SamplingParams()).train_aux_calls is value


# -- episodes of several trajectories (docs/multi-agent.md) ------------------------
WINDOWED = {"agent_args": {"agent_factory": "agentboost.environments.arithmetic:windowed_agent"}}


def test_an_episode_of_several_trajectories_is_one_output_per_trajectory_under_v1(loop_cls, qwen25_template) -> None:
    config, servers, client = stack(qwen25_template)
    questions = ["2 + 3", "7 * 6"]
    outputs = run(loop_cls, qwen25_template, [row(q, f"u{i}") for i, q in enumerate(questions)], config=config,
                  client=client, entry=WINDOWED)  # fmt: skip
    calls = client.calls
    for question, out in zip(questions, outputs, strict=True):
        assert question in qwen25_template.decode(out[0].prompt_ids)
        assert isinstance(out, list) and len(out) == 2  # the tool call, then the answer given its result
        first, second = out
        assert first.extra_fields["strands"]["trajectory"] == 0 and second.extra_fields["strands"]["trajectory"] == 1
        assert first.reward_score == second.reward_score == 1.0  # the episode's reward on every row
        # Each row is exactly what one server call was sent and sampled.
        for part in out:
            (call,) = [c for c in calls if c.prompt_ids == part.prompt_ids]
            assert part.response_ids == call.token_ids and part.response_mask == [1] * len(call.token_ids)
            assert part.response_logprobs == pytest.approx(call.log_probs)
        assert "What is" in qwen25_template.decode(first.prompt_ids)
        assert "What is" not in qwen25_template.decode(second.prompt_ids)  # the window dropped the question
        info = second.extra_fields["reward_extra_info"]
        assert info["strands_trajectories"] == 2.0 and info["strands_rerendered_tokens"] == len(second.prompt_ids)


def test_the_legacy_trainer_gets_one_masked_output_that_says_why(loop_cls, qwen25_template) -> None:
    config, _, client = stack(qwen25_template, config=fv.trainer_config(**{"trainer.use_v1": False}))
    (out,) = run(loop_cls, qwen25_template, [row("2 + 3", "u0")], config=config, client=client, entry=WINDOWED)
    assert not isinstance(out, list)
    strands = out.extra_fields["strands"]
    assert strands["termination"] == "infra_error" and "legacy trainer" in strands["detail"]
    assert out.reward_score == 0.0 and sum(out.response_mask) == 0


def test_agentboost_grpo_counts_each_session_once_in_v1() -> None:
    """verl's V1 trainer hands a registered estimator every output of a sample; agentboost's wrapper gives
    each session (episode) one place in its group and its advantage on every row."""
    import types

    calls: list[Any] = []

    def original(data, batch_keys, adv_estimator, *args, **kwargs):
        calls.append(adv_estimator)
        return data

    module = types.SimpleNamespace(compute_advantage_for_multi_trajectories=original)
    assert verl_advantage.install_multi_trajectory(module)
    assert not verl_advantage.install_multi_trajectory(module)  # idempotent
    # Sample u: sessions 0 (2 rows, reward 1), 1 (1 row, reward 0), 2 (3 rows, reward 1), 3 (masked: no
    # loss token, reward 0). Sample v: session 0 alone survives (session 1 masked): advantage 0.
    layout = [("u", 0, 1.0, 1), ("u", 0, 1.0, 1), ("u", 1, 0.0, 1), ("u", 2, 1.0, 1), ("u", 2, 1.0, 1),
              ("u", 2, 1.0, 1), ("u", 3, 0.0, 0), ("v", 0, 1.0, 1), ("v", 1, 0.0, 0)]  # fmt: skip
    keys, counts = [], {}
    for uid, session, _, _ in layout:
        index = counts.get((uid, session), 0)
        counts[(uid, session)] = index + 1
        keys.append(f"{uid}_{session}_{index}")
    rewards = torch.zeros(len(layout), 4)
    mask = torch.zeros(len(layout), 4)
    for i, (_, _, reward, has_tokens) in enumerate(layout):
        rewards[i, 3] = reward
        mask[i, :3] = has_tokens
    data = types.SimpleNamespace(batch={"token_level_rewards": rewards, "response_mask": mask})
    out = module.compute_advantage_for_multi_trajectories(data, keys, "agentboost_grpo", config=None)
    adv = out.batch["advantages"][:, 0]
    u = torch.tensor([1.0, 0.0, 1.0])  # sessions 0, 1, 2 of u (3 is masked)
    expected_u = (u - u.mean()) / (u.std() + 1e-6)
    assert adv[:2].tolist() == pytest.approx([expected_u[0].item()] * 2, abs=1e-5)
    assert adv[2].item() == pytest.approx(expected_u[1].item(), abs=1e-5)
    assert adv[3:6].tolist() == pytest.approx([expected_u[2].item()] * 3, abs=1e-5)
    assert adv[6:].tolist() == [0.0, 0.0, 0.0]
    assert (out.batch["advantages"][:, 3] == 0).all()  # only loss tokens carry it
    module.compute_advantage_for_multi_trajectories(data, keys, "grpo")
    assert calls == ["grpo"]  # other estimators go to verl's own function


def test_training_step_metrics_from_the_rows_count_episodes_not_trajectories(loop_cls, qwen25_template) -> None:
    """agentboost's replay buffer turns the rows' reward_extra_info into strands/* (verl_sampler.row_metrics):
    the loop's rows give the rLLM route's per-episode numbers, an episode of several trajectories counting once."""
    from agentboost.integration.verl_sampler import row_metrics

    config, _, client = stack(qwen25_template)
    rows = [row("2 + 3", "a"), row("7 * 6", "a"), {"raw_prompt": [], "extra_info": {}, "uid": "b"}]
    outputs = run(loop_cls, qwen25_template, rows, config=config, client=client)
    metrics = row_metrics([o.extra_fields["reward_extra_info"] for o in outputs])
    assert metrics["strands/episodes"] == 3 and metrics["strands/masked_fraction"] == pytest.approx(1 / 3)
    assert metrics["strands/termination/completed"] == pytest.approx(2 / 3)
    assert metrics["strands/termination/infra_error"] == pytest.approx(1 / 3)
    assert metrics["strands/tool_calls_per_episode"] == pytest.approx(2 / 3)
    assert metrics["strands/model_calls_per_episode"] == pytest.approx(4 / 3)
    infos = [o.extra_fields["reward_extra_info"] for o in outputs]
    # one episode, two rows
    two = {**infos[0], "strands_trajectories": 2.0, "strands_rows": 2.0, "strands_tool_calls": 4.0}
    weighted = row_metrics([two, two, infos[2]])
    assert weighted["strands/episodes"] == 2 and weighted["strands/rows"] == 3
    assert weighted["strands/tool_calls_per_episode"] == 2.0 and weighted["strands/masked_fraction"] == 0.5
    assert weighted["strands/rows_per_episode"] == 1.5  # the failed episode: one padding row, no trajectory
    assert weighted["strands/trajectories_per_episode"] == 1.0
    assert row_metrics([{"other": 1.0}]) == {}
