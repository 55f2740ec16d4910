"""strands-agents-evals evaluators as rewards: evaluation data from episodes, LLM judges behind a fake
OpenAI-compatible endpoint (cached, coalesced, bounded), judge failures masked as infra errors."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

pytest.importorskip("strands_evals")

from strands_evals.evaluators import (
    Contains,
    CorrectnessEvaluator,
    Equals,
    OutputEvaluator,
    StateEquals,
    ToolCalled,
    TrajectoryEvaluator,
)

from agentboost.backends.factory import ModelSpec
from agentboost.environments.capitals_env import CapitalsEnv, make_tasks
from agentboost.episode import Episode
from agentboost.rewards.strands_evals import (
    EvaluatorReward,
    JudgeError,
    clear_cache,
    episode_session,
    judge_model,
    tool_names,
)
from agentboost.rollout import RolloutSettings
from agentboost.runs import AgentSpec, expand, run_spec
from agentboost.testing.fake_openai_chat import ChatReply, FakeOpenAIChatServer, last_user_text, tool_results
from agentboost.types import Budget, Termination


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    clear_cache()


def _episode(answer: str = "The capital of France is Paris.", *, termination: Termination = Termination.COMPLETED,
             error: bool = False, followup: bool = False) -> Episode:  # fmt: skip
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"text": "What is the capital of France?"}]},
        {"role": "assistant", "content": [{"text": "Let me look."},
                                          {"toolUse": {"toolUseId": "c1", "name": "country_facts",
                                                       "input": {"country": "France"}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "c1", "status": "error" if error else "success",
                                                     "content": [{"text": "France: capital Paris."}]}}]},
        {"role": "assistant", "content": [{"text": answer}]},
    ]  # fmt: skip
    if followup:
        messages += [{"role": "user", "content": [{"text": "And its continent?"}]},
                     {"role": "assistant", "content": [{"text": "Europe."}]}]  # fmt: skip
    episode = Episode(id="t:0", task_id="t", messages=messages, termination=termination)
    episode.metadata["environment_state"] = {"looked_up": ["France"]}
    return episode


TASK = {"prompt": "What is the capital of France?", "answer": "Paris",
        "expected_environment_state": {"looked_up": ["France"]}}  # fmt: skip


def _score(reward: EvaluatorReward, episode: Episode, task: dict[str, Any] = TASK, **kw: Any) -> Any:
    return asyncio.run(reward.score(task, episode, **kw))


# -- deterministic evaluators ---------------------------------------------------------------------
def test_deterministic_evaluators_read_output_trajectory_and_state_from_the_episode() -> None:
    reward = EvaluatorReward([Contains("paris", case_sensitive=False, name="answer"), ToolCalled("country_facts"),
                              StateEquals("looked_up"), Equals(name="exact")])  # fmt: skip
    good = _episode()
    out = _score(reward, good)
    assert out.metrics["answer"] == 1.0 and out.metrics["ToolCalled"] == 1.0 and out.metrics["looked_up"] == 1.0
    assert out.metrics["exact"] == 0.0  # Equals compares the whole answer with task["answer"]
    assert out.reward == pytest.approx(0.75) and out.is_correct is False
    assert [e["evaluator"] for e in good.metadata["evaluations"]] == ["answer", "ToolCalled", "looked_up", "exact"]
    assert "does not match" in good.metadata["evaluations"][3]["reason"]

    exact = _score(EvaluatorReward([Equals()]), _episode("Paris"))
    assert exact.reward == 1.0 and exact.is_correct is True
    wrong = _episode("Lyon")
    wrong.metadata["environment_state"] = {"looked_up": ["France", "Spain"]}
    out = _score(reward, wrong)
    assert out.metrics["answer"] == 0.0 and out.metrics["looked_up"] == 0.0 and out.metrics["ToolCalled"] == 1.0
    # weights by evaluator name; the environment may pass its state itself
    weighted = EvaluatorReward([Contains("Paris", name="answer"), ToolCalled("country_facts")],
                               weights={"answer": 3.0, "ToolCalled": 1.0})  # fmt: skip
    assert _score(weighted, _episode("Lyon")).reward == pytest.approx(0.25)
    state = EvaluatorReward([StateEquals("looked_up")])
    assert _score(state, _episode(), environment_state={"looked_up": []}).reward == 0


def test_per_task_evaluators_and_unfinished_episodes_score_zero_without_evaluating() -> None:
    calls: list[str] = []

    class Spy(Contains):
        def evaluate(self, evaluation_case: Any) -> Any:
            calls.append(str(evaluation_case.actual_output))
            return super().evaluate(evaluation_case)

    reward = EvaluatorReward(lambda task: [Spy(task["answer"])])
    assert _score(reward, _episode()).reward == 1.0 and calls == ["The capital of France is Paris."]
    cut = _episode(termination=Termination.MAX_TURNS)
    out = _score(reward, cut)
    assert out.reward == 0.0 and out.is_correct is False and len(calls) == 1 and cut.metadata["evaluations"] == []


def test_misconfigured_evaluator_is_a_judge_error_not_a_zero() -> None:
    reward = EvaluatorReward([StateEquals("balance")])  # no expected value anywhere: strands-evals raises
    with pytest.raises(JudgeError, match="balance"):
        _score(reward, _episode(), task={"prompt": "x"}, environment_state={"balance": 3})


def test_trajectory_forms_session_for_traced_evaluators_tool_names_otherwise() -> None:
    episode = _episode(error=True, followup=True)
    assert tool_names(episode.messages) == ["country_facts"]
    session = episode_session(episode)
    assert [len(t.spans) for t in session.traces] == [2, 1]
    agent, tool = session.traces[0].spans
    assert agent.user_prompt == "What is the capital of France?" and agent.agent_response.endswith("Paris.")
    assert tool.tool_call.name == "country_facts" and tool.tool_call.arguments == {"country": "France"}
    assert tool.tool_result.error == "France: capital Paris." and tool.agent_span_id == agent.span_info.span_id
    assert session.traces[1].spans[0].user_prompt == "And its continent?"
    assert episode_session(episode) == session  # deterministic: the same trajectory hits the same cache entry
    # the library's own extractor reads it: two turns, the tool execution in the first turn's history
    from strands_evals.extractors import TraceExtractor
    from strands_evals.types.trace import EvaluationLevel

    turns = TraceExtractor(EvaluationLevel.TRACE_LEVEL).extract(session)
    assert [t.agent_response.text for t in turns] == ["The capital of France is Paris.", "Europe."]
    assert any(isinstance(h, list) and h[0].tool_call.name == "country_facts" for h in turns[0].session_history)


# -- LLM judges against a fake OpenAI-compatible endpoint -------------------------------------------
def _tag(text: str, name: str) -> str | None:
    found = re.search(rf"<{name}>(.*?)</{name}>", text, re.DOTALL)
    return found.group(1) if found else None


def judge_responder(body: dict[str, Any]) -> ChatReply:
    """A judge: answers through the structured-output tool it is offered, by substring match."""
    tool = body["tools"][0]["function"]["name"]
    prompt = last_user_text(body)
    if tool == "EvaluationOutput":
        output, expected = _tag(prompt, "Output") or "", _tag(prompt, "ExpectedOutput") or ""
        ok = bool(expected) and expected.lower() in output.lower()
        arguments = {"score": 1.0 if ok else 0.0, "test_pass": ok, "reason": f"expected {expected!r}"}
    elif tool == "CorrectnessReferenceRating":
        response = prompt.split("AGENT RESPONSE:")[1].split("EXPECTED RESPONSE:")[0]
        expected = prompt.split("EXPECTED RESPONSE:")[1].strip()
        arguments = {"reasoning": "compared", "verdict": "CORRECT" if expected in response else "INCORRECT"}
    else:
        raise AssertionError(f"unexpected structured output tool {tool}")
    return ChatReply(tool_calls=[{"name": tool, "arguments": arguments}])


@pytest.fixture
def judge_server():
    with FakeOpenAIChatServer(judge_responder, model="judge") as server:
        yield server


def test_llm_judge_verdicts_are_cached_and_identical_requests_share_one_call(judge_server) -> None:
    model = judge_model(f"openai:judge@{judge_server.base_url}", timeout_s=10)
    reward = EvaluatorReward(lambda task: [OutputEvaluator("names the capital", model=model, name="judge"),
                                           Contains(task["answer"])])  # fmt: skip
    first = _score(reward, _episode())
    assert first.metrics["judge"] == 1.0 and first.metrics["judge_cache_hits"] == 0.0
    assert len(judge_server.requests) == 1 and "Paris" in last_user_text(judge_server.requests[0])
    assert judge_server.requests[0]["temperature"] == 0.0  # the judge samples greedily
    again = _score(reward, _episode())  # same input: same verdict, no second call
    assert again.metrics["judge"] == 1.0 and again.metrics["judge_cache_hits"] == 1.0
    assert len(judge_server.requests) == 1
    assert _score(reward, _episode("Lyon")).metrics["judge"] == 0.0 and len(judge_server.requests) == 2

    judge_server.delay_s = 0.3  # eight identical requests at once (a GRPO group): one judge call

    async def group() -> list[Any]:
        return await asyncio.gather(*(reward.score(TASK, _episode("It is Paris!")) for _ in range(8)))

    outs = asyncio.run(group())
    assert len(judge_server.requests) == 3 and all(o.metrics["judge"] == 1.0 for o in outs)
    assert sum(o.metrics["judge_cache_hits"] for o in outs) == 7


def test_llm_judges_run_concurrently_up_to_the_limit(judge_server) -> None:
    model = judge_model(f"openai:judge@{judge_server.base_url}", timeout_s=10)
    reward = EvaluatorReward([OutputEvaluator("names the capital", model=model)], max_concurrency=2)
    judge_server.delay_s = 0.3

    async def many() -> list[Any]:
        return await asyncio.gather(*(reward.score(TASK, _episode(f"Paris, answer {i}")) for i in range(6)))

    outs = asyncio.run(many())
    assert len(judge_server.requests) == 6 and all(o.reward == 1.0 for o in outs)
    assert judge_server.max_in_flight == 2


def test_trace_level_judge_reads_the_rebuilt_session(judge_server) -> None:
    model = judge_model(f"openai:judge@{judge_server.base_url}", timeout_s=10)
    reward = EvaluatorReward([CorrectnessEvaluator(model=model)])
    task = {**TASK, "expected_assertion": "Paris"}
    assert _score(reward, _episode(), task=task).reward == 1.0
    prompt = last_user_text(judge_server.requests[-1])
    assert "USER QUERY:\nWhat is the capital of France?" in prompt and "AGENT RESPONSE:\nThe capital" in prompt
    assert _score(reward, _episode("Lyon"), task=task).reward == 0.0


def test_trajectory_judge_sees_tool_names(judge_server) -> None:
    seen: list[str] = []

    def responder(body: dict[str, Any]) -> ChatReply:
        seen.append(last_user_text(body))
        return ChatReply(tool_calls=[{"name": body["tools"][-1]["function"]["name"],
                                      "arguments": {"score": 1.0, "test_pass": True, "reason": "ok"}}])  # fmt: skip

    judge_server.responder = responder
    model = judge_model(f"openai:judge@{judge_server.base_url}", timeout_s=10)
    reward = EvaluatorReward([TrajectoryEvaluator("used the lookup tool", model=model)])
    assert _score(reward, _episode(), task={**TASK, "expected_trajectory": ["country_facts"]}).reward == 1.0
    assert "<Trajectory>['country_facts']</Trajectory>" in seen[0]


def test_judge_failures_and_timeouts_raise_and_are_not_cached(judge_server) -> None:
    model = judge_model(f"openai:judge@{judge_server.base_url}", timeout_s=5)
    reward = EvaluatorReward([OutputEvaluator("names the capital", model=model)], timeout_s=1.0)
    judge_server.fail_next = [400]  # not retried by the client
    with pytest.raises(JudgeError, match="OutputEvaluator failed"):
        _score(reward, _episode())
    judge_server.delay_s = 2.0
    with pytest.raises(JudgeError, match="timed out after 1s"):
        _score(reward, _episode())
    judge_server.delay_s = 0.0
    before = len(judge_server.requests)
    assert _score(reward, _episode()).reward == 1.0 and len(judge_server.requests) == before + 1  # not cached


def _capitals_episode(server: FakeOpenAIChatServer, **env_args: Any) -> Episode:
    """One capitals episode played by a scripted chat model that looks the country up and answers."""
    task = make_tasks(1, seed=3)[0]
    spec = expand([task], AgentSpec(env="agentboost.environments.capitals_env:CapitalsEnv", env_args=env_args,
                                    system_prompt="Answer."),
                  ModelSpec(backend=f"strands:openai:policy@{server.base_url}"),
                  RolloutSettings(budget=Budget(reward_timeout_s=20)))[0]  # fmt: skip
    return asyncio.run(run_spec(spec))


def policy_responder(body: dict[str, Any]) -> ChatReply:
    results = tool_results(body)
    if not results:
        country = last_user_text(body).removeprefix("What is the capital of ").rstrip("?")
        return ChatReply(tool_calls=[{"name": "country_facts", "arguments": {"country": country}}])
    capital = results[-1].split("capital ")[1].split(";")[0]
    return ChatReply(content=f"The capital is {capital}.")


def test_capitals_env_judge_failure_masks_the_episode_as_infra_error(judge_server) -> None:
    with FakeOpenAIChatServer(policy_responder, model="policy") as policy:
        ok = _capitals_episode(policy, judge=f"openai:judge@{judge_server.base_url}")
        assert ok.termination is Termination.COMPLETED and ok.reward == 1.0 and ok.is_correct is True
        assert {e["evaluator"] for e in ok.metadata["evaluations"]} == {"answer", "used_tool", "looked_up", "judge"}
        assert ok.metadata["environment_state"]["looked_up"] == [make_tasks(1, seed=3)[0]["country"]]
        assert len(judge_server.requests) == 1
        clear_cache()
        judge_server.fail_next = [401]
        failed = _capitals_episode(policy, judge=f"openai:judge@{judge_server.base_url}")
    assert failed.termination is Termination.INFRA_ERROR and failed.masked and failed.reward == 0.0
    assert "reward function failed: JudgeError" in failed.termination_detail


def test_judge_model_needs_its_key_variable_set(monkeypatch) -> None:
    monkeypatch.delenv("AGENTBOOST_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="AGENTBOOST_TEST_JUDGE_KEY"):
        judge_model("openai:judge@http://127.0.0.1:9/v1", api_key_env="AGENTBOOST_TEST_JUDGE_KEY")
    monkeypatch.setenv("AGENTBOOST_TEST_JUDGE_KEY", "k")
    model = judge_model("openai:judge@http://127.0.0.1:9/v1", api_key_env="AGENTBOOST_TEST_JUDGE_KEY")
    assert model.client_args["api_key"] == "k" and model.get_config()["params"]["temperature"] == 0.0


def test_capitals_env_builds_fresh_tools_and_records_state() -> None:
    env = CapitalsEnv.from_dict(make_tasks(1)[0])
    env.reset()
    (tool,) = env.tools
    assert "capital" in tool(country="japan") and env.environment_state() == {"looked_up": ["japan"]}
    env.reset()
    assert env.environment_state() == {"looked_up": []}
