"""Adapter for ``rllm/engine/agent_execution_engine.py`` of rLLM v0.2.1.post1 and v0.3.0-pre.

``apply_patches.py`` appends a marked block to that module that calls :func:`install` with the
module's globals. :func:`install` replaces the module's ``AsyncAgentExecutionEngine`` (the name rLLM's
PPO trainer imports) with a subclass that runs :class:`~agentboost.StrandsAgent` /
:class:`~agentboost.StrandsEnv` batches the agentboost way and hands every other agent to rLLM's own
code unchanged.

For Strands batches on the ``verl`` engine:

* the episodes run through :func:`agentboost.rollout.run_episode` with ``TokenModel`` talking token
  ids to veRL's rollout servers (:class:`~agentboost.backends.verl_server.VerlServerBackend` over
  ``AgentLoopManager.server_handles``): no chat-parser re-rendering, no re-tokenisation;
* rLLM's ``VerlEngine.wake_up()`` / ``sleep()`` run around every rollout phase, also when the phase
  fails. On v0.2.1.post1 (veRL 0.6.1) they wake the replicas (weights synced) and put them to sleep.
  On v0.3.0-pre (veRL 0.7.1) ``VerlEngine`` no longer has them (``RolloutEngine``'s no-ops): the
  trainer syncs weights with ``checkpoint_manager.update_weights(step)`` at start and after every
  actor update, and the replicas stay awake between phases, exactly as on rLLM's own path (calling a
  replica's ``wake_up`` there would fail: veRL 0.7.1 refuses it in hybrid mode);
* sticky routing: every call of an episode, and the members of a GRPO group while their server is not
  overloaded, go to one server; new groups to the least-loaded one;
* sampling from the config (train: ``actor_rollout_ref.rollout``; validation: ``val_kwargs``);
* every episode yields a row: failed, timed-out and overflowing episodes are typed, masked and
  zero-reward (see :mod:`agentboost.integration`).

The constructor, ``rollout_engine.rollout_manager.server_handles``, ``envs``/``agents`` and the
``trajectory_generator``/``execute_tasks`` signatures are the same in both releases, so there is no
version branch here (``apply_patches.py`` checks each release's file by its own hash).

``trajectory_generator(mode="Token")`` yields rLLM's Token dicts (plus ``rollout_log_probs`` and the
``episode``), so the unmodified rLLM trainer can consume them; the adapted trainer calls
:meth:`run_strands_episodes` directly and builds its batch from the episodes.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("agentboost.rllm_engine")

MARK = "_agentboost_installed"


def is_strands(agent_class: Any, env_class: Any) -> bool:
    """True when the engine runs agentboost's agent/env (subclasses included)."""
    from agentboost.agents.strands_agent import StrandsAgent
    from agentboost.environments.strands_env import StrandsEnv

    def sub(cls: Any, base: type) -> bool:
        return isinstance(cls, type) and issubclass(cls, base)

    agent, env = sub(agent_class, StrandsAgent), sub(env_class, StrandsEnv)
    if agent != env:
        raise TypeError(
            "StrandsAgent and StrandsEnv go together: got agent_class="
            f"{getattr(agent_class, '__name__', agent_class)}, env_class={getattr(env_class, '__name__', env_class)}"
        )
    return agent


def token_dict(episode: Any, idx: int, pad_token_id: int) -> dict[str, Any]:
    """rLLM's Token-mode trajectory dict for one episode (never empty: failures get one masked pad token)."""
    import torch

    from agentboost.batch import row_tokens

    prompt, response, mask, logprobs = row_tokens(episode, pad_token_id)
    return {
        "prompt_tokens": torch.tensor(prompt, dtype=torch.long),
        "response_tokens": torch.tensor(response, dtype=torch.long),
        "response_masks": torch.tensor(mask, dtype=torch.long),
        "rollout_log_probs": torch.tensor(logprobs, dtype=torch.float32),
        "trajectory_reward": 0.0 if episode.masked else float(episode.reward),
        "idx": idx,
        "chat_completions": episode.messages,
        "episode": episode,
        "metrics": {
            "steps": len(episode.calls),
            "total_time": float(episode.timings.get("wall_s", 0.0)),
            "tool_calls": episode.tool_calls,
            "masked": float(episode.masked),
        },
    }


