"""strands-agents-evals evaluators as rewards: any ``Evaluator`` scores a finished episode.

Users who already evaluate their Strands agents with strands-agents-evals (1.7) keep their
evaluators: :class:`EvaluatorReward` turns a list of them into a ``reward_fn(task, episode)`` of a
:class:`~agentboost.environments.strands_env.StrandsEnv`. It builds each evaluator's
``EvaluationData`` from the episode:

* ``input``: the episode's first user message; ``actual_output``: the final answer
  (:func:`~agentboost.rewards.answer.final_answer_text`, reasoning removed);
* ``actual_trajectory``: for evaluators that read traces (``evaluation_level`` set: trace-, tool- and
  session-level LLM judges) a strands-evals ``Session`` rebuilt from the messages (one trace per user
  turn, one tool span per call with its result and error), else the names of the tools called in
  order (what ``ToolCalled`` and ``TrajectoryEvaluator`` read);
* ``actual_environment_state``: ``episode.metadata["environment_state"]`` (``{name: value}``, recorded
  by the environment) or what the environment passes to :meth:`EvaluatorReward.score`;
* from the task: ``expected_output`` (``expected_output_key``, default ``answer``),
  ``expected_assertion``, ``expected_trajectory``, ``expected_environment_state`` (``{name: value}``).

The reward is the weighted mean of the evaluators' aggregate scores (each evaluator's own
aggregator, as strands-evals' ``Experiment`` computes it); the episode is correct when every
evaluator passes; each score, pass and reason is kept (``reward_metrics``, ``metadata["evaluations"]``).
As agentboost's own rewards do, an episode the agent did not finish (``termination != completed``)
scores 0 without asking any evaluator (``only_completed``).

LLM judges (evaluators with a ``model``; point them at an OpenAI-compatible endpoint with
:func:`judge_model`):

* **cached**: the same evaluator on the same input gives the same verdict without a second call (a
  process-wide LRU; GRPO groups repeat answers), and identical requests in flight at once share one
  call;
* **batched as far as the library allows**: strands-evals 1.7 judges one case per call (no batch API;
  its ``Experiment`` only runs cases concurrently), so concurrent episodes' judge calls run together,
  at most ``max_concurrency`` per judge endpoint;
* **bounded**: each evaluation has a timeout (``timeout_s``; keep it under the runner's
  ``Budget.reward_timeout_s``) on top of the client's own request timeout;
* **failures are infrastructure errors, never zeros**: an evaluator that raises, times out or returns a
  non-finite score raises :class:`JudgeError`, so the runner masks the episode as ``infra_error``
  (strands-evals' ``Experiment`` would record such a failure as a score of 0, which would train the
  policy on the judge's outages). Verdicts are never cached from failures.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from ..episode import Episode
from ..errors import AgentboostError
from ..types import RewardOutput, Termination
from .answer import final_answer_text

logger = logging.getLogger(__name__)

CACHE_SIZE = 4096
"""Judge verdicts kept per process (least recently used first out)."""
MAX_REASON_CHARS = 1000
_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
"""Spans get synthetic, deterministic times (the episode records order, not wall time), so the same
trajectory always builds the same Session and hits the same cache entry."""
_SESSION_ID = "agentboost-episode"

Evaluators = Sequence[Any] | Callable[[dict[str, Any]], Sequence[Any]]


class JudgeError(AgentboostError):
    """An evaluator failed (raised, timed out, gave no usable score): the episode is an ``infra_error``."""


class EvaluatorReward:
    """strands-agents-evals evaluators as a reward function (see module doc).

    Args:
        evaluators: ``Evaluator`` instances, or ``factory(task) -> evaluators`` for per-task ones
            (``lambda task: [Contains(task["answer"])]``).
        weights: weight per evaluator name (``evaluator.get_name()``; default 1 each).
        expected_output_key: task field holding ``expected_output``.
        only_completed: score 0 without evaluating when the agent did not finish the episode itself.
        timeout_s: per evaluation (an LLM judge may make several calls in one).
        cache: cache verdicts; ``None``: LLM judges only (evaluators with a ``model`` attribute).
        max_concurrency: judge calls in flight at once per judge endpoint (per process).
    """

    def __init__(
        self,
        evaluators: Evaluators,
        *,
        weights: Mapping[str, float] | None = None,
        expected_output_key: str = "answer",
        only_completed: bool = True,
        timeout_s: float = 30.0,
        cache: bool | None = None,
        max_concurrency: int = 16,
    ) -> None:
        if timeout_s <= 0 or max_concurrency < 1:
            raise ValueError("timeout_s must be positive and max_concurrency >= 1")
        self.evaluators = evaluators
        self.weights = dict(weights or {})
        self.expected_output_key = expected_output_key
        self.only_completed = only_completed
        self.timeout_s = timeout_s
        self.cache = cache
        self.max_concurrency = max_concurrency

    async def __call__(self, task: dict[str, Any], episode: Episode) -> RewardOutput:
        return await self.score(task, episode)

    async def score(
        self,
        task: dict[str, Any],
        episode: Episode,
        *,
        tools: Sequence[Any] | None = None,
        environment_state: Mapping[str, Any] | None = None,
    ) -> RewardOutput:
        """Score ``episode``. Environments that know more pass it: ``tools`` (the agent's tools, for the
        judges' tool lists) and ``environment_state`` (default: ``episode.metadata["environment_state"]``)."""
        evaluators = list(self.evaluators(task) if callable(self.evaluators) else self.evaluators)
        if not evaluators:
            raise JudgeError("no evaluators to score the episode with")
        names = _unique_names(evaluators)
        if self.only_completed and episode.termination is not Termination.COMPLETED:
            episode.metadata["evaluations"] = []
            metrics = {name: 0.0 for name in names}
            return RewardOutput(0.0, metrics=metrics, is_correct=False)
        if environment_state is None:
            environment_state = episode.metadata.get("environment_state")
        data = _DataBuilder(task, episode, self.expected_output_key, tools, environment_state)
        results = await asyncio.gather(
            *(self._evaluate(evaluator, name, data) for evaluator, name in zip(evaluators, names, strict=True))
        )
        total_weight = sum(self.weights.get(name, 1.0) for name in names)
        if total_weight <= 0:
            raise JudgeError(f"the evaluator weights sum to {total_weight}")
        reward = sum(self.weights.get(name, 1.0) * r["score"] for name, r in zip(names, results, strict=True))
        metrics: dict[str, float] = {}
        for name, result in zip(names, results, strict=True):
            metrics[name] = result["score"]
            metrics[f"{name}/pass"] = float(result["pass"])
        metrics["judge_cache_hits"] = float(sum(r["cached"] for r in results))
        episode.metadata["evaluations"] = results
        return RewardOutput(
            reward / total_weight,
            metrics=metrics,
            is_correct=all(r["pass"] for r in results),
            info={"reasons": {name: r["reason"] for name, r in zip(names, results, strict=True)}},
        )

    # -- one evaluator ----------------------------------------------------------------------
    async def _evaluate(self, evaluator: Any, name: str, data: _DataBuilder) -> dict[str, Any]:
        case = data.for_evaluator(evaluator)
        use_cache = self.cache if self.cache is not None else _is_judge(evaluator)
        key = _cache_key(evaluator, case) if use_cache else None
        outputs, cached = await self._outputs(evaluator, name, case, key)
        try:
            score, passed, reason = evaluator.aggregator(outputs)
            score = float(score)
        except Exception as exc:
            raise JudgeError(f"evaluator {name}: cannot aggregate its outputs: {type(exc).__name__}: {exc}") from exc
        if not math.isfinite(score):
            raise JudgeError(f"evaluator {name} gave a non-finite score {score!r}")
        return {"evaluator": name, "score": score, "pass": bool(passed),
                "reason": str(reason or "")[:MAX_REASON_CHARS], "cached": cached}  # fmt: skip

    async def _outputs(self, evaluator: Any, name: str, case: Any, key: str | None) -> tuple[list[Any], bool]:
        if key is None:
            return await self._call(evaluator, name, case), False
        hit = _CACHE.get(key)
        if hit is not None:
            return hit, True
        loop = asyncio.get_running_loop()
        pending = _IN_FLIGHT.setdefault(loop, {})
        leader = pending.get(key)
        if leader is not None:  # the same request is being judged right now: share its verdict
            return list(await asyncio.shield(leader)), True
        future: asyncio.Future[list[Any]] = loop.create_future()
        future.add_done_callback(_retrieve)
        pending[key] = future
        try:
            outputs = await self._call(evaluator, name, case)
        except asyncio.CancelledError:
            future.set_exception(JudgeError(f"evaluator {name}: the shared judge call was cancelled"))
            raise
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            pending.pop(key, None)
        _CACHE.put(key, outputs)
        future.set_result(outputs)
        return outputs, False

    async def _call(self, evaluator: Any, name: str, case: Any) -> list[Any]:
        gate = _gate(_judge_fingerprint(evaluator), self.max_concurrency) if _is_judge(evaluator) else None
        try:
            if gate is None:
                outputs = await asyncio.wait_for(evaluator.evaluate_async(case), timeout=self.timeout_s)
            else:
                async with gate:
                    outputs = await asyncio.wait_for(evaluator.evaluate_async(case), timeout=self.timeout_s)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, asyncio.TimeoutError):
            raise JudgeError(f"evaluator {name} timed out after {self.timeout_s:g}s") from None
        except Exception as exc:
            raise JudgeError(f"evaluator {name} failed: {type(exc).__name__}: {_short(exc)}") from exc
        if not isinstance(outputs, list):
            raise JudgeError(f"evaluator {name} returned {type(outputs).__name__}, not a list of EvaluationOutput")
        return outputs


