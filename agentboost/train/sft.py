"""Supervised warm start on demonstration episodes, through the same token/mask machinery as RL.

Demonstrations are real episodes: the scripted assistant turns are played by a
:class:`~agentboost.backends.scripted.ScriptedBackend` inside the real Strands agent with its real
tools, so the demo tokens, tool results and loss masks are exactly what a rollout would produce.
SFT then maximises the log-likelihood of the model tokens (mask 1) of those episodes.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from ..utils.gc_pause import collection_deferred
from ..utils.interrupts import held_interrupts
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

    with collection_deferred():
        return asyncio.run(everything())


class SFTRun:
    """Supervised fine-tuning on the model tokens (mask 1) of ``episodes``, one step at a time, with its
    whole state (step, losses, batch sampler, optimizer with its fp32 masters, schedule) in
    :meth:`state_dict` so that an interrupted warm start resumes where it was saved. :func:`sft` runs one
    to the end; see there for the options."""

    def __init__(
        self,
        model: Any,
        episodes: list[Episode],
        *,
        pad_token_id: int,
        steps: int,
        lr: float = 1e-3,
        batch_size: int = 16,
        seed: int = 0,
        weights: Sequence[float] | None = None,
        weight_decay: float = 0.0,
        schedule: str = "cosine",
    ) -> None:
        import torch

        if schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
        if weights is not None and len(weights) != len(episodes):
            raise ValueError(f"{len(weights)} weights for {len(episodes)} episodes")
        keep = [i for i, e in enumerate(episodes) if not e.masked and e.num_model_tokens]
        self.usable = [episodes[i] for i in keep]
        self.weights = [float(weights[i]) for i in keep] if weights is not None else None
        if not self.usable or (self.weights is not None and sum(self.weights) <= 0):
            raise ValueError("no usable demonstration episodes")
        self.model = model
        self.pad_token_id = pad_token_id
        self.steps = steps
        self.batch_size = batch_size
        self.rng = random.Random(seed)
        # fp32 masters for bf16/fp16 weights
        self.optimizer = MasterWeightAdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        warmup = max(1, steps // 20)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            if schedule == "constant":
                return 1.0
            progress = (step - warmup) / max(1, steps - warmup)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer.optimizer, factor)
        self.losses: list[float] = []
        self.last_lr = 0.0
        """The learning rate of the last step."""
        self.focus: dict[int, float] = {}
        """Loss weight per class of model token (:func:`agentboost.train.forced.response_classes`); others 1."""
        self._classes: dict[int, list[list[int | None]]] = {}

    @property
    def step(self) -> int:
        return len(self.losses)

    def restart(self, steps: int) -> None:
        """Go on from freshly initialised weights (the caller put them into the model): a new optimizer
        (its fp32 masters and moments were the old weights') and a new warm-up; ``steps`` more steps at
        most; no :attr:`focus`. The step count and the losses go on."""
        import torch

        lr = self.optimizer.optimizer.param_groups[0]["initial_lr"]
        decay = self.optimizer.optimizer.param_groups[0]["weight_decay"]
        self.optimizer = MasterWeightAdamW(self.model.parameters(), lr=lr, weight_decay=decay)
        start, factor = self.step, self.scheduler.lr_lambdas[0]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer.optimizer, factor)
        self.steps = start + steps
        self.focus = {}  # what the old weights got wrong says nothing about fresh ones

    def train_step(self) -> float:
        """One optimiser step on a batch drawn as :func:`sft` says; returns its loss (the token mean; with
        :attr:`focus`, the step follows the weighted mean)."""
        if self.weights is None:
            chosen = self.rng.sample(self.usable, min(self.batch_size, len(self.usable)))
        else:
            chosen = self.rng.choices(self.usable, weights=self.weights, k=self.batch_size)
        device = next(self.model.parameters()).device
        batch = episodes_to_batch(chosen, pad_token_id=self.pad_token_id)
        mask = batch.response_mask.to(device).float()
        self.model.train()
        logprobs = response_logprobs(self.model, batch)
        loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)
        recorded = loss  # the plain token mean, focused or not: losses stay comparable along the run
        if self.focus:
            weighted = mask * self._focus_weights(chosen, mask.shape).to(device)
            loss = -(logprobs * weighted).sum() / weighted.sum().clamp(min=1.0)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.last_lr = float(self.optimizer.optimizer.param_groups[0]["lr"])
        if math.isfinite(self.optimizer.clip_grad_norm_(1.0)):
            self.optimizer.step()
        self.scheduler.step()
        self.losses.append(float(recorded.detach()))
        return self.losses[-1]

    def _focus_weights(self, chosen: list[Episode], shape: Any) -> Any:
        """Per response position of the batch of ``chosen``: its class's :attr:`focus` weight, else 1."""
        import torch

        from .forced import response_classes

        weights = torch.ones(shape)
        row = 0
        for episode in chosen:
            classes = self._classes.get(id(episode))
            if classes is None:
                classes = self._classes[id(episode)] = response_classes(episode, self.pad_token_id)
            for row_classes in classes:
                for j, c in enumerate(row_classes[: shape[1]]):
                    if c is not None and c in self.focus:
                        weights[row, j] = self.focus[c]
                row += 1
        return weights

    def run(
        self,
        *,
        until: Callable[[int], bool] | None = None,
        check_every: int = 100,
        after_check: Callable[[int, bool], None] | None = None,
        on_step: Callable[[int, float], None] | None = None,
        on_interrupt: Callable[[int], None] | None = None,
    ) -> list[float]:
        """Steps up to ``steps`` (from wherever this run stands). Every ``check_every`` steps before the
        last, ``until(step)`` (model in eval mode; True ends the run) and then ``after_check(step, stop)``
        are called (either may be None: with ``after_check`` alone, it is a periodic save). With
        ``on_interrupt`` (a save), Ctrl-C ends the step in hand, calls it and raises ``KeyboardInterrupt``:
        a warm start interrupted before its first check resumes where it was (a second Ctrl-C: at once)."""
        holding = held_interrupts() if on_interrupt is not None else contextlib.nullcontext(lambda: False)
        with holding as interrupted:
            while self.step < self.steps:
                loss = self.train_step()
                done = self.step
                if on_step is not None:
                    on_step(done, loss)
                if done % check_every == 0 and done < self.steps and (until is not None or after_check is not None):
                    stop = False
                    if until is not None:
                        self.model.eval()
                        stop = bool(until(done))
                        self.model.train()
                    if after_check is not None:
                        after_check(done, stop)
                    if stop:
                        break
                if interrupted():
                    self.model.eval()
                    assert on_interrupt is not None
                    on_interrupt(done)
                    raise KeyboardInterrupt
        self.model.eval()
        return self.losses

    # -- resuming -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything but the model's weights (saved by the caller, who knows which are trained)."""
        import torch

        return {
            "losses": list(self.losses),
            "rng": self.rng.getstate(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "focus": sorted(self.focus.items()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        self.losses = [float(x) for x in state["losses"]]
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        self.focus = {int(c): float(w) for c, w in state.get("focus", [])}  # saved before focus existed: none


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
    from tqdm import tqdm

    run = SFTRun(
        model, episodes, pad_token_id=pad_token_id, steps=steps, lr=lr, batch_size=batch_size, seed=seed,
        weights=weights, weight_decay=weight_decay, schedule=schedule,
    )  # fmt: skip
    with tqdm(total=steps, desc="SFT warm start", unit="step", disable=not progress) as bar:
        return run.run(until=until, check_every=check_every, on_step=lambda _step, _loss: bar.update(1))
