"""Serialisable episode specifications and running many of them concurrently in one process.

An :class:`EpisodeSpec` is plain data (JSON/pickle-able): the dataset row, which environment and
agent to build (import references), which model to talk to (:class:`ModelSpec`) and the rollout
settings. :func:`run_spec` turns one into an :class:`Episode` — every failure, including a row that
cannot even be turned into an environment, comes back as a typed, masked episode. The CLI, the
evaluator and the worker pool all go through it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .agents.strands_agent import StrandsAgent
from .backends.factory import ModelSpec, build_model, cached_model
from .episode import Episode
from .rollout import RolloutSettings, run_episode
from .types import Termination
from .utils.refs import resolve

logger = logging.getLogger(__name__)

DEFAULT_ENV = "agentboost.environments.strands_env:StrandsEnv"


@dataclass
class AgentSpec:
    """Which environment class and which Strands agent to build for a row."""

    env: str = DEFAULT_ENV
    env_args: dict[str, Any] = field(default_factory=dict)
    agent_factory: str | None = None
    system_prompt: str | None = None
    agent_kwargs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentSpec:
        return cls(**data)


@dataclass
class EpisodeSpec:
    row: dict[str, Any]
    agent: AgentSpec
    model: ModelSpec
    settings: dict[str, Any] = field(default_factory=dict)
    episode_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    task_id: str | None = None
    group_id: str | None = None
    sample_index: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "row": self.row,
            "agent": self.agent.to_dict(),
            "model": self.model.to_dict(),
            "settings": self.settings,
            "episode_id": self.episode_id,
            "task_id": self.task_id,
            "group_id": self.group_id,
            "sample_index": self.sample_index,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeSpec:
        return cls(
            row=data["row"],
            agent=AgentSpec.from_dict(data["agent"]),
            model=ModelSpec.from_dict(data["model"]),
            settings=data.get("settings", {}),
            episode_id=data["episode_id"],
            task_id=data.get("task_id"),
            group_id=data.get("group_id"),
            sample_index=int(data.get("sample_index", 0)),
        )


def failed_episode(spec: EpisodeSpec, termination: Termination, detail: str, **timings: float) -> Episode:
    """The record of an episode that could not run (or whose runner died): reward 0, masked."""
    episode = Episode.failed(
        spec.episode_id,
        termination,
        detail,
        task_id=spec.task_id,
        timings=dict(timings),
        metadata={"group_id": spec.group_id, "sample_index": spec.sample_index},
    )
    return _marked(spec, episode)


def build_env_and_agent(spec: EpisodeSpec) -> tuple[Any, StrandsAgent]:
    """The environment and agent of one episode, as every route builds them (the CLI's preflight too)."""
    env_cls = resolve(spec.agent.env)
    env = env_cls.from_dict({**spec.row, **spec.agent.env_args})
    agent = StrandsAgent(
        agent_factory=spec.agent.agent_factory,
        system_prompt=spec.agent.system_prompt,
        **spec.agent.agent_kwargs,
    )
    return env, agent


async def run_spec(spec: EpisodeSpec) -> Episode:
    """Build env, agent and model from ``spec`` and run the episode. Never raises (but for cancellation)."""
    started = time.monotonic()
    try:
        built = cached_model(spec.model)
        if built is None:  # shared by the process's later episodes: built outside this one's context
            built = await asyncio.get_running_loop().run_in_executor(
                None, contextvars.Context().run, build_model, spec.model
            )
        backend, template = built
        # Off the event loop: the first episode of a worker imports the user's modules, and user
        # code in from_dict may be slow; a blocked loop misses heartbeats and looks hung.
        env, agent = await asyncio.to_thread(build_env_and_agent, spec)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        logger.warning("episode %s: cannot build its environment/agent: %s", spec.episode_id, exc)
        return failed_episode(
            spec,
            Termination.INFRA_ERROR,
            f"setup failed: {type(exc).__name__}: {exc}",
            wall_s=time.monotonic() - started,
        )
    episode = await run_episode(
        env,
        agent,
        backend,
        template,
        RolloutSettings.from_dict(spec.settings),
        episode_id=spec.episode_id,
        group_id=spec.group_id,
        task_id=spec.task_id,
    )
    episode.metadata.update({"group_id": spec.group_id, "sample_index": spec.sample_index})
    return _marked(spec, episode)


def _marked(spec: EpisodeSpec, episode: Episode) -> Episode:
    """Episodes of the Strands-provider route carry no tokens: marked and masked, whatever happened
    (failures included, wherever they are recorded: here, in a pool worker or by the pool)."""
    if spec.model.backend.startswith("strands:"):
        from .backends.strands_provider import mark_not_token_exact

        mark_not_token_exact(episode)
    return episode


async def run_many(
    specs: Iterable[EpisodeSpec],
    *,
    concurrency: int = 32,
    on_done: Callable[[Episode], Awaitable[None] | None] | None = None,
) -> list[Episode]:
    """Run specs in this process with at most ``concurrency`` in flight; results in completion order."""
    semaphore = asyncio.Semaphore(max(1, concurrency))
    results: list[Episode] = []

    async def one(spec: EpisodeSpec) -> None:
        async with semaphore:
            episode = await run_spec(spec)
        results.append(episode)
        if on_done is not None:
            maybe = on_done(episode)
            if asyncio.iscoroutine(maybe):
                await maybe

    # One failure (``on_done`` raising: a full disk) ends the whole run: the other episodes are cancelled and
    # awaited here, so none of them reaches ``on_done`` after its caller has cleaned up (a closed file).
    tasks = [asyncio.ensure_future(one(s)) for s in specs]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return results


def expand(
    rows: list[dict[str, Any]],
    agent: AgentSpec,
    model: ModelSpec,
    settings: RolloutSettings,
    *,
    n: int = 1,
    task_ids: list[str] | None = None,
) -> list[EpisodeSpec]:
    """``n`` specs per row (one GRPO group per row), ids ``{task_id}:{sample}``.

    With a sampling seed, sample ``k`` of every row uses ``seed + k``: reproducible, and the ``n``
    samples of a row differ. Task ids must be unique (they key the episodes).
    """
    from .data import task_id_of

    specs = []
    settings_dict = settings.to_dict()
    seed = settings.sampling.seed
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        task_id = task_ids[i] if task_ids else task_id_of(row, i)
        if task_id in seen:
            raise ValueError(f"rows {seen[task_id]} and {i} have the same task id {task_id!r}; task ids must be unique")
        seen[task_id] = i
        for k in range(n):
            sample_settings = settings_dict
            if seed is not None and k:  # reproducible, but the n samples of a group must differ
                sample_settings = {**settings_dict, "sampling": {**settings_dict["sampling"], "seed": seed + k}}
            specs.append(
                EpisodeSpec(
                    row=row, agent=agent, model=model, settings=sample_settings,
                    episode_id=f"{task_id}:{k}", task_id=task_id, group_id=task_id, sample_index=k,
                )
            )  # fmt: skip
    return specs