def judge_model(
    spec: str,
    *,
    api_key: str | None = None,
    api_key_env: str | None = None,
    timeout_s: float = 30.0,
    temperature: float = 0.0,
    max_tokens: int = 1024,
) -> Any:
    """A Strands model for an LLM judge: ``openai:<model>@<base_url>`` (any OpenAI-compatible chat
    endpoint), ``bedrock:<model-id>`` or ``py:<module>:<factory>`` (as ``--strands-model``).

    The key comes from ``api_key`` or the variable ``api_key_env`` (never stored); each request is
    bounded by ``timeout_s`` with one retry."""
    from ..backends.strands_provider import build_strands_model, parse_provider
    from ..types import SamplingParams

    if api_key is None and api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"judge API key variable {api_key_env} is not set")
    sampling = SamplingParams(temperature=temperature, max_tokens_per_call=max_tokens)
    return build_strands_model(
        parse_provider(spec), sampling=sampling, api_key=api_key, request_timeout_s=timeout_s, max_retries=1
    )


# -- evaluation data from an episode ---------------------------------------------------------------
class _DataBuilder:
    """The ``EvaluationData`` of one episode, in the two trajectory forms evaluators read."""

    def __init__(
        self,
        task: dict[str, Any],
        episode: Episode,
        expected_output_key: str,
        tools: Sequence[Any] | None,
        environment_state: Mapping[str, Any] | None,
    ) -> None:
        self.task = task
        self.episode = episode
        self.expected_output_key = expected_output_key
        self.tools = tools
        self.environment_state = environment_state
        self._built: dict[bool, Any] = {}

    def for_evaluator(self, evaluator: Any) -> Any:
        traced = getattr(evaluator, "evaluation_level", None) is not None
        if traced not in self._built:
            self._built[traced] = self._build(traced)
        return self._built[traced]

    def _build(self, traced: bool) -> Any:
        from strands_evals.types.evaluation import EvaluationData

        episode, task = self.episode, self.task
        history = episode.transcript()  # the whole conversation, also where a window trimmed it
        trajectory: Any = episode_session(episode, self.tools) if traced else tool_names(history)
        return EvaluationData(
            input=_first_user_text(history) or _task_prompt(task),
            actual_output=final_answer_text(episode),
            name=episode.task_id,
            expected_output=task.get(self.expected_output_key),
            expected_assertion=task.get("expected_assertion"),
            expected_trajectory=task.get("expected_trajectory"),
            actual_trajectory=trajectory,
            actual_environment_state=_states(self.environment_state),
            expected_environment_state=_states(task.get("expected_environment_state")),
        )


