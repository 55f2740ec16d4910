"""Run one episode: dataset row -> env (tools + reward) -> Strands agent with the token model -> Episode.

:func:`run_episode` is the single place where an episode is driven. The CLI, the worker pool and the
rLLM engine adapter all call it, so every path produces the same typed, checked record:

* every failure becomes a :class:`~agentboost.types.Termination` (never an exception out of here,
  except cancellation of the caller);
* the token invariant is checked on every episode; a violation is an ``infra_error``;
* one masking rule (docs/masking.md, "What is trained on"): endings the policy caused (``completed``,
  ``max_turns``, ``max_tokens``, ``timeout`` in its own turns, ``tool_error``) are scored by the
  reward function; endings it did not cause (``context_overflow`` of the task's prompt,
  ``infra_error``) get reward 0 and an all-zero loss mask, and are still returned (never dropped);
* every wait is bounded by the episode's wall clock: a deadline hit while the agent acts (its tools,
  the loop between calls) is the policy's ``timeout``; one hit while waiting for the server, the
  environment (reset, the simulated user) or the reward is an infrastructure ``infra_error``;
* a reward that raises, or is not a finite number (NaN, an infinity: it would make every advantage of
  its group NaN), is an ``infra_error`` naming it; failures are logged once per cause
  (:class:`EpisodeFailureLog`), not once per episode.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .agents.multiagent import final_messages, invoke, is_multiagent, stop_reason_termination, system_prompt_of
from .agents.strands_agent import StrandsAgent
from .backends.base import GenerationBackend, describe_backend
from .chat.template import ChatTemplate
from .environments.strands_env import StrandsEnv
from .episode import Episode
from .errors import AgentboostError, ContextWindowFull, termination_of
from .model import TokenModel
from .types import DEFAULT_MASKED_TERMINATIONS, Budget, SamplingParams, Termination
from .utils.clock import ChargedClock, run_charged

logger = logging.getLogger(__name__)

_TIMEOUT_GRACE_S = 1.0
_OUR_STOPS = {
    "EpisodeStop", "ContextOverflow", "EpisodeTimeout", "BackendError", "BackendContextOverflow",
    "BackendTimeout", "TrajectoryDivergence", "UnsupportedContent", "TemplateError", "ContextWindowFull",
}  # fmt: skip


class _QuietTypedStops(logging.Filter):
    """Strands logs every exception that ends its event loop at ERROR. Typed agentboost stops are
    ordinary episode endings (the runner records them as terminations), not errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and "event loop cycle failed" in str(record.msg) and str(args[0]) in _OUR_STOPS)


logging.getLogger("strands.event_loop.event_loop").addFilter(_QuietTypedStops())


class EpisodeFailureLog:
    """Episode failures logged once per cause: the first episode that fails a way is logged, the later ones
    counted (the 10th, 100th, ... logged with the count), so a reward that raises in every episode gives one
    line, not one per episode. A cause is what the failure says with its numbers blanked; one not seen for
    ``quiet_s`` is logged afresh (another run in the same process)."""

    MAX_CAUSES = 1000

    def __init__(self, quiet_s: float = 600.0) -> None:
        self.quiet_s = quiet_s
        self._seen: dict[str, tuple[int, float]] = {}  # cause -> (episodes, when the last one was seen)
        self._lock = threading.Lock()

    def __call__(self, level: int, episode_id: str, what: str, *, exc_info: bool = False) -> None:
        key = re.sub(r"\d+", "#", what)[:500]
        now = time.monotonic()
        with self._lock:
            count, last = self._seen.get(key, (0, now))
            count = 1 if now - last > self.quiet_s else count + 1
            if count == 1 and len(self._seen) >= self.MAX_CAUSES:
                self._seen.clear()
            self._seen[key] = (count, now)
        if count == 1:
            logger.log(level, "episode %s: %s (logged once: later episodes failing this way are counted)",
                       episode_id, what, exc_info=exc_info)  # fmt: skip
        elif math.log10(count).is_integer():
            logger.log(level, "%d episodes so far: %s", count, what)


