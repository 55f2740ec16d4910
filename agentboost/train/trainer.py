"""A single-machine GRPO trainer (one process; CPU or one GPU) for Strands agents.

Rollouts run through the same :func:`~agentboost.rollout.run_episode` as everywhere else, with the
in-process backend sharing the *live* policy weights (every rollout comes from the current policy).
Episodes become a batch through :func:`agentboost.batch.episodes_to_batch`, the conversion the
rLLM/veRL path uses too. Then GRPO as veRL computes it (:mod:`agentboost.train.grpo`): group-normalised
advantages, dual-clipped policy-gradient loss over the loss-masked response tokens (token-mean) with
log-probs at the sampling temperature, optional KL to a frozen reference (the policy as GRPO starts,
i.e. after any warm start), gradient clipping; a step with a non-finite gradient norm is skipped and
counted. Low-precision (bf16/fp16) weights are trained through fp32 master copies. Checkpoints every
``save_every`` steps (model, optimizer with its masters, KL reference); ``resume=True`` continues from
the last one. A step whose every episode failed or was masked (nothing to train on), or
``max_steps_without_signal`` steps in a row in which no group had a reward spread (nothing to learn: the
first one is warned about), stop the run with :class:`TrainingStopped` naming the cause;
:meth:`GRPOTrainer.check_first_step` plays the first step's episodes before a run's long work.

Multi-GPU and multi-node training is rLLM/veRL's job; this trainer is for a laptop, a single GPU,
debugging an environment and reward on a small model before a large run, and the quickstart.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..agents.strands_agent import StrandsAgent
from ..backends.hf_local import HFLocalBackend
from ..batch import Batch, compact, episodes_to_batch, length_chunks, row_advantages, select_rows
from ..chat.template import ChatTemplate
from ..episode import Episode
from ..rollout import RolloutSettings, run_episode
from ..types import Budget, SamplingParams
from ..utils.refs import resolve
from .grpo import policy_loss
from .logprobs import output_logits_fn, response_logprobs
from .metrics import MetricsLogger
from .optim import MasterWeightAdamW
from .progress import phase_bar

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    run_dir: str = "runs/train"
    steps: int = 40
    prompts_per_step: int = 8
    group_size: int = 8
    lr: float = 1e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (veRL's default)."""
    kl_coef: float = 0.0
    ppo_epochs: int = 1
    minibatches: int = 1
    normalize_adv_std: bool = True
    eval_every: int = 10
    save_every: int = 10
    seed: int = 0
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=1.0, max_tokens_per_call=64))
    eval_sampling: SamplingParams = field(
        default_factory=lambda: SamplingParams(temperature=0.0, max_tokens_per_call=64)
    )
    budget: Budget = field(default_factory=lambda: Budget(max_turns=4, max_total_tokens=1024, wall_clock_s=300))
    train_aux_calls: bool = True
    """Train the calls made without an agent (a summariser calling the model): :class:`RolloutSettings`."""
    micro_batch_tokens: int | None = 16384
    """Rows of a minibatch run forward and backward in chunks of similar length, each about this many
    tokens (rows x longest row), gradients accumulated over the chunks and weighted so the loss is
    the minibatch's token-mean exactly as in one pass. Bounds memory and spares short episodes the
    padding of the longest. None: the whole minibatch in one pass."""
    logprob_gap_alarm: float | None = 0.5
    """Stop when the mean |rollout - trainer| logprob gap on loss tokens exceeds this (stale rollouts)."""
    max_steps_without_signal: int = 5
    """Stop (:class:`TrainingStopped`) after this many steps in a row in which no group had a reward spread:
    every episode of each task got the same reward, so the policy gradient is zero and the step changes
    nothing (0: never stop). The first such step of a streak is warned about."""
    wandb_project: str | None = "agentboost"
    wandb_mode: str | None = None
    """W&B mode: offline, online or disabled (default: $WANDB_MODE, else online with $WANDB_API_KEY, else offline)."""
    tensorboard: bool = False
    """Also write TensorBoard event files to ``<run_dir>/tensorboard`` (needs the tensorboard package)."""
    eval_n: int = 1
    """Samples per held-out row in every evaluation (pass@k needs more than one, at a temperature > 0)."""
    eval_ks: tuple[int, ...] = ()
    """pass@k reported for these k (default: 1, 2, 4, ... up to eval_n)."""

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(
                f"group_size must be >= 2, got {self.group_size}: GRPO's advantage is an episode's reward against "
                "the others of its group, so a group of one never has a signal"
            )
        if self.max_steps_without_signal < 0:
            raise ValueError(
                f"max_steps_without_signal must be >= 0 (0: never stop), got {self.max_steps_without_signal}"
            )
        if self.sampling.temperature <= 0:
            raise ValueError(
                "training rollouts need a sampling temperature > 0: greedy samples of a prompt are all alike "
                "(no GRPO signal), and the loss's log-probs are taken at the sampling temperature"
            )
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1 or None (one pass), got {self.micro_batch_tokens}")
        for name in ("ppo_epochs", "minibatches", "eval_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if any(k < 1 or k > self.eval_n for k in self.eval_ks):
            raise ValueError(f"every pass@k k must be in 1..eval_n={self.eval_n}, got {list(self.eval_ks)}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sampling"] = self.sampling.to_dict()
        data["eval_sampling"] = self.eval_sampling.to_dict()
        data["budget"] = self.budget.to_dict()
        data["eval_ks"] = list(self.eval_ks)
        return data

    def pass_ks(self) -> list[int]:
        """The k of the pass@k the evaluations report."""
        from ..evaluation.passk import default_ks

        return sorted(set(self.eval_ks)) if self.eval_ks else default_ks(self.eval_n)


class StaleRolloutError(RuntimeError):
    """Rollout log-probabilities disagree with the trainer's: rollouts did not come from the policy."""


class TrainingStopped(RuntimeError):
    """The run cannot go on, its message names why: every episode of a step failed or was masked (no token to
    train on), no step had a trainable signal for ``max_steps_without_signal`` steps in a row, or every
    held-out episode failed."""


def unusable(episodes: list[Episode], what: str) -> str | None:
    """Why ``episodes`` give nothing to train on (every one masked: ``infra_error``, ``context_overflow``, ...),
    naming the most common cause; None when some can be trained on."""
    if not episodes or any(not e.masked for e in episodes):
        return None
    ends = Counter(e.termination.value for e in episodes)
    detail = Counter(e.termination_detail for e in episodes).most_common(1)[0][0]
    how = ", ".join(f"{n} {end}" for end, n in ends.most_common())
    return f"{what}: all {len(episodes)} episodes ended masked ({how}), so there is nothing to train on: {detail}"


class GRPOTrainer:
    """GRPO on one machine.

    Args:
        model: a Hugging Face causal LM (``nn.Module``; a peft model for LoRA) being trained.
        template: the :class:`ChatTemplate` of its tokenizer.
        train_rows: dataset rows (``StrandsEnv.from_dict`` input).
        eval_rows: held-out rows, the same.
        env: environment class or reference; ``env_args`` are merged into every row.
        agent: the :class:`StrandsAgent` (factory / system prompt) used for every episode.
    """

    def __init__(
        self,
        model: Any,
        template: ChatTemplate,
        train_rows: list[dict[str, Any]],
        *,
        eval_rows: list[dict[str, Any]] | None = None,
        env: Any = "agentboost.environments.strands_env:StrandsEnv",
        env_args: dict[str, Any] | None = None,
        agent: StrandsAgent | None = None,
        config: TrainConfig | None = None,
        device: str | None = None,
    ) -> None:
        import torch

        self.config = config or TrainConfig()
        self.model = model
        self.template = template
        self.train_rows = list(train_rows)
        self.eval_rows = list(eval_rows or [])
        self.env_cls = resolve(env)
        self.env_args = dict(env_args or {})
        self.agent = agent or StrandsAgent()
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.pad_token_id = int(template.tokenizer.pad_token_id or 0)
        concurrency = self.config.prompts_per_step * self.config.group_size
        self.backend = HFLocalBackend(
            model,
            device=str(self.device),
            max_batch_size=max(concurrency, len(self.eval_rows) * self.config.eval_n, 1),
            pad_token_id=self.pad_token_id,
        )
        output_logits_fn(model)  # refuse a model whose output head the loss would not reproduce, now
        self.optimizer = MasterWeightAdamW(model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay)
        self.reference: Any = None
        """Frozen copy of the policy as GRPO starts (KL target); made by :meth:`fit`, restored on resume."""
        self._reference_state: dict[str, Any] | None = None
        self.run_dir = Path(self.config.run_dir)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.last_eval_episodes: list[Episode] = []
        """The episodes of the latest :meth:`evaluate` (logged as a W&B trajectory table by :meth:`fit`)."""
        self._order: list[int] = []
        self._cursor = 0
        self._rng = random.Random(self.config.seed)
        self._first_step: list[Episode] | None = None
        """Step 1's episodes when :meth:`check_first_step` played them (the policy has not changed since)."""
        self.steps_without_signal = 0
        """Steps in a row, up to the last, in which no group had a reward spread."""
        self.warm_start_steps = 0
        """Steps a warm start trained the policy before GRPO (set by the run; part of :meth:`policy_name`)."""

    # -- rollouts -------------------------------------------------------------------------------
    def rollout(
        self,
        rows: list[dict[str, Any]],
        *,
        n: int,
        sampling: SamplingParams,
        tag: str,
        on_episode: Callable[[Episode], None] | None = None,
    ) -> list[Episode]:
        """``n`` episodes of every row from the live policy (``on_episode`` is called as each finishes)."""
        settings = RolloutSettings(sampling=sampling, budget=self.config.budget,
                                   train_aux_calls=self.config.train_aux_calls)  # fmt: skip
        self.backend.policy = self.policy_name()

        async def one(row: dict[str, Any], i: int, k: int) -> Episode:
            env = self.env_cls.from_dict({**row, **self.env_args})
            agent = StrandsAgent(self.agent.agent_factory, self.agent.system_prompt, **self.agent.agent_kwargs)
            group = f"{tag}:{i}"
            episode_settings = settings
            if sampling.temperature > 0 and sampling.seed is None:  # reproducible whatever the batching
                seed = int.from_bytes(
                    hashlib.blake2b(f"{self.config.seed}:{group}:{k}".encode(), digest_size=4).digest(), "big"
                )
                episode_settings = replace(settings, sampling=sampling.replace(seed=seed))
            episode = await run_episode(
                env, agent, self.backend, self.template, episode_settings,
                episode_id=f"{group}:{k}", group_id=group, task_id=str(row.get("task_id", i)),
            )  # fmt: skip
            episode.metadata["group_id"] = group
            if on_episode is not None:
                on_episode(episode)
            return episode

        async def everything() -> list[Episode]:
            return list(await asyncio.gather(*(one(r, i, k) for i, r in enumerate(rows) for k in range(n))))

        return asyncio.run(everything())

    def policy_name(self) -> str | None:
        """What the policy is now, when training changed it (the episodes' ``backend``): the model it was
        loaded from and the steps since, e.g. ``models/Qwen + 200 warm-start steps + 20 GRPO steps in
        runs/x``; None before any."""
        trained = [f"{n} {what} steps" for n, what in ((self.warm_start_steps, "warm-start"), (self.step, "GRPO")) if n]
        if not trained:
            return None
        base = getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__
        return f"{base} + {' + '.join(trained)} in {self.run_dir}"

    def _next_rows(self) -> list[dict[str, Any]]:
        rows = []
        for _ in range(self.config.prompts_per_step):
            if self._cursor >= len(self._order):
                self._order = list(range(len(self.train_rows)))
                self._rng.shuffle(self._order)
                self._cursor = 0
            rows.append(self.train_rows[self._order[self._cursor]])
            self._cursor += 1
        return rows

    def check_first_step(self, *, keep: bool) -> None:
        """Play the first GRPO step's rows now, before the long work (a warm start, held-out evaluation):
        raises :class:`TrainingStopped` when every episode fails or is masked (a reward that raises or is not
        a number, an agent factory that raises, rows that overflow the context). ``keep``: the policy will
        not change before step 1 (no warm start), so these are step 1's groups, played once; otherwise one
        episode per row, and step 1 draws the same rows again."""
        cfg = self.config
        state = (list(self._order), self._cursor, self._rng.getstate())
        rows = self._next_rows()
        if keep:
            episodes = self.rollout(rows, n=cfg.group_size, sampling=cfg.sampling, tag=f"s{self.step}")
            self._first_step = episodes
        else:
            self._order, self._cursor = state[0], state[1]
            self._rng.setstate(state[2])
            episodes = self.rollout(rows, n=1, sampling=cfg.sampling, tag="first-step-check")
        failure = unusable(episodes, "the first GRPO step's episodes")
        if failure is not None:
            raise TrainingStopped(failure)

    # -- one update ------------------------------------------------------------------------------
    def update(self, episodes: list[Episode]) -> dict[str, float]:
        import torch

        cfg = self.config
        batch = episodes_to_batch(episodes, pad_token_id=self.pad_token_id)
        advantages = row_advantages(batch, normalize_std=cfg.normalize_adv_std)
        mask = batch.response_mask.to(self.device)
        temperature = cfg.sampling.temperature  # the distribution the rollouts were sampled from
        if cfg.kl_coef > 0 and self.reference is None:
            self.ensure_reference()
        everything = self._chunks(batch, list(range(len(batch))))
        with torch.no_grad():
            self.model.eval()
            old, old_raw = _chunked_logprobs(self.model, batch, everything, temperature=temperature, with_raw=True)
            ref = None
            if self.reference is not None and cfg.kl_coef > 0:
                ref, _ = _chunked_logprobs(self.reference, batch, everything, temperature=temperature)
        n_loss = float(mask.sum())
        # Backends report temperature-1 log-probs (vLLM's default): compare like with like.
        gap = ((old_raw - batch.rollout_log_probs.to(self.device)).abs() * mask).sum() / max(n_loss, 1.0)
        metrics: dict[str, float] = {"logprob_gap": float(gap), "loss_tokens": n_loss}
        if cfg.logprob_gap_alarm is not None and float(gap) > cfg.logprob_gap_alarm:
            raise StaleRolloutError(
                f"mean |rollout - trainer| logprob gap {float(gap):.3f} > {cfg.logprob_gap_alarm}: rollouts are stale"
            )
        metrics["advantage_abs_mean"] = float(advantages.abs().mean())
        metrics["groups_with_signal"] = float(_groups_with_signal(batch))
        if not n_loss:
            logger.warning("step %d: no loss token in the batch (every episode masked or without a trained "
                           "trajectory): no update", self.step + 1)  # fmt: skip
            metrics["skipped_update"] = 1.0
            return metrics
        if not bool((advantages != 0).any()) and ref is None:
            # No group has a reward spread: the gradient is zero, and an Adam step would still move
            # the weights along stale momentum. Skip the update.
            metrics["skipped_update"] = 1.0
            return metrics
        metrics["skipped_update"] = 0.0
        self.model.train()
        rows = list(range(len(batch)))
        sums: Counter[str] = Counter()
        updates = skipped = 0
        for _ in range(cfg.ppo_epochs):
            self._rng.shuffle(rows)
            size = math.ceil(len(rows) / cfg.minibatches)
            for start in range(0, len(rows), size):
                idx = rows[start : start + size]
                tokens = float(mask[idx].sum())
                if not tokens:  # every row masked: no loss, and an Adam step would still move the weights
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                parts: Counter[str] = Counter()
                for chunk in self._chunks(batch, idx):
                    if not bool(mask[chunk].any()):  # masked rows only: its share of the loss is 0
                        continue
                    sub = compact(select_rows(batch, chunk))
                    width = sub.responses.shape[1]
                    new = response_logprobs(self.model, sub, temperature=temperature)
                    loss, chunk_parts = policy_loss(
                        new, old[chunk, :width], advantages[chunk].to(self.device), mask[chunk, :width],
                        clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_ratio_c=cfg.clip_ratio_c,
                        ref_logprobs=None if ref is None else ref[chunk, :width], kl_coef=cfg.kl_coef,
                    )  # fmt: skip
                    # A chunk's token-mean, weighted by its share of the minibatch's loss tokens: the
                    # accumulated gradient is the minibatch token-mean's.
                    share = chunk_parts["loss_tokens"] / tokens
                    with self.backend.lock:
                        (loss * share).backward()
                        self.optimizer.accumulate()  # summed in fp32 across chunks (bf16 parameters)
                    parts.update({k: v * share for k, v in chunk_parts.items() if k != "loss_tokens"})
                parts["loss_tokens"] = tokens
                with self.backend.lock:
                    grad_norm = self.optimizer.clip_grad_norm_(cfg.grad_clip)
                    if math.isfinite(grad_norm):
                        self.optimizer.step()
                    else:  # one bad minibatch must not write inf/nan into the weights (veRL skips too)
                        self.optimizer.zero_grad(set_to_none=True)
                        skipped += 1
                        logger.warning("step %d: gradient norm %s, minibatch update skipped", self.step + 1, grad_norm)
                if math.isfinite(grad_norm):
                    parts["grad_norm"] = grad_norm
                    sums.update(parts)
                    updates += 1
        metrics.update({k: v / updates for k, v in sums.items()} if updates else {})
        metrics["nonfinite_grad_skips"] = float(skipped)
        return metrics

    def _chunks(self, batch: Batch, idx: list[int]) -> list[list[int]]:
        budget = self.config.micro_batch_tokens
        return length_chunks(batch, idx, budget) if budget else [list(idx)]

    # -- KL reference -------------------------------------------------------------------------------
    def ensure_reference(self) -> Any:
        """The frozen KL reference: the policy as it stands when GRPO starts (after any warm start), or
        the one saved with the checkpoint being resumed."""
        if self.reference is None:
            reference = copy.deepcopy(self.model).eval()
            for p in reference.parameters():
                p.requires_grad_(False)
            if self._reference_state is not None:
                reference.load_state_dict(self._reference_state, strict=False)
                self._reference_state = None
            self.reference = reference
        return self.reference

    # -- evaluation --------------------------------------------------------------------------------
    def evaluate(
        self,
        rows: list[dict[str, Any]] | None = None,
        *,
        tag: str = "eval",
        on_episode: Callable[[Episode], None] | None = None,
    ) -> dict[str, float]:
        """``eval_n`` episodes of every held-out row at ``eval_sampling``: the rollout metrics and pass@k
        (``eval/pass@k``, the unbiased estimator over each row's samples), all under ``eval/``."""
        rows = rows if rows is not None else self.eval_rows
        if not rows:
            return {}
        n = self.config.eval_n
        episodes = self.rollout(rows, n=n, sampling=self.config.eval_sampling, tag=tag, on_episode=on_episode)
        self.last_eval_episodes = episodes
        metrics = {f"eval/{k}": v for k, v in episode_metrics(episodes).items()}
        metrics.update({f"eval/{k}": v for k, v in pass_metrics(episodes, n, self.config.pass_ks()).items()})
        return metrics

    # -- the loop ------------------------------------------------------------------------------------
    def open_log(self) -> MetricsLogger:
        """The run's metrics (CSV, W&B, TensorBoard), from this trainer's step (later rows are dropped)."""
        cfg = self.config
        return MetricsLogger(self.run_dir, project=cfg.wandb_project, config=cfg.to_dict(), wandb_mode=cfg.wandb_mode,
                             tensorboard=cfg.tensorboard, resume_step=self.step)  # fmt: skip

    def fit(
        self, *, resume: bool = True, progress: bool = True, desc: str = "GRPO", log: MetricsLogger | None = None
    ) -> list[dict[str, Any]]:
        """GRPO to ``config.steps`` (from the last checkpoint with ``resume``). ``log``: the run's metrics,
        opened by the caller (who closes it; a warm start logged to it first), else opened and closed here."""
        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            self.load_checkpoint()
        if cfg.kl_coef > 0:
            self.ensure_reference()
        owned = log is None
        log = self.open_log() if log is None else log
        bar = phase_bar(desc, cfg.steps, unit="step", progress=progress, initial=self.step)
        try:
            while self.step < cfg.steps:
                started = time.monotonic()
                if self._first_step is not None and self.step == 0:
                    episodes, self._first_step = self._first_step, None
                else:
                    rows = self._next_rows()
                    episodes = self.rollout(rows, n=cfg.group_size, sampling=cfg.sampling, tag=f"s{self.step}")
                failure = unusable(episodes, f"GRPO step {self.step + 1}")
                if failure is not None:
                    raise TrainingStopped(failure)
                rollout_s = time.monotonic() - started
                metrics = {"step": self.step + 1, **episode_metrics(episodes)}
                metrics.update(self.update(episodes))
                metrics["rollout_s"] = rollout_s
                metrics["step_s"] = time.monotonic() - started
                self.step += 1
                stop = self._count_signal(metrics, episodes)
                if cfg.eval_every and self.step % cfg.eval_every == 0:
                    bar.set_postfix_str(f"evaluating {len(self.eval_rows) * cfg.eval_n} held-out episodes")
                    metrics.update(self.evaluate(tag=f"e{self.step}"))
                    log.log_episodes("eval", self.last_eval_episodes, step=self.step)
                self.history.append(metrics)
                log.log(metrics)
                bar.update(1)
                postfix = {"reward": f"{metrics['reward_mean']:.2f}", "success": f"{metrics['success_rate']:.2f}"}
                last_eval = next((h for h in reversed(self.history) if "eval/success_rate" in h), None)
                if last_eval is not None:
                    postfix["held-out"] = f"{last_eval['eval/success_rate']:.2f}"
                bar.set_postfix(postfix)
                if cfg.save_every and (self.step % cfg.save_every == 0 or self.step == cfg.steps):
                    self.save_checkpoint()
                if stop is not None:
                    raise TrainingStopped(stop)
        finally:
            bar.close()
            if owned:
                log.close()
        return self.history

    def _count_signal(self, metrics: dict[str, float], episodes: list[Episode]) -> str | None:
        """Count the steps in a row without a reward spread in any group (the first of a streak is warned
        about); the reason to stop once there are ``max_steps_without_signal`` of them, else None."""
        limit = self.config.max_steps_without_signal
        if metrics.get("groups_with_signal", 0.0) > 0:
            if self.steps_without_signal:
                logger.info("GRPO step %d: a reward spread again, after %d steps without", self.step,
                            self.steps_without_signal)  # fmt: skip
            self.steps_without_signal = 0
            return None
        self.steps_without_signal += 1
        rewards = sorted({round(e.reward, 4) for e in episodes if not e.masked})
        same = (
            f"every episode got reward {rewards[0]:g}" if len(rewards) == 1 else "each task's episodes got one reward"
        )
        cause = f"no group had a reward spread ({same}), so GRPO had nothing to learn"
        if limit and self.steps_without_signal >= limit:
            return (f"{self.steps_without_signal} GRPO steps in a row (to step {self.step}): {cause}; check the "
                    "reward, warm the policy up first (one that never succeeds has no signal) or raise "
                    "--max-steps-without-signal (0: never stop)")  # fmt: skip
        if self.steps_without_signal == 1:
            stop = f"; {limit} such steps in a row stop the run (max_steps_without_signal)" if limit else ""
            logger.warning("GRPO step %d: %s from this step%s", self.step, cause, stop)
        return None

    # -- checkpoints ------------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        import torch

        path = self.run_dir / "checkpoint"
        tmp = self.run_dir / "checkpoint.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), tmp / "model_state.pt")
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        if self.reference is not None:  # only what can differ from the policy's frozen weights
            trainable = {name for name, p in self.model.named_parameters() if p.requires_grad}
            state = {k: v for k, v in self.reference.state_dict().items() if k in trainable}
            torch.save(state, tmp / "reference_state.pt")
        state = {
            "step": self.step,
            "history": self.history,
            "order": self._order,
            "cursor": self._cursor,
            "rng": self._rng.getstate(),
            "torch_rng": torch.get_rng_state().tolist(),
            "steps_without_signal": self.steps_without_signal,
        }
        (tmp / "trainer_state.json").write_text(json.dumps(state))
        if path.exists():
            import shutil

            shutil.rmtree(path)
        tmp.rename(path)
        return path

    def load_checkpoint(self) -> bool:
        import torch

        path = self.run_dir / "checkpoint"
        if not (path / "trainer_state.json").is_file():
            return False
        self.model.load_state_dict(torch.load(path / "model_state.pt", map_location=self.device))
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=self.device))
        self.reference = None
        self._reference_state = None
        if (path / "reference_state.pt").is_file():
            self._reference_state = torch.load(path / "reference_state.pt", map_location=self.device)
        state = json.loads((path / "trainer_state.json").read_text())
        if self._reference_state is None and self.config.kl_coef > 0 and int(state["step"]) > 0:
            logger.warning("%s has no KL reference (saved with kl_coef=0): the resumed policy becomes it", path)
        self.step = int(state["step"])
        self.history = list(state["history"])
        self._order, self._cursor = list(state["order"]), int(state["cursor"])
        self.steps_without_signal = int(state.get("steps_without_signal", 0))
        rng_state = state["rng"]
        self._rng.setstate((rng_state[0], tuple(rng_state[1]), rng_state[2]))
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        logger.info("resumed from %s at step %d", path, self.step)
        return True