def tool_names(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of the tools the agent called, in order."""
    return [block["toolUse"].get("name", "") for message in messages if message.get("role") == "assistant"
            for block in _blocks(message) if "toolUse" in block]  # fmt: skip


def episode_session(episode: Episode, tools: Sequence[Any] | None = None) -> Any:
    """The episode as a strands-evals ``Session``: one trace per user turn (an agent-invocation span
    with the prompt, the turn's final answer and the available tools) with a tool-execution span per
    call (its arguments, result text and error)."""
    from strands_evals.types.trace import (
        AgentInvocationSpan,
        Session,
        SpanInfo,
        ToolCall,
        ToolConfig,
        ToolExecutionSpan,
        ToolResult,
        Trace,
    )

    available = [ToolConfig(name=spec["name"], description=spec.get("description"),
                            parameters=(spec.get("inputSchema") or {}).get("json"))
                 for spec in _tool_specs(tools)]  # fmt: skip
    results: dict[str, dict[str, Any]] = {}
    history = episode.transcript()
    for message in history:
        for block in _blocks(message):
            if "toolResult" in block:
                results[str(block["toolResult"].get("toolUseId"))] = block["toolResult"]
    turns: list[dict[str, Any]] = []
    for message in history:
        texts = [b["text"] for b in _blocks(message) if "text" in b]
        if message.get("role") == "user" and texts:
            turns.append({"prompt": "".join(texts), "answer": "", "calls": []})
        elif message.get("role") == "assistant" and turns:
            turns[-1]["answer"] = "".join(texts)
            turns[-1]["calls"] += [b["toolUse"] for b in _blocks(message) if "toolUse" in b]
    clock = 0

    def tick() -> datetime:
        nonlocal clock
        clock += 1
        return _EPOCH + timedelta(seconds=clock)

    traces = []
    for t, turn in enumerate(turns):
        trace_id, agent_id = f"trace-{t}", f"agent-{t}"
        start = tick()
        spans: list[Any] = []
        for c, call in enumerate(turn["calls"]):
            result = results.get(str(call.get("toolUseId")), {})
            text = _result_text(result)
            call_start, call_end = tick(), tick()
            spans.append(ToolExecutionSpan(
                span_info=SpanInfo(trace_id=trace_id, span_id=f"tool-{t}-{c}", session_id=_SESSION_ID,
                                   parent_span_id=agent_id, start_time=call_start, end_time=call_end),
                tool_call=ToolCall(name=str(call.get("name", "")), arguments=_arguments(call.get("input")),
                                   tool_call_id=str(call.get("toolUseId"))),
                tool_result=ToolResult(content=text, error=text if result.get("status") == "error" else None,
                                       tool_call_id=str(call.get("toolUseId"))),
            ))  # fmt: skip
        spans.insert(0, AgentInvocationSpan(
            span_info=SpanInfo(trace_id=trace_id, span_id=agent_id, session_id=_SESSION_ID, start_time=start,
                               end_time=tick()),
            user_prompt=turn["prompt"], agent_response=turn["answer"], available_tools=available,
        ))  # fmt: skip
        traces.append(Trace(spans=spans, trace_id=trace_id, session_id=_SESSION_ID))
    return Session(traces=traces, session_id=_SESSION_ID)


def _blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _first_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    for message in messages:
        if message.get("role") == "user":
            texts = [b["text"] for b in _blocks(message) if "text" in b]
            if texts:
                return "".join(texts)
    return None


def _task_prompt(task: Mapping[str, Any]) -> str:
    from ..environments.strands_env import PROMPT_KEYS

    return next((str(task[k]) for k in PROMPT_KEYS if isinstance(task.get(k), str)), "")


def _result_text(result: Mapping[str, Any]) -> str:
    parts = []
    for item in result.get("content") or []:
        if isinstance(item, dict) and "text" in item:
            parts.append(str(item["text"]))
        elif isinstance(item, dict) and "json" in item:
            parts.append(json.dumps(item["json"], default=str))
    return "".join(parts)


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return {"raw": value}
        return parsed if isinstance(parsed, dict) else {"value": parsed}
    return {} if value is None else {"value": value}


def _tool_specs(tools: Sequence[Any] | None) -> list[dict[str, Any]]:
    specs = []
    for tool in tools or []:
        spec = getattr(tool, "tool_spec", None) or getattr(tool, "TOOL_SPEC", None)
        if isinstance(spec, dict) and spec.get("name"):
            specs.append(spec)
    return specs


def _states(states: Any) -> list[Any] | None:
    from strands_evals.types.evaluation import EnvironmentState

    if states is None:
        return None
    if isinstance(states, Mapping):
        return [EnvironmentState(name=str(name), state=value) for name, value in states.items()]
    return [s if isinstance(s, EnvironmentState) else EnvironmentState(**s) for s in states]


def _unique_names(evaluators: Sequence[Any]) -> list[str]:
    names: list[str] = []
    for evaluator in evaluators:
        get_name = getattr(evaluator, "get_name", None)
        base = str(get_name()) if callable(get_name) else type(evaluator).__name__
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}#{n}"
        names.append(name)
    return names


# -- judges: identity, cache, in-flight sharing, concurrency ---------------------------------------
def _is_judge(evaluator: Any) -> bool:
    return hasattr(evaluator, "model")


_WARNED_DEFAULT_MODEL = False


def _judge_fingerprint(evaluator: Any) -> str:
    """Which judge answers: the model's class, configuration and endpoint (never its key)."""
    global _WARNED_DEFAULT_MODEL
    model = getattr(evaluator, "model", None)
    if model is None:
        if not _WARNED_DEFAULT_MODEL:
            _WARNED_DEFAULT_MODEL = True
            logger.warning("%s has no model: strands-evals judges with its default Bedrock model "
                           "(pass model=judge_model('openai:<model>@<url>') for an OpenAI-compatible judge)",
                           type(evaluator).__name__)  # fmt: skip
        return "strands-evals default model"
    if isinstance(model, str):
        return model
    config = getattr(model, "get_config", lambda: {})()
    endpoint = (getattr(model, "client_args", None) or {}).get("base_url")
    return json.dumps([type(model).__qualname__, config, str(endpoint)], sort_keys=True, default=str)


def _cache_key(evaluator: Any, case: Any) -> str | None:
    try:
        identity = evaluator.to_dict() if callable(getattr(evaluator, "to_dict", None)) else {}
        blob = json.dumps(
            [type(evaluator).__module__, type(evaluator).__qualname__, identity, _judge_fingerprint(evaluator),
             case.model_dump(mode="json")],
            sort_keys=True, default=str,
        )  # fmt: skip
    except Exception as exc:  # an evaluator whose settings do not serialise is simply not cached
        logger.debug("not caching %s: %s", type(evaluator).__name__, exc)
        return None
    return hashlib.sha256(blob.encode()).hexdigest()


class _LRU:
    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[str, tuple[Any, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> list[Any] | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                return None
            self._data.move_to_end(key)
            return [o.model_copy(deep=True) if hasattr(o, "model_copy") else o for o in value]

    def put(self, key: str, outputs: list[Any]) -> None:
        with self._lock:
            self._data[key] = tuple(outputs)
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


_CACHE = _LRU(CACHE_SIZE)
_IN_FLIGHT: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future[list[Any]]]] = (
    weakref.WeakKeyDictionary()
)
_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = weakref.WeakKeyDictionary()


def _gate(judge: str, limit: int) -> asyncio.Semaphore:
    gates = _GATES.setdefault(asyncio.get_running_loop(), {})
    if judge not in gates:
        gates[judge] = asyncio.Semaphore(limit)
    return gates[judge]


def clear_cache() -> None:
    """Forget every cached verdict of this process (tests, or after changing a judge in place)."""
    _CACHE.clear()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # a failure no waiter read is still not "never retrieved"


def _short(exc: BaseException, limit: int = 500) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


__all__ = ["EvaluatorReward", "JudgeError", "clear_cache", "episode_session", "judge_model", "tool_names"]