log_episode_failure = EpisodeFailureLog()


@dataclass(frozen=True)
class RolloutSettings:
    """How episodes are sampled, bounded and masked."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    budget: Budget = field(default_factory=Budget)
    masked_terminations: frozenset[Termination] = DEFAULT_MASKED_TERMINATIONS
    mask_truncated: bool = False
    """Also mask ``max_tokens`` / ``max_turns`` episodes (DAPO-style overlong filtering)."""
    train_aux_calls: bool = True
    """Train on the calls made through the policy without an agent (a conversation manager's summariser
    calling the model directly); they are recorded either way. Calls through another model are never
    recorded."""

    def is_masked(self, termination: Termination) -> bool:
        if termination in self.masked_terminations:
            return True
        return self.mask_truncated and termination.is_truncation

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampling": self.sampling.to_dict(),
            "budget": self.budget.to_dict(),
            "masked_terminations": sorted(t.value for t in self.masked_terminations),
            "mask_truncated": self.mask_truncated,
            "train_aux_calls": self.train_aux_calls,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RolloutSettings:
        data = data or {}
        masked = data.get("masked_terminations")
        return cls(
            sampling=SamplingParams.from_dict(data.get("sampling")),
            budget=Budget.from_dict(data.get("budget")),
            masked_terminations=(
                frozenset(Termination(t) for t in masked) if masked is not None else DEFAULT_MASKED_TERMINATIONS
            ),
            mask_truncated=bool(data.get("mask_truncated", False)),
            train_aux_calls=bool(data.get("train_aux_calls", True)),
        )


_stop_reason_termination = stop_reason_termination  # the name this module used before


def _exception_termination(exc: BaseException, calls_made: int) -> tuple[Termination, str]:
    from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MaxTokensReachedException):
            return Termination.MAX_TOKENS, "a generation reached max_tokens"
        if isinstance(current, ContextWindowOverflowException):
            # Before the first response it is the task's prompt; afterwards the policy filled the context
            # (and no conversation manager could make room: the detail of agentboost's own stop is kept).
            full = _cause_of_type(current, ContextWindowFull)
            detail = full.detail if full is not None and full is not current else str(current)
            if full is not None and full is not current:
                detail = f"{current}: {detail}"
            return (Termination.MAX_TOKENS if calls_made else Termination.CONTEXT_OVERFLOW), detail
        if isinstance(current, RecursionError):
            return Termination.INFRA_ERROR, "RecursionError in the Strands event loop (raise max recursion depth)"
        if isinstance(current, AgentboostError):
            # agentboost's own error ends the episode for what it is: an overflow further down the chain is
            # one Strands already recovered from (it retries inside its ``except``, so every later error
            # carries it as its context) - a server failure after a trim is infra_error, not max_tokens
            return termination_of(current)
        current = current.__cause__ or current.__context__
    return termination_of(exc)


async def _until(awaitable: Any, deadline_of: Any) -> Any:
    """``await awaitable`` until the monotonic ``deadline_of()``, which may move later meanwhile; then cancel
    it and raise ``TimeoutError`` (``asyncio.wait_for`` with a deadline that can be extended)."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            remaining = deadline_of() - time.monotonic()
            if remaining <= 0:
                break
            done, _ = await asyncio.wait({task}, timeout=remaining)
            if done:
                return task.result()
        task.cancel()
        await asyncio.wait({task})
        if task.cancelled():
            raise TimeoutError
        return task.result()  # finished (or failed) while being cancelled
    except BaseException:
        if not task.done():
            task.cancel()
        raise