def _groups_with_signal(batch: Any) -> int:
    """Groups whose unmasked members do not all have the same reward."""
    rewards: dict[str, set[float]] = {}
    for i, group in enumerate(batch.group_ids):
        if not batch.masked[i]:
            rewards.setdefault(group, set()).add(float(batch.rewards[i]))
    return sum(1 for values in rewards.values() if len(values) > 1)


def _chunked_logprobs(
    model: Any, batch: Batch, chunks: list[list[int]], *, temperature: float, with_raw: bool = False
) -> tuple[Any, Any]:
    """``response_logprobs`` of the whole batch (and its temperature-1 values with ``with_raw``), run
    chunk by chunk with each chunk's padding trimmed."""
    import torch

    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
    raw = torch.zeros_like(out) if with_raw else None
    for chunk in chunks:
        sub = compact(select_rows(batch, chunk))
        width = sub.responses.shape[1]
        values = response_logprobs(model, sub, temperature=temperature, with_raw=with_raw)
        rows = torch.tensor(chunk, dtype=torch.long)
        if with_raw:
            values, raw_values = values
            raw[rows, :width] = raw_values.float().cpu()
        out[rows, :width] = values.float().cpu()
    device = next(model.parameters()).device
    return out.to(device), None if raw is None else raw.to(device)


