"""Supervised warm start on demonstration episodes, through the same token/mask machinery as RL.

Demonstrations are real episodes: the scripted assistant turns are played by a
:class:`~agentboost.backends.scripted.ScriptedBackend` inside the real Strands agent with its real
tools, so the demo tokens, tool results and loss masks are exactly what a rollout would produce.
SFT then maximises the log-likelihood of the model tokens (mask 1) of those episodes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from ..agents.strands_agent import StrandsAgent
from ..backends.scripted import ScriptedBackend
from ..batch import episodes_to_batch
from ..chat.template import ChatTemplate
from ..episode import Episode
from ..rollout import RolloutSettings, run_episode
from ..types import SamplingParams
from ..utils.refs import resolve
from .logprobs import response_logprobs
from .optim import MasterWeightAdamW

logger = logging.getLogger(__name__)


def demonstration_episodes(
    rows: list[dict[str, Any]],
    turns: Callable[[dict[str, Any]], list[str]],
    template: ChatTemplate,
    *,
    env: Any = "agentboost.environments.strands_env:StrandsEnv",
    env_args: dict[str, Any] | None = None,
    agent: StrandsAgent | None = None,
    settings: RolloutSettings | None = None,
) -> list[Episode]:
    """One episode per row whose assistant turns are ``turns(row)`` (encoded as the model would emit them)."""
    env_cls = resolve(env)
    agent = agent or StrandsAgent()
    settings = settings or RolloutSettings(sampling=SamplingParams(logprobs=False))

    def script_for(row: dict[str, Any]) -> ScriptedBackend:
        ids = [[*template.encode(text), template.info.eot_token_id] for text in turns(row)]
        return ScriptedBackend(ids)

    async def one(i: int, row: dict[str, Any]) -> Episode:
        episode_env = env_cls.from_dict({**row, **(env_args or {})})
        episode_agent = StrandsAgent(agent.agent_factory, agent.system_prompt, **agent.agent_kwargs)
        return await run_episode(
            episode_env, episode_agent, script_for(row), template, settings, episode_id=f"demo:{i}"
        )

    async def everything() -> list[Episode]:
        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(rows))))

    return asyncio.run(everything())


def sft(
    model: Any,
    episodes: list[Episode],
    *,
    pad_token_id: int,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 16,
    seed: int = 0,
    weights: Sequence[float] | None = None,
    progress: bool = True,
    until: Callable[[int], bool] | None = None,
    check_every: int = 100,
    weight_decay: float = 0.0,
    schedule: str = "cosine",
) -> list[float]:
    """Minimise the mean NLL of the model tokens of ``episodes``; returns the loss per step.

    Batches are drawn without replacement, or, with ``weights`` (one per episode), with replacement
    in proportion to them: e.g. two answers to the same prompt weighted 0.3/0.7 teach the model to
    give them with those probabilities, instead of memorising one answer per prompt.

    ``until(step)`` is asked every ``check_every`` steps (model in eval mode) whether the skill the
    demonstrations teach is there yet; True ends training early (``steps`` is then the ceiling).

    ``schedule``: linear warm-up over the first 5% of ``steps``, then ``"cosine"`` decay to 10% at
    ``steps`` or ``"constant"`` (for a run that ends at a check: a decay towards a ceiling it may never
    reach only slows the steps it does take). ``weight_decay``: AdamW's, decoupled."""
    import torch
    from tqdm import tqdm

    if schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
    if weights is not None and len(weights) != len(episodes):
        raise ValueError(f"{len(weights)} weights for {len(episodes)} episodes")
    keep = [i for i, e in enumerate(episodes) if not e.masked and e.num_model_tokens]
    usable = [episodes[i] for i in keep]
    usable_weights = [float(weights[i]) for i in keep] if weights is not None else None
    if not usable or (usable_weights is not None and sum(usable_weights) <= 0):
        raise ValueError("no usable demonstration episodes")
    rng = random.Random(seed)
    optimizer = MasterWeightAdamW(model.parameters(), lr=lr, weight_decay=weight_decay)  # fp32 masters for bf16/fp16
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, factor)
    device = next(model.parameters()).device
    losses: list[float] = []
    model.train()
    for _ in tqdm(range(steps), desc="SFT warm start", unit="step", disable=not progress):
        if usable_weights is None:
            chosen = rng.sample(usable, min(batch_size, len(usable)))
        else:
            chosen = rng.choices(usable, weights=usable_weights, k=batch_size)
        batch = episodes_to_batch(chosen, pad_token_id=pad_token_id)
        mask = batch.response_mask.to(device).float()
        logprobs = response_logprobs(model, batch)
        loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if math.isfinite(optimizer.clip_grad_norm_(1.0)):
            optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
        done = len(losses)
        if until is not None and done % check_every == 0 and done < steps:
            model.eval()
            stop = until(done)
            model.train()
            if stop:
                break
    model.eval()
    return losses
