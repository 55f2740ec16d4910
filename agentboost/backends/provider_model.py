"""``ProviderModel``: the Strands model of one episode of the Strands-provider route (no tokens).

It wraps the provider's own Strands model (OpenAI-compatible, Bedrock, any other) so that the episode
keeps the same budgets and records as a token-exact one, see :mod:`agentboost.backends.strands_provider`
(which names this class; this module imports only :mod:`agentboost.backends.provider_common`, never it).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ..errors import AgentboostError, BackendError, BackendTimeout, ContextOverflow, EpisodeStop, EpisodeTimeout
from ..model import TokenModel, _deadline
from ..types import Budget, SamplingParams, Termination
from .provider_common import PROVIDER_TEMPLATE, ProviderBackend, mark_not_token_exact


class ProviderModel(TokenModel):
    """The Strands model of one provider episode: the provider's model, wrapped to keep the episode's
    budgets and record its calls, without tokens (see module doc).

    It is a :class:`~agentboost.model.TokenModel` for everything but generation, so the runner, the
    trajectory hooks and the tool middleware treat it exactly as they treat a token-exact episode."""

    def __init__(
        self,
        backend: ProviderBackend,
        template: Any = None,
        *,
        sampling: SamplingParams | None = None,
        budget: Budget | None = None,
        episode_id: str | None = None,
        group_id: str | None = None,
    ) -> None:
        super().__init__(
            backend,  # type: ignore[arg-type]
            template or PROVIDER_TEMPLATE,
            sampling=sampling,
            budget=budget,
            episode_id=episode_id,
            group_id=group_id,
            model_id=backend.ref.describe(),
        )
        self._backend = backend
        self._in_flight = False
        self._frozen = False
        self._tool_names: list[str] = []
        self.provider: Any = None
        """The provider's Strands model, built at the first call (a failure there is the episode's, typed)."""
        self._provider_calls: list[dict[str, Any]] = []
        self._context_tokens = 0
        mark_not_token_exact(self.episode)
        self.episode.metadata["strands_model"] = backend.ref.describe()
        self.episode.metadata["provider_calls"] = self._provider_calls

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "provider": self._backend.ref.describe(), "token_exact": False}

    async def stream(  # type: ignore[override]
        self,
        messages: list[dict[str, Any]],
        tool_specs: list[dict[str, Any]] | None = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> Any:
        from strands.types.exceptions import ContextWindowOverflowException, ModelThrottledException

        if self._in_flight:
            raise RuntimeError("ProviderModel belongs to one episode and is not re-entrant")
        index = len(self._provider_calls)
        if self._pending_stop is not None:
            raise self._pending_stop
        if index >= self.budget.max_turns:
            raise EpisodeStop(Termination.MAX_TURNS, f"max_turns={self.budget.max_turns} reached")
        if index and self._context_tokens >= self.budget.max_total_tokens:
            raise EpisodeStop(
                Termination.MAX_TOKENS,
                f"token budget used up before call {index}: the provider reported a context of "
                f"{self._context_tokens} tokens (max_total_tokens={self.budget.max_total_tokens})",
            )
        if self._deadline - time.monotonic() <= 0:
            raise EpisodeTimeout(f"wall-clock budget of {self.budget.wall_clock_s}s used up")
        if self.provider is None:
            try:
                self.provider = self._backend.strands_model(self.sampling)
            except Exception as exc:
                detail = f"cannot build the Strands model {self.model_id}: {type(exc).__name__}: {exc}"
                raise BackendError(detail) from exc
        if not self._frozen:
            self._frozen = True
            self._tool_names = [spec["name"] for spec in tool_specs or []]
        self.synthetic_messages = max(0, sum(m.get("role") == "assistant" for m in messages) - index)

        record: dict[str, Any] = {"index": index, "tool_calls": 0}
        tool_use_ids: list[str] = []
        overflow: str | None = None
        completed = throttled = False
        started = time.monotonic()
        self._request_window = (started, None)
        self._in_flight = True
        events = self.provider.stream(messages, tool_specs, system_prompt, **kwargs).__aiter__()
        try:
            while True:
                try:
                    async with _deadline(self._deadline):
                        event = await events.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    if time.monotonic() >= self._deadline:
                        detail = f"the wall-clock budget ran out while waiting for {self.model_id}"
                        raise BackendTimeout(detail) from None
                    raise BackendError(f"{self.model_id}: {type(exc).__name__}: {exc}") from exc
                start = event.get("contentBlockStart", {}).get("start", {}) if isinstance(event, dict) else {}
                if "toolUse" in start:
                    tool_use_ids.append(str(start["toolUse"].get("toolUseId")))
                if isinstance(event, dict) and "messageStop" in event:
                    record["stop_reason"] = event["messageStop"].get("stopReason")
                    completed = True
                    if index == self.budget.max_turns - 1:
                        # The last call the budget allows: its tool calls are not executed (their
                        # results could never be seen), exactly as for TokenModel.
                        self._turn_limit_calls.update(tool_use_ids)
                if isinstance(event, dict) and "metadata" in event:
                    usage = event["metadata"].get("usage") or {}
                    record["input_tokens"] = int(usage.get("inputTokens", 0))
                    record["output_tokens"] = int(usage.get("outputTokens", 0))
                    self._context_tokens = record["input_tokens"] + record["output_tokens"]
                yield event
        except ContextWindowOverflowException as exc:
            overflow = str(exc)
        except ModelThrottledException:
            throttled = True  # Strands backs off and retries: that wait is the provider's, not the policy's
            raise
        except AgentboostError:
            raise
        except Exception as exc:
            raise BackendError(f"{self.model_id}: {type(exc).__name__}: {exc}") from exc
        finally:
            self._in_flight = False
            self._request_window = (started, None if throttled else time.monotonic())
            latency = time.monotonic() - started
            self.model_time_s += latency
            record["latency_s"] = round(latency, 4)
            with contextlib.suppress(Exception):
                await events.aclose()
            if completed:
                record["tool_calls"] = len(tool_use_ids)
                self._provider_calls.append(record)
        if overflow is not None:  # raised outside the handler: the runner reads the cause chain
            if index == 0:
                raise ContextOverflow(f"the provider refused the task's prompt as too long: {overflow}")
            raise EpisodeStop(Termination.MAX_TOKENS, f"the provider refused call {index}'s prompt: {overflow}")