def pass_metrics(episodes: list[Episode], n: int, ks: list[int], threshold: float = 1.0) -> dict[str, float]:
    """``pass@k`` for every k (at most ``n``): the unbiased estimator per row (its episodes share a
    group id), averaged over rows; success as the evaluator counts it."""
    from ..evaluation.passk import pass_at_k
    from ..evaluation.report import is_success

    by_row: dict[str, list[bool]] = {}
    for episode in episodes:
        key = str(episode.metadata.get("group_id") or episode.task_id)
        by_row.setdefault(key, []).append(is_success(episode, threshold))
    out: dict[str, float] = {}
    for k in ks:
        usable = [row for row in by_row.values() if len(row) >= k]
        if usable:
            out[f"pass@{k}"] = sum(pass_at_k(len(row), sum(row), k) for row in usable) / len(usable)
    return out


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Per-step rollout metrics: reward, success, tool use, terminations, lengths."""
    n = max(len(episodes), 1)
    correct = [e.is_correct for e in episodes if e.is_correct is not None]
    terminations = Counter(e.termination.value for e in episodes)
    out = {
        "reward_mean": sum(e.reward for e in episodes) / n,
        "success_rate": sum(bool(c) for c in correct) / len(correct) if correct else 0.0,
        "tool_call_rate": sum(1 for e in episodes if e.tool_calls > 0) / n,
        "tool_calls_per_episode": sum(e.tool_calls for e in episodes) / n,
        "tool_error_rate": sum(e.tool_errors for e in episodes) / max(sum(e.tool_calls for e in episodes), 1),
        "parse_errors_per_episode": sum(e.parse_errors for e in episodes) / n,
        "turns_mean": sum(len(e.calls) for e in episodes) / n,
        "response_tokens_mean": sum(e.num_response_tokens for e in episodes) / n,
        "masked_fraction": sum(e.masked for e in episodes) / n,
        "trajectories_per_episode": sum(e.num_trajectories for e in episodes) / n,
        "rerendered_tokens_per_episode": sum(e.rerendered_tokens for e in episodes) / n,
    }
    for name, count in terminations.items():
        out[f"termination/{name}"] = count / n
    return out