def install(ns: dict[str, Any]) -> bool:
    """Replace ``AsyncAgentExecutionEngine`` in the module namespace ``ns``. Idempotent."""
    if "AsyncAgentExecutionEngine" not in ns:
        raise RuntimeError(
            "agentboost: rLLM's agent_execution_engine lacks AsyncAgentExecutionEngine; this adapter targets "
            "rLLM v0.2.1.post1 / v0.3.0-pre (run `python apply_patches.py --revert`)"
        )
    base = ns["AsyncAgentExecutionEngine"]
    if getattr(base, MARK, False):
        return False

    class StrandsAwareExecutionEngine(base):  # type: ignore[misc, valid-type]
        """rLLM's async execution engine that also runs Strands agents token-exactly."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._strands = is_strands(self.agent_class, self.env_class)
            self._strands_backend: Any = None
            self._strands_template: Any = None
            self._strands_options: Any = None
            if self._strands:
                if self.engine_name != "verl":
                    raise ValueError(
                        "agentboost runs Strands agents on rLLM's 'verl' engine (token ids to veRL's servers); "
                        f"got engine_name={self.engine_name!r}. Use `agentboost rollout` against an OpenAI-"
                        "compatible server instead."
                    )
                from agentboost.chat.template import ChatTemplate
                from agentboost.integration.config import options_from_config

                self._strands_options = options_from_config(self.config)
                self._strands_template = ChatTemplate(self.tokenizer)
                logger.info(
                    "Strands rollouts: train %s, validation %s",
                    self._strands_options.train.sampling, self._strands_options.validate.sampling,
                )  # fmt: skip

        # -- Strands path -----------------------------------------------------------------
        def _backend(self) -> Any:
            if self._strands_backend is None:
                from agentboost.backends.verl_server import VerlServerBackend

                manager = self.rollout_engine.rollout_manager
                self._strands_backend = VerlServerBackend(list(manager.server_handles))
            return self._strands_backend

        async def run_strands_episodes(self, *, validate: bool = False) -> list[Any]:
            """Run the current envs/agents (one per batch row) and return their episodes in row order."""
            from agentboost.integration.rollouts import run_batch

            options = self._strands_options
            concurrency = options.concurrency or self.n_parallel_agents
            return await run_batch(
                self.envs,
                self.agents,
                self._backend(),
                self._strands_template,
                options.settings(validate=validate),
                group_size=options.val_group_size if validate else options.group_size,
                concurrency=concurrency,
                wake_up=self.rollout_engine.wake_up,
                sleep=self.rollout_engine.sleep,
                validation=validate,
            )

        async def trajectory_generator(
            self, reset_seed: int = 0, timing_raw: Any = None, mode: str = "Text", **kwargs: Any
        ):  # type: ignore[override]
            if not self._strands:
                async for item in super().trajectory_generator(
                    reset_seed=reset_seed, timing_raw=timing_raw, mode=mode, **kwargs
                ):
                    yield item
                return
            if mode != "Token":
                raise ValueError(
                    f"Strands agents produce whole-episode token trajectories (mode='Token'), not mode={mode!r}; "
                    "set rllm.stepwise_advantage.enable=false"
                )
            meta_info = kwargs.get("meta_info") or {}
            episodes = await self.run_strands_episodes(validate=bool(meta_info.get("validate", False)))
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            for idx, episode in enumerate(episodes):
                yield token_dict(episode, idx, pad)

        async def execute_tasks(self, tasks: list[dict]) -> list[Any]:  # type: ignore[override]
            """Evaluation: for Strands agents the results are agentboost ``Episode`` records (in task
            order) instead of rLLM ``Trajectory`` objects."""
            if not self._strands:
                return await super().execute_tasks(tasks)
            envs = [self.env_class.from_dict({**task, **self.env_args}) for task in tasks]
            agents = [self.agent_class(**self.agent_args) for _ in tasks]
            self.envs, self.agents = envs, agents
            return await self.run_strands_episodes(validate=True)

    StrandsAwareExecutionEngine.__name__ = StrandsAwareExecutionEngine.__qualname__ = "AsyncAgentExecutionEngine"
    StrandsAwareExecutionEngine.__module__ = base.__module__
    setattr(StrandsAwareExecutionEngine, MARK, True)
    ns["AsyncAgentExecutionEngine"] = StrandsAwareExecutionEngine
    ns["UpstreamAsyncAgentExecutionEngine"] = base
    logger.info("agentboost: rLLM execution engine adapted for Strands agents")
    return True


__all__ = ["install", "is_strands", "token_dict"]
