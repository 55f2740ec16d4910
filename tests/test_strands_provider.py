"""Baselines through a Strands model provider (here Strands' OpenAIModel against a fake OpenAI-compatible
chat endpoint, no network): same environments, rewards, termination rule and reports as the token
route; every episode and report marked not token-exact and masked; two runs compared side by side."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentboost.backends.factory import ModelSpec
from agentboost.backends.strands_provider import NOT_TOKEN_EXACT, ProviderRef, build_strands_model, parse_provider
from agentboost.cli.main import main as cli
from agentboost.episode import Episode
from agentboost.evaluation.compare import compare_runs
from agentboost.rollout import RolloutSettings
from agentboost.runs import AgentSpec, expand, run_spec
from agentboost.testing.fake_openai_chat import ChatReply, FakeOpenAIChatServer, last_user_text, tool_results
from agentboost.types import Budget, SamplingParams, Termination

pytest.importorskip("strands_evals")  # the capitals example scores with strands-agents-evals evaluators


def frontier(body: dict[str, Any]) -> ChatReply:
    """A model that looks the country up, then answers with the capital the tool gave."""
    results = tool_results(body)
    if not results:
        country = last_user_text(body).removeprefix("What is the capital of ").rstrip("?")
        return ChatReply(content="Looking it up.", tool_calls=[{"name": "country_facts",
                                                                "arguments": {"country": country}}])  # fmt: skip
    return ChatReply(content=f"The capital is {results[-1].split('capital ')[1].split(';')[0]}.")


def guesser(body: dict[str, Any]) -> ChatReply:
    """A model that never uses the tool and always says Paris."""
    return ChatReply(content="Paris.")


@pytest.fixture
def chat_server():
    with FakeOpenAIChatServer(frontier, model="frontier") as server:
        yield server


def test_provider_specs_parse_and_refuse_malformed_ones() -> None:
    assert parse_provider("openai:gpt-4o-mini") == ProviderRef("openai", "gpt-4o-mini")
    ref = parse_provider("strands:openai:Qwen/Qwen3-4B@http://127.0.0.1:8000/v1")
    assert ref == ProviderRef("openai", "Qwen/Qwen3-4B", "http://127.0.0.1:8000/v1")
    assert ref.what() == "strands:openai:Qwen/Qwen3-4B"
    bedrock = parse_provider("bedrock:us.anthropic.claude-sonnet-4-20250514-v1:0@us-west-2")
    assert bedrock == ProviderRef("bedrock", "us.anthropic.claude-sonnet-4-20250514-v1:0", "us-west-2")
    assert parse_provider("py:mypkg.models:make") == ProviderRef("py", "mypkg.models:make")
    for bad in ("gpt-4o", "anthropic:claude", "openai:", "openai:m@localhost:8000"):
        with pytest.raises(ValueError):
            parse_provider(bad)


def test_sampling_reaches_the_provider_only_where_it_differs_from_its_defaults(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "real-openai-key")
    sampling = SamplingParams(temperature=0.7, top_k=20, seed=3, max_tokens_per_call=64)
    local = build_strands_model(parse_provider("openai:m@http://127.0.0.1:9/v1"), sampling=sampling)
    assert local.client_args["api_key"] == "EMPTY"  # the OpenAI key never goes to another endpoint
    params = {"temperature": 0.7, "max_tokens": 64, "seed": 3, "extra_body": {"top_k": 20}}
    assert local.client_args["base_url"] == "http://127.0.0.1:9/v1" and local.get_config()["params"] == params
    hosted = build_strands_model(parse_provider("openai:gpt-4o-mini"))
    assert hosted.client_args["api_key"] == "real-openai-key" and "base_url" not in hosted.client_args
    assert hosted.get_config()["params"] == {}  # provider defaults: nothing a reasoning model would refuse
    bedrock = build_strands_model(parse_provider("bedrock:anthropic.claude-x@eu-west-1"),
                                  sampling=SamplingParams(top_p=0.9, max_tokens_per_call=100))  # fmt: skip
    config = bedrock.get_config()
    assert config["model_id"] == "anthropic.claude-x" and config["top_p"] == 0.9 and config["max_tokens"] == 100
    assert "temperature" not in config and bedrock.client.meta.region_name == "eu-west-1"
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        build_strands_model(parse_provider("openai:gpt-4o-mini"))


def _eval(out: Path, server: FakeOpenAIChatServer, *extra: str) -> int:
    return cli(["eval", "--example", "capitals", "--limit", "4", "--n", "2", "--workers", "0", "--no-plots",
                "--out", str(out), "--strands-model", f"openai:{server.model}@{server.base_url}", *extra])  # fmt: skip


def test_eval_through_a_strands_openai_model_is_scored_marked_and_masked(tmp_path, chat_server, capsys) -> None:
    out = tmp_path / "frontier"
    assert _eval(out, chat_server) == 0, capsys.readouterr().err[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["token_exact"] is False and report["not_token_exact_episodes"] == 8
    assert report["pass_at_k"]["1"] == 1.0 and report["summary"]["reward_mean"] == 1.0
    assert report["summary"]["masked"] == 8 and report["summary"]["turns_mean"] == 2.0
    assert (
        report["tool_outcomes"]["country_facts"]["calls"] == 8 and report["tool_outcomes"]["country_facts"]["ok"] == 8
    )
    assert report["models"] == [f"openai:frontier@{chat_server.base_url}"]
    markdown = (out / "report.md").read_text()
    assert f"**{NOT_TOKEN_EXACT}.**" in markdown.splitlines()[2] and "| country_facts | 8 | 8 |" in markdown
    episodes = [Episode.from_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    for e in episodes:  # no tokens, never trainable, whatever the reward
        assert e.masked and e.reward == 1.0 and not e.segments and not e.calls and e.response_mask == []
        assert e.metadata["token_exact"] is False and e.metadata["not_training_data"] == NOT_TOKEN_EXACT
        assert [c["stop_reason"] for c in e.metadata["provider_calls"]] == ["tool_use", "end_turn"]
        assert e.metadata["evaluations"] and e.metadata["template"].startswith("none")
    # the task's system prompt and tools reached the provider as a chat request
    first = chat_server.requests[0]
    assert first["messages"][0]["role"] == "system" and "country_facts" in first["messages"][0]["content"]
    assert first["tools"][0]["function"]["name"] == "country_facts" and "temperature" not in first
    # the model is what is evaluated; where it is served may change on resume (the key is never stored)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["backend"] == "strands:openai:frontier"
    assert manifest["where"]["backend"] == chat_server.base_url and "api_key" not in manifest["model"]
    assert _eval(out, chat_server) == 0 and len(chat_server.requests) == 16  # resumed: nothing re-run


def test_no_trainer_can_use_provider_episodes(tmp_path, chat_server) -> None:
    from agentboost.batch import episodes_to_batch

    episode = _run_one(chat_server)
    assert episode.reward == 1.0
    batch = episodes_to_batch([episode, episode], pad_token_id=0)
    assert batch.response_mask.sum().item() == 0 and batch.token_level_scores.sum().item() == 0.0
    assert batch.masked == [True, True]


def _run_one(server: FakeOpenAIChatServer, **budget: Any) -> Episode:
    from agentboost.environments.capitals_env import make_tasks

    spec = expand(make_tasks(1, seed=5), AgentSpec(env="agentboost.environments.capitals_env:CapitalsEnv",
                                                  system_prompt="Answer."),
                  ModelSpec(backend=f"strands:openai:{server.model}@{server.base_url}"),
                  RolloutSettings(budget=Budget(**budget)))[0]  # fmt: skip
    return asyncio.run(run_spec(spec))


def test_termination_rule_and_tool_hooks_apply_to_provider_episodes(chat_server) -> None:
    def always_tool(body: dict[str, Any]) -> ChatReply:
        return ChatReply(tool_calls=[{"name": "country_facts", "arguments": {"country": "Peru"}}])

    chat_server.responder = always_tool  # the turn limit: the last allowed call's tools are not executed
    cut = _run_one(chat_server, max_turns=2)
    assert cut.termination is Termination.MAX_TURNS and cut.reward == 0.0 and cut.masked
    assert cut.tools["country_facts"].calls == 1 and "not executed" in json.dumps(cut.messages[-1])

    chat_server.responder = lambda body: ChatReply(tool_calls=[{"name": "no_such_tool", "arguments": {}}])
    bad = _run_one(chat_server, max_tool_errors=0)
    assert bad.termination is Termination.TOOL_ERROR and bad.unknown_tool_calls == 1

    chat_server.responder = lambda body: ChatReply(content="The capital is", finish_reason="length")
    long = _run_one(chat_server)
    assert long.termination is Termination.MAX_TOKENS and long.reward == 0.0

    chat_server.responder = lambda body: ChatReply(content="Lima", prompt_tokens=5000, completion_tokens=10,
                                                   tool_calls=[{"name": "country_facts", "arguments": {}}])  # fmt: skip
    budget = _run_one(chat_server, max_total_tokens=4096)  # the provider's usage counts against the budget
    assert budget.termination is Termination.MAX_TOKENS and "provider reported" in budget.termination_detail

    chat_server.responder = frontier
    chat_server.delay_s = 3.0  # the wall clock runs out while the provider answers: not the policy's doing
    slow = _run_one(chat_server, wall_clock_s=1.0)
    assert slow.termination is Termination.INFRA_ERROR and slow.masked


def test_provider_errors_are_infra_errors_and_the_key_comes_from_a_variable(tmp_path, monkeypatch, capsys) -> None:
    with FakeOpenAIChatServer(frontier, model="frontier", api_key="sekret") as server:
        refused = _run_one(server)
        assert refused.termination is Termination.INFRA_ERROR and "401" in refused.termination_detail
        assert refused.metadata["token_exact"] is False and refused.masked
        monkeypatch.setenv("AGENTBOOST_TEST_PROVIDER_KEY", "sekret")
        out = tmp_path / "keyed"
        assert _eval(out, server, "--api-key-env", "AGENTBOOST_TEST_PROVIDER_KEY") == 0, capsys.readouterr().err
        assert "sekret" not in (out / "manifest.json").read_text() + (out / "episodes.jsonl").read_text()


def test_token_backend_options_are_refused_with_a_strands_model(tmp_path, capsys, monkeypatch) -> None:
    code = cli(["eval", "--example", "capitals", "--strands-model", "openai:m@http://127.0.0.1:9/v1",
                "--tokenizer", "offline:qwen2.5", "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--strands-model replaces the token backend: drop --tokenizer" in err
    assert cli(["eval", "--example", "capitals", "--strands-model", "claude", "--out", str(tmp_path / "o")]) == 2
    assert "invalid Strands model" in capsys.readouterr().err
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert cli(["eval", "--example", "capitals", "--strands-model", "openai:gpt-4o", "--out", str(tmp_path / "o")]) == 2
    assert "needs OPENAI_API_KEY" in capsys.readouterr().err
    assert cli(["rollout", "--strands-model", "py:no_such_module:f", "--out", str(tmp_path / "r")]) == 2
    assert "no_such_module" in capsys.readouterr().err


def test_rollout_through_the_worker_pool_marks_its_summary(tmp_path, chat_server, capsys) -> None:
    out = tmp_path / "rollout"
    code = cli(["rollout", "--env", "agentboost.environments.capitals_env:CapitalsEnv", "--data",
                str(_capitals_data(tmp_path)), "--workers", "1", "--out", str(out),
                "--strands-model", f"openai:frontier@{chat_server.base_url}"])  # fmt: skip
    assert code == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["token_exact"] is False and summary["masked"] == 3 and summary["reward_mean"] == 1.0
    assert summary["turns_mean"] == 2.0
    assert (out / "summary.md").read_text().startswith(f"**{NOT_TOKEN_EXACT}**")
    assert all(json.loads(line)["metadata"]["token_exact"] is False
               for line in (out / "episodes.jsonl").read_text().splitlines())  # fmt: skip


def _capitals_data(tmp_path: Path) -> Path:
    from agentboost.environments.capitals_env import make_tasks

    path = tmp_path / "capitals.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in make_tasks(3, seed=1)))
    return path


def test_compare_two_runs_side_by_side(tmp_path, chat_server, capsys) -> None:
    a, b, out = tmp_path / "frontier", tmp_path / "guesser", tmp_path / "cmp"
    assert _eval(a, chat_server) == 0
    with FakeOpenAIChatServer(guesser, model="guesser") as weak:
        assert _eval(b, weak) == 0
    assert cli(["eval", "--compare", str(a), str(b), "--out", str(out)]) == 0, capsys.readouterr().err[-2000:]
    data = json.loads((out / "compare.json").read_text())
    metrics = {row["metric"]: row for row in data["metrics"]}
    assert data["common_tasks"] == 4 and data["ks"] == [1, 2]
    assert metrics["pass@1"]["a"] == 1.0 and metrics["pass@1"]["delta"] == metrics["pass@1"]["b"] - 1.0
    assert metrics["tool calls / episode"]["a"] == 1.0 and metrics["tool calls / episode"]["b"] == 0.0
    assert data["task_outcomes"]["only_b"] == 0 and data["task_outcomes"]["both"] + data["task_outcomes"]["only_a"] == 4
    assert all(not run["token_exact"] for run in data["runs"])
    markdown = (out / "compare.md").read_text()
    assert markdown.startswith("# frontier vs guesser") and markdown.count(NOT_TOKEN_EXACT) == 2
    assert "| pass@1 | 1.0000 |" in markdown and "| country_facts | 1.00 | 0.00 |" in markdown
    assert (out / "compare.png").stat().st_size > 0
    missing = cli(["eval", "--compare", str(a), str(tmp_path / "nothing")])
    assert missing == 2 and "no episodes.jsonl" in capsys.readouterr().err


def test_compare_marks_only_the_provider_run(tmp_path) -> None:
    def run(directory: Path, provider: bool, rewards: list[float]) -> None:
        directory.mkdir()
        lines = []
        for i, reward in enumerate(rewards):
            e = Episode(id=f"t{i}:0", task_id=f"t{i}", termination=Termination.COMPLETED, reward=reward)
            e.metadata["backend"] = "VLLMCompletionsBackend"
            if provider:
                e.metadata.update({"token_exact": False, "strands_model": "openai:gpt-x"})
                e.masked = True
            lines.append(e.to_json())
        (directory / "episodes.jsonl").write_text("\n".join(lines) + "\n" + '{"torn')

    run(tmp_path / "policy", False, [1.0, 0.0, 0.0])
    run(tmp_path / "frontier", True, [1.0, 1.0])
    comparison = compare_runs(tmp_path / "policy", tmp_path / "frontier")
    text = comparison.to_markdown()
    assert comparison.data["common_tasks"] == 2 and comparison.data["only_in_counts"]["policy"] == 1
    assert text.count(NOT_TOKEN_EXACT) == 1 and "openai:gpt-x" in text and "1 tasks only in policy" in text
    assert {row["metric"]: row["b"] for row in comparison.data["metrics"]}["pass@1"] == 1.0
    assert [t["task_id"] for t in comparison.data["per_task"]] == ["t1"]


def test_py_factory_provider(tmp_path, chat_server, monkeypatch) -> None:
    monkeypatch.setenv("AGENTBOOST_TEST_CHAT_URL", chat_server.base_url)
    episode = asyncio.run(run_spec(expand(
        [{"prompt": "What is the capital of Chile?", "task_id": "c", "answer": "Santiago",
          "expected_environment_state": {"looked_up": ["Chile"]}}],
        AgentSpec(env="agentboost.environments.capitals_env:CapitalsEnv", system_prompt="Answer."),
        ModelSpec(backend="strands:py:tests.test_strands_provider:make_model"), RolloutSettings(),
    )[0]))  # fmt: skip
    assert episode.termination is Termination.COMPLETED and episode.final_text == "The capital is Santiago."
    assert episode.reward_metrics["answer"] == 1.0
    assert episode.metadata["strands_model"] == "py:tests.test_strands_provider:make_model"


def make_model(*, sampling: Any) -> Any:
    from strands.models.openai import OpenAIModel

    return OpenAIModel(client_args={"base_url": os.environ["AGENTBOOST_TEST_CHAT_URL"], "api_key": "x"},
                       model_id="frontier", params={"temperature": sampling.temperature})  # fmt: skip