def _cause_of_type(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        current = current.__cause__ or current.__context__
    return None


class _NonFiniteReward(ValueError):
    """A reward function's NaN or infinity (its message is the episode's termination detail)."""


def _checked_rewards(output: Any) -> tuple[float, dict[str, float]]:
    """The reward and the per-agent rewards of a reward function's output, as finite floats: a NaN or an
    infinity is no score (it would turn every advantage of its group into NaN), so the reward failed."""
    reward = float(output.reward)
    roles = {str(k): float(v) for k, v in (output.role_rewards or {}).items()}
    bad = [f"{name} {value}" for name, value in (("reward", reward), *roles.items()) if not math.isfinite(value)]
    if bad:
        raise _NonFiniteReward(f"reward function returned a non-finite reward ({', '.join(bad)})")
    return reward, roles


def _check_messages(episode: Episode) -> None:
    for call in episode.calls:
        index = call.message_index
        history = episode.messages_of(call.trajectory)
        if not (0 <= index < len(history)) or history[index].get("role") != "assistant":
            raise ValueError(f"call {call.index}: its response is not in the message history at position {index}")


async def run_episode(
    env: StrandsEnv,
    agent: StrandsAgent,
    backend: GenerationBackend,
    template: ChatTemplate,
    settings: RolloutSettings | None = None,
    *,
    episode_id: str | None = None,
    group_id: str | None = None,
    task_id: str | None = None,
) -> Episode:
    """Run one episode to completion and return its checked, scored record."""
    settings = settings or RolloutSettings()
    budget = settings.budget
    started = time.monotonic()
    deadline = started + budget.wall_clock_s
    # A backend may name the Strands model its episodes run through (the Strands-provider route's
    # ProviderModel: same hooks and budgets, no tokens); token backends use TokenModel.
    make_model = getattr(backend, "episode_model", TokenModel)
    model = make_model(
        backend,
        template,
        sampling=settings.sampling,
        budget=budget,
        episode_id=episode_id or uuid.uuid4().hex,
        group_id=group_id,
        **({"train_aux_calls": settings.train_aux_calls} if make_model is TokenModel else {}),
    )
    model.start_clock(deadline)
    episode = model.episode
    episode.task_id = task_id
    termination, detail = Termination.INFRA_ERROR, ""
    strands_agent: Any = None
    phase = "environment reset"  # what the episode is waiting on; names who used up the clock
    if budget.max_turns > 150 and sys.getrecursionlimit() < 10_000:
        sys.setrecursionlimit(10_000)  # the Strands event loop recurses once per model call

    def current_deadline() -> float:
        # the model's: a backend whose waits are off the episode's clock moves it (TokenModel.deadline)
        return float(getattr(model, "deadline", deadline))

    def left() -> float:
        remaining = current_deadline() - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    try:
        observation, info = await asyncio.wait_for(asyncio.to_thread(env.reset), timeout=left())
        agent.reset()
        agent.update_from_env(observation, 0.0, False, info)
        phase = "agent construction"
        strands_agent = await asyncio.wait_for(
            asyncio.to_thread(agent.build_agent, model, env.tools, env.task), timeout=left()
        )
        prompt: str | None = env.initial_prompt()
        while prompt is not None:
            phase = "agent"
            # Strands' own turn limit ends the loop gracefully at a message boundary; the TokenModel
            # enforces the same budget as a backstop.
            turns_left = max(1, budget.max_turns - len(episode.calls))
            invocation = invoke(strands_agent, prompt, turns_left=turns_left)
            termination, detail = await _until(invocation, lambda: current_deadline() + _TIMEOUT_GRACE_S)
            if termination is not Termination.COMPLETED:
                break
            phase = "environment (next user turn)"
            prompt = await asyncio.wait_for(env.next_user_message(final_messages(strands_agent)), timeout=left())
    except (TimeoutError, asyncio.TimeoutError):
        used = f"wall-clock budget of {budget.wall_clock_s}s used up"
        if phase == "agent" and not model.waiting_on_server_at(current_deadline()):
            termination, detail = Termination.TIMEOUT, f"{used} while the agent was acting (its tools or loop)"
        else:
            waiting = "the inference server" if phase == "agent" else phase
            termination, detail = Termination.INFRA_ERROR, f"{used} while waiting on {waiting}"
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        termination, detail = _exception_termination(exc, len(episode.calls))
        if termination is Termination.INFRA_ERROR:
            log_episode_failure(logging.WARNING, episode.id, detail, exc_info=logger.isEnabledFor(logging.DEBUG))
    fatal = getattr(model, "fatal_error", None)
    if fatal is not None and (termination, detail) != termination_of(fatal):
        # a model call failed where Strands kept going: an agent used as a tool (its error became a tool
        # result), a Swarm node (a failed node ends the swarm without an exception)
        termination, detail = termination_of(fatal)
        log_episode_failure(logging.WARNING, episode.id, f"a model call failed ({detail}); the agents went on, the "
                            f"episode ends {termination.value}")  # fmt: skip
    rollout_done = time.monotonic()

    if strands_agent is not None:
        episode.messages = [dict(m) for m in final_messages(strands_agent)]
    close = getattr(model, "close_trajectories", None)
    if callable(close):
        close(episode.messages, always=is_multiagent(strands_agent))
    try:
        episode.check_invariants()
        _check_messages(episode)
    except ValueError as exc:
        violation = f"trajectory invariant violated: {exc}"
        log_episode_failure(logging.ERROR, episode.id, violation)
        # Keep the first cause when the episode already failed for a reason that explains it.
        detail = f"{detail}; {violation}" if termination is Termination.INFRA_ERROR and detail else violation
        termination = Termination.INFRA_ERROR

    reward_s = 0.0
    episode.termination, episode.termination_detail = termination, detail  # reward functions may read it
    if settings.is_masked(termination):
        episode.masked = True
    else:
        reward_started = time.monotonic()
        try:
            # Charged time: waiting for shared sandbox slots does not count. A reward that grades a program
            # stops with a verdict within what is left (the code reward gives a too-slow program 0, trained
            # on); one that still runs out of time failed for reasons outside the episode: masked.
            clock = ChargedClock(budget.reward_timeout_s)
            output = await run_charged(clock, env.compute_reward(episode))
            reward, role_rewards = _checked_rewards(output)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, asyncio.TimeoutError) as exc:
            termination = Termination.INFRA_ERROR
            detail = f"reward function timed out ({exc or f'after {budget.reward_timeout_s}s'})"
            episode.masked = True
        except Exception as exc:
            termination = Termination.INFRA_ERROR
            detail = f"reward function failed: {type(exc).__name__}: {exc}"
            if isinstance(exc, _NonFiniteReward):
                detail = str(exc)
            episode.masked = True
            log_episode_failure(logging.WARNING, episode.id, detail)
        else:
            episode.reward = reward
            episode.reward_metrics = dict(output.metrics)
            episode.is_correct = output.is_correct
            episode.role_rewards = role_rewards
        reward_s = time.monotonic() - reward_started

    episode.termination, episode.termination_detail = termination, detail
    episode.timings = {
        "wall_s": time.monotonic() - started,
        "rollout_s": rollout_done - started,
        "model_s": model.model_time_s,
        "tool_s": sum(t.total_time_s for t in episode.tools.values()),
        "reward_s": reward_s,
    }
    episode.metadata.update(
        {
            "agentboost": __version__,
            "backend": describe_backend(backend),
            "template": template.fingerprint,
            "tool_parser": template.parser.name,
            "settings": settings.to_dict(),
            "synthetic_messages": model.synthetic_messages,
            "validation": env.validation,
        }
    )
    agent.record(episode, system_prompt=system_prompt_of(strands_agent))
    try:
        env.close()
    except Exception:
        logger.exception("env.close() failed for episode %s", episode.id)
    return episode
