"""A real Strands Agent with two tools against a real local HTTP server speaking vLLM's completions
protocol (token ids in, scripted token ids out)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.backends.vllm_http import VLLMCompletionsBackend
from agentboost.cli.main import main as cli_main
from agentboost.environments.strands_env import StrandsEnv
from agentboost.episode import SegmentKind
from agentboost.rollout import RolloutSettings, run_episode
from agentboost.testing.fake_vllm import FakeVLLMServer, fake_logprob
from agentboost.types import Budget, SamplingParams, Termination

from .helpers import add, calls_text, mul


def make_responder(template):
    """A scripted 'model': reads the prompt it was given and answers like a tool-using agent."""

    def respond(prompt_ids: list[int]) -> list[int]:
        text = template.decode(prompt_ids)
        last_turn = text.rsplit("<|im_start|>", 2)[-2]
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", last_turn, re.DOTALL)
        if not results:
            out = calls_text("hermes", [("add", {"a": 2, "b": 3}), ("mul", {"a": 4, "b": 5})], content="Computing.")
        elif len(results) == 2:
            out = calls_text("hermes", [("add", {"a": int(results[0]), "b": int(results[1])})])
        else:
            out = f"The answer is {results[0]}."
        return [*template.encode(out), template.info.eot_token_id]

    return respond


def reward(task, episode):
    return float(episode.final_text.strip() == f"The answer is {task['answer']}.")


def _episode(backend, template, settings=None, row=None):
    env = StrandsEnv(row or {"prompt": "What is (2+3) + 4*5?", "answer": 25}, tools=[add, mul], reward_fn=reward)
    return asyncio.run(run_episode(env, StrandsAgent(system_prompt="Use the tools."), backend, template, settings))


@pytest.fixture
def server(qwen25_template):
    with FakeVLLMServer(make_responder(qwen25_template), vocab_size=len(qwen25_template.tokenizer)) as srv:
        yield srv


def test_strands_agent_over_http_is_token_exact(server, qwen25_template) -> None:
    backend = VLLMCompletionsBackend(server.url)  # model name discovered from /v1/models
    episode = _episode(backend, qwen25_template)
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert episode.reward == 1.0
    assert episode.tools["add"].calls == 2 and episode.tools["mul"].calls == 1
    assert len(server.requests) == 3 == len(episode.calls)

    flat = episode.prompt_ids + episode.response_ids
    model_segments = [s for s in episode.segments if s.kind is SegmentKind.MODEL]
    for call, body, seg in zip(episode.calls, server.requests, model_segments, strict=True):
        assert body["prompt"] == flat[: call.context_tokens]  # the server got exactly the episode prefix
        assert body["max_tokens"] == call.max_tokens and body["max_tokens"] > 0
        assert body["return_token_ids"] is True and body["logprobs"] == 1 and body["return_tokens_as_token_ids"]
        assert body["skip_special_tokens"] is False
        assert body["stop_token_ids"] == list(qwen25_template.stop_token_ids)
        assert seg.logprobs == [fake_logprob(i, t) for i, t in enumerate(seg.token_ids)]
        assert seg.token_ids[-1] == qwen25_template.info.eot_token_id  # kept exactly, eot included
    assert episode.response_logprobs[: len(model_segments[0].token_ids)] == model_segments[0].logprobs
    # Round trip through JSON keeps everything.
    from agentboost.episode import Episode

    again = Episode.from_json(episode.to_json())
    assert again.to_dict() == episode.to_dict()
    again.check_invariants()
    asyncio.run(backend.aclose())


def test_transient_failures_are_retried(server, qwen25_template) -> None:
    server.fail_next = [503, 502]
    server.abort_next = 1
    episode = _episode(VLLMCompletionsBackend(server.url, model="fake-model"), qwen25_template)
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert len(server.requests) == 6  # 3 calls + 2 HTTP failures + 1 aborted generation


def test_persistent_failures_become_infra_error(server, qwen25_template) -> None:
    server.fail_next = [500] * 10
    backend = VLLMCompletionsBackend(server.url, model="fake-model", max_retries=2)
    episode = _episode(backend, qwen25_template)
    assert episode.termination is Termination.INFRA_ERROR and "after 2 retries" in episode.termination_detail
    assert episode.masked and len(server.requests) == 3
    # The status and the server's own message survive the retries (they say why it failed).
    assert "HTTP 500" in episode.termination_detail and "injected failure 500" in episode.termination_detail


def test_persistent_aborts_are_infra_error(server, qwen25_template) -> None:
    server.abort_next = 10
    backend = VLLMCompletionsBackend(server.url, model="fake-model", max_retries=1)
    episode = _episode(backend, qwen25_template)
    assert episode.termination is Termination.INFRA_ERROR and episode.masked
    assert "finish_reason='abort'" in episode.termination_detail and episode.calls == []


@pytest.mark.parametrize("listed", [True, False], ids=["window-listed", "server-refuses"])
def test_first_prompt_over_the_window_is_context_overflow(qwen25_template, listed) -> None:
    # The task's prompt (267 tokens) does not fit a 200-token window: refused before sending when /v1/models
    # lists the window, else by the server's 400 (here for max_tokens > max_model_len, checked first); either
    # way the task's, masked.
    with FakeVLLMServer(make_responder(qwen25_template), max_model_len=200, list_max_model_len=listed) as srv:
        settings = RolloutSettings(budget=Budget(max_total_tokens=4096))
        episode = _episode(VLLMCompletionsBackend(srv.url, model="fake-model"), qwen25_template, settings)
    assert episode.termination is Termination.CONTEXT_OVERFLOW and episode.masked
    assert "max_model_len=200" in episode.termination_detail
    assert len(srv.requests) == (0 if listed else 1)


@pytest.mark.parametrize("listed", [True, False], ids=["window-listed", "server-refuses"])
def test_later_prompt_over_the_window_is_max_tokens(qwen25_template, listed) -> None:
    # The first two prompts (267 and 350 tokens) fit a 380-token window, the third (396) does not: the
    # policy's turns used the window up (max_tokens, trained on), not the task's prompt. (64 tokens per call:
    # a server that does not list its window refuses a larger max_tokens outright.)
    with FakeVLLMServer(make_responder(qwen25_template), max_model_len=380, list_max_model_len=listed) as srv:
        settings = RolloutSettings(
            sampling=SamplingParams(max_tokens_per_call=64), budget=Budget(max_total_tokens=4096)
        )
        episode = _episode(VLLMCompletionsBackend(srv.url, model="fake-model"), qwen25_template, settings)
    assert episode.termination is Termination.MAX_TOKENS and not episode.masked, episode.termination_detail
    assert len(episode.calls) == 2 and len(srv.requests) == (2 if listed else 3)


@pytest.mark.parametrize("legacy", [False, True], ids=["vllm-0.32", "vllm-0.10"])
def test_budget_larger_than_the_window_is_cut_to_it(qwen25_template, legacy) -> None:
    # Budget 32768 (the default), window 2048: max_tokens is cut to what each prompt leaves. Sent as the budget
    # says, vLLM 0.32 refuses max_tokens > max_model_len and 0.10 prompt + max_tokens > max_model_len: every
    # episode's first call failed as a context overflow (masked) though its prompt fits.
    with FakeVLLMServer(make_responder(qwen25_template), max_model_len=2048, legacy_context_check=legacy) as srv:
        episode = _episode(VLLMCompletionsBackend(srv.url, model="fake-model"), qwen25_template)
    assert episode.termination is Termination.COMPLETED, episode.termination_detail
    assert [body["max_tokens"] for body in srv.requests] == [2048 - len(body["prompt"]) for body in srv.requests]


def test_wrong_model_name_is_infra_error(server, qwen25_template) -> None:
    episode = _episode(VLLMCompletionsBackend(server.url, model="other"), qwen25_template)
    assert episode.termination is Termination.INFRA_ERROR and "does not exist" in episode.termination_detail


def test_token_ids_from_logprob_tokens_when_server_omits_them(server, qwen25_template) -> None:
    server.drop_token_ids = True
    episode = _episode(VLLMCompletionsBackend(server.url, model="fake-model"), qwen25_template)
    assert episode.termination is Termination.COMPLETED


def test_no_token_ids_at_all_is_refused(server, qwen25_template) -> None:
    server.drop_token_ids = True
    from agentboost.types import SamplingParams

    settings = RolloutSettings(sampling=SamplingParams(logprobs=False))
    episode = _episode(VLLMCompletionsBackend(server.url, model="fake-model"), qwen25_template, settings)
    assert episode.termination is Termination.INFRA_ERROR and "never re-tokenises" in episode.termination_detail


def test_slow_server_is_an_infrastructure_timeout(server, qwen25_template) -> None:
    server.delay_s = 2.0
    settings = RolloutSettings(budget=Budget(wall_clock_s=0.5))
    episode = _episode(VLLMCompletionsBackend(server.url, model="fake-model"), qwen25_template, settings)
    assert episode.termination is Termination.INFRA_ERROR and episode.masked  # the server's, not the policy's


def test_episodes_stick_to_one_server(qwen25_template) -> None:
    responder = make_responder(qwen25_template)
    with FakeVLLMServer(responder) as a, FakeVLLMServer(responder) as b:
        backend = VLLMCompletionsBackend([a.url, b.url], model="fake-model")

        async def many():
            envs = [StrandsEnv({"prompt": f"q{i}", "answer": 25}, tools=[add, mul], reward_fn=reward) for i in range(6)]
            return await asyncio.gather(
                *[
                    run_episode(e, StrandsAgent(), backend, qwen25_template, episode_id=f"ep{i}")
                    for i, e in enumerate(envs)
                ]
            )

        episodes = asyncio.run(many())
    assert all(e.termination is Termination.COMPLETED for e in episodes)
    for e in episodes:
        assert len({c.server for c in e.calls}) == 1  # every call of an episode on the same server
    servers = [e.calls[0].server for e in episodes]
    assert {s.split("/v1")[0] for s in servers} == {a.url, b.url}  # load spread over both
    assert len(a.requests) + len(b.requests) == 18


def test_cli_rollout_against_http_server(server, tmp_path, capsys) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        "\n".join(json.dumps({"task_id": f"t{i}", "prompt": "What is (2+3) + 4*5?", "answer": 25}) for i in range(3))
    )
    out = tmp_path / "out"
    code = cli_main([
        "rollout", "--data", str(data), "--backend", server.url, "--tokenizer", "offline:qwen2.5",
        "--env", "agentboost.environments.strands_env:StrandsEnv",
        "--env-arg", 'tools=["tests.helpers:add", "tests.helpers:mul"]',
        "--env-arg", "reward_fn=tests.test_http_backend_e2e:reward",
        "--n", "2", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 6
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 6 and summary["reward_mean"] == 1.0
    assert summary["terminations"]["completed"] == 6
    assert summary["tools"]["add"]["calls"] == 12
    assert "| add | 12 |" in capsys.readouterr().out
