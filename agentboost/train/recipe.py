"""``agentboost train``: the built-in GRPO trainer on any environment and dataset (CPU or one GPU).

:class:`TrainOptions` holds every option (each one a flag, a key of the ``--config`` YAML file and a
line of ``--help``); :func:`train_plan` turns them into a run of the one training loop
(:func:`agentboost.train.run.run_training`), the loop the quickstart runs too:

* rows from ``--data`` (or an example's generated tasks), held-out rows from ``--eval-data`` or a
  seeded share of ``--data`` (``--eval-fraction``); every row builds its environment before anything
  runs;
* the model from a local directory (``--model``), trained whole or through LoRA adapters
  (``--lora-rank``);
* an optional warm start from episodes (``--sft-data``: successful rollouts as they are, a frontier
  model's episodes distilled through this model's chat template, :mod:`agentboost.train.sft_data`);
* GRPO with held-out evaluation (pass@k with ``--eval-n`` samples), checkpoints, metrics (CSV, W&B,
  TensorBoard), curves, ``summary.json``; ``agentboost export`` turns the run into a Hugging Face
  directory that transformers and vLLM load.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..agents.strands_agent import StrandsAgent
from ..types import Budget, SamplingParams
from .run import RunPlan, has_checkpoint, saved_config
from .starting_model import TINY, tiny_model, tiny_tokenizer
from .trainer import TrainConfig

logger = logging.getLogger(__name__)

GENERIC_ENV = "agentboost.environments.strands_env:StrandsEnv"


@dataclass
class TrainOptions:
    """The options of ``agentboost train`` (``--help`` shows every field's docstring)."""

    # -- what to train on
    data: str | None = None
    """Training rows (.jsonl, .json or .parquet), one task per row as the environment's from_dict reads it;
    optional with --example arithmetic or capitals (generated tasks)."""
    eval_data: str | None = field(default=None, metadata={"default_text": "--eval-fraction of --data"})
    """Held-out rows, evaluated before GRPO, every --eval-every steps and after."""
    eval_fraction: float = 0.1
    """Without --eval-data: the share of --data held out (seeded; at least one row when there are two or
    more; 0: no held-out evaluation)."""
    limit: int | None = None
    """Use the first N training rows."""
    eval_limit: int | None = 64
    """Evaluate at most N held-out rows."""
    example: str | None = None
    """An example's environment and system prompt (arithmetic, capitals, math, code, tau2, rag)."""
    env: str | None = None
    """Environment class, module:Class (overrides --example); agentboost.environments.strands_env:StrandsEnv
    takes each row's own tools and reward_fn."""
    env_args: dict[str, Any] = field(default_factory=dict, metadata={"flag": "--env-arg"})
    """Given to the environment with every row, e.g. reward_fn=mypkg.rewards:exact."""
    agent: str | None = None
    """Strands agent factory, module:function (called once per episode)."""
    system_prompt: str | None = field(default=None, metadata={"default_text": "the example's, else none"})
    """The agent's system prompt (without --agent)."""
    # -- the model
    model: str | None = None
    """A local Hugging Face model directory (config, weights, tokenizer with its chat template), or tiny: the
    quickstart's small model (random weights, no download) with a tokenizer trained on the rows, to see the
    loop run on a CPU (agentboost init-model writes one as a directory). Required."""
    tokenizer: str | None = field(default=None, metadata={"default_text": "--model's"})
    """The tokenizer: offline:<family> (offline:qwen2.5, offline:qwen3, ...), a local directory or a cached hub id;
    its vocabulary must fit the model's."""
    lora_rank: int = 0
    """LoRA rank (0: train every weight; agentboost export merges the adapters)."""
    lora_alpha: int | None = field(default=None, metadata={"default_text": "2 x --lora-rank"})
    """LoRA alpha."""
    device: str | None = field(default=None, metadata={"default_text": "cuda when there is one, else cpu"})
    """cpu, cuda or cuda:N."""
    dtype: str = "auto"
    """Weights' dtype: auto (bfloat16 on a GPU, float32 on a CPU), float32, bfloat16 or float16; low
    precision is trained through fp32 master weights."""
    # -- GRPO
    steps: int = 50
    """GRPO steps."""
    prompts_per_step: int = 8
    """Rows per GRPO step."""
    group_size: int = 8
    """Episodes per row (one GRPO group)."""
    lr: float = 1e-5
    """GRPO learning rate."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the policy as GRPO starts (0: none)."""
    temperature: float = 1.0
    """Sampling temperature of the training rollouts."""
    max_turns: int = 8
    """Model calls per episode."""
    max_total_tokens: int = 4096
    """Tokens per episode, prompt and tool results included."""
    max_tokens_per_call: int = 512
    """Tokens per model call."""
    episode_timeout: float = 300.0
    """Wall-clock seconds per episode."""
    train_aux_calls: bool = True
    """Train the calls made without an agent (a summarising conversation manager asking the policy for a
    summary); false: kept in the episodes, never a training row."""
    micro_batch_tokens: int | None = 16384
    """Tokens (rows x longest row) per forward/backward chunk of a minibatch (none: one pass)."""
    save_every: int = 10
    """GRPO steps between checkpoints (a rerun of the same command resumes from the last one)."""
    max_steps_without_signal: int = 5
    """Stop (exit 3) after this many GRPO steps in a row in which no group had a reward spread (every episode
    of each row got the same reward: nothing to learn); the first such step is warned about (0: never stop)."""
    # -- evaluation
    eval_every: int = 10
    """GRPO steps between held-out evaluations (0: only before and after)."""
    eval_n: int = 1
    """Samples per held-out row (pass@k needs more than one)."""
    eval_temperature: float | None = field(default=None, metadata={"default_text": "0 with --eval-n 1, else 1.0"})
    """Sampling temperature of the held-out evaluation."""
    eval_k: list[int] = field(default_factory=list, metadata={"default_text": "1, 2, 4, ... up to --eval-n"})
    """Report pass@k for this k."""
    success_threshold: float = 1.0
    """Reward counted as success when the environment gives no verdict."""
    # -- warm start from episodes
    sft_data: list[str] = field(default_factory=list)
    """Episodes to fine-tune on before GRPO (an episodes.jsonl of agentboost rollout or eval, or its
    directory): this model's successful rollouts as they are, other models' (a frontier model's through
    --strands-model) replayed through this model's chat template as distillation data."""
    sft_steps: int | None = field(default=None, metadata={"default_text": "3 epochs of the episodes"})
    """Warm-start steps."""
    sft_lr: float = 1e-5
    """Warm-start learning rate (cosine schedule after a 5% warm-up)."""
    sft_batch: int = 8
    """Episodes per warm-start step."""
    sft_weight_decay: float = 0.0
    """AdamW weight decay of the warm start."""
    # -- the run
    seed: int = 0
    """Seed of the held-out split, the warm start and GRPO."""
    run_dir: str = "runs/train"
    """Where everything goes; rerunning the same command resumes the run."""
    wandb_project: str | None = "agentboost"
    """W&B project (none: no W&B)."""
    wandb_mode: str | None = field(default=None, metadata={"default_text": "$WANDB_MODE, else offline"})
    """offline, online (needs WANDB_API_KEY) or disabled."""
    tensorboard: bool = True
    """Also write TensorBoard event files to <run-dir>/tensorboard (tensorboard --logdir <run-dir>)."""

    def __post_init__(self) -> None:
        problems = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                problems.append(f"--{f.name.replace('_', '-')} must be a finite number, got {value}")
        positive = ("steps", "prompts_per_step", "group_size", "max_turns", "max_total_tokens", "max_tokens_per_call",
                    "eval_n", "sft_batch")  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.group_size == 1:
            problems.append("--group-size must be >= 2: GRPO compares each episode with the others of its group")
        for name in (
            "lora_rank",
            "kl_coef",
            "eval_every",
            "save_every",
            "sft_weight_decay",
            "max_steps_without_signal",
        ):
            if getattr(self, name) < 0:
                problems.append(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "sft_lr", "temperature", "episode_timeout"):
            if not getattr(self, name) > 0:
                problems.append(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        for name in ("limit", "eval_limit", "sft_steps", "lora_alpha", "micro_batch_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1 or none, got {value}")
        if not 0.0 <= self.eval_fraction < 1.0:
            problems.append(f"--eval-fraction must be in [0, 1), got {self.eval_fraction}")
        if self.eval_temperature is not None and self.eval_temperature < 0:
            problems.append(f"--eval-temperature must be >= 0, got {self.eval_temperature}")
        if self.eval_n > 1 and self.eval_temperature == 0:
            problems.append(f"--eval-n {self.eval_n} at --eval-temperature 0 gives {self.eval_n} identical samples")
        bad_k = [k for k in self.eval_k if not 1 <= k <= self.eval_n]
        if bad_k:
            problems.append(f"every --eval-k must be in 1..--eval-n ({self.eval_n}), got {bad_k}")
        if self.wandb_mode not in (None, "offline", "online", "disabled"):
            problems.append(f"--wandb-mode must be offline, online or disabled, got {self.wandb_mode!r}")
        if self.model == TINY:
            given = [
                flag for flag, value in (("--tokenizer", self.tokenizer), ("--lora-rank", self.lora_rank)) if value
            ]
            if given or self.dtype not in ("auto", "float32"):
                problems.append(f"--model {TINY} trains every weight of a float32 model with its own tokenizer: "
                                f"drop {', '.join(given) or '--dtype ' + self.dtype}")  # fmt: skip
        if self.lora_alpha is not None and not self.lora_rank:
            problems.append("--lora-alpha needs --lora-rank")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def env_class(self) -> str | None:
        from ..evaluation.presets import PRESETS

        return self.env or (PRESETS[self.example].env if self.example in PRESETS else None)


FIELD_GROUPS = {
    **dict.fromkeys(("data", "eval_data", "eval_fraction", "limit", "eval_limit", "example", "env", "env_args",
                     "agent", "system_prompt"), "what to train on"),
    **dict.fromkeys(("model", "tokenizer", "lora_rank", "lora_alpha", "device", "dtype"), "the model"),
    **dict.fromkeys(("steps", "prompts_per_step", "group_size", "lr", "kl_coef", "temperature", "max_turns",
                     "max_total_tokens", "max_tokens_per_call", "episode_timeout", "micro_batch_tokens",
                     "save_every", "max_steps_without_signal"), "GRPO"),
    **dict.fromkeys(("eval_every", "eval_n", "eval_temperature", "eval_k", "success_threshold"),
                    "held-out evaluation"),
    **dict.fromkeys(("sft_data", "sft_steps", "sft_lr", "sft_batch", "sft_weight_decay"),
                    "warm start from episodes"),
    **dict.fromkeys(("seed", "run_dir", "wandb_project", "wandb_mode", "tensorboard"), "the run"),
}  # fmt: skip
"""The ``--help`` section of every option."""

_DEFINES_THE_RUN = ("model", "tokenizer", "lora_rank", "lora_alpha", "dtype", "data", "eval_data", "eval_fraction",
                    "limit", "example", "env", "env_args", "agent", "system_prompt", "seed", "sft_data")  # fmt: skip
"""Options a checkpoint only makes sense with: the model and its adapters, the rows, the environment and agent."""


def check_resumable(options: TrainOptions, run_dir: Path) -> None:
    """Refuse to resume a run directory whose checkpoint was made with other model, data or environment
    options (naming each difference); GRPO options (steps, learning rate, ...) may change."""
    if not has_checkpoint(run_dir):
        return
    saved = saved_config(run_dir)
    if saved is None:
        logger.warning("%s has a checkpoint but no recorded options: resuming it unchecked", run_dir)
        return
    now = asdict(options)
    different = [
        f"--{name.replace('_', '-')} {saved.get(name)!r} (saved) vs {now[name]!r} (now)"
        for name in _DEFINES_THE_RUN
        if not _same(name, saved.get(name), now[name])
    ]
    if different:
        raise ValueError(
            f"{run_dir} holds a checkpoint made with other options: {'; '.join(different)}. Rerun with the saved "
            "options to resume it, or give a new --run-dir."
        )


def _same(name: str, saved: Any, now: Any) -> bool:
    paths = ("model", "tokenizer", "data", "eval_data")
    if name in paths and saved is not None and now is not None:
        return saved == now or Path(saved).resolve() == Path(now).resolve()
    if name == "sft_data" and saved is not None and now is not None:
        return [Path(p).resolve() for p in saved] == [Path(p).resolve() for p in now]
    return bool(saved == now)


# -- rows --------------------------------------------------------------------------------------------
def select_rows(options: TrainOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out rows (see module doc); ValueError for missing, empty or unreadable data."""
    from ..data import load_rows
    from ..evaluation.presets import PRESETS
    from ..utils.refs import resolve

    preset = PRESETS.get(options.example) if options.example else None
    if options.data:
        rows = load_rows(options.data, limit=options.limit)
    elif preset is not None and not preset.needs_data and preset.tasks:
        rows = resolve(preset.tasks)(options.limit or 256, seed=options.seed, split="train")
    else:
        raise ValueError("--data is required (rows.jsonl, .json or .parquet)" + (
            f": --example {options.example} generates no tasks" if options.example else ""))  # fmt: skip
    if not rows:
        raise ValueError(f"{options.data}: no rows")
    if options.eval_data:
        eval_rows = load_rows(options.eval_data, limit=options.eval_limit)
        if not eval_rows:
            raise ValueError(f"--eval-data {options.eval_data}: no rows")
        return rows, eval_rows
    if not options.data and preset is not None and preset.tasks:
        return rows, resolve(preset.tasks)(options.eval_limit or 64, seed=options.seed, split="eval")
    from ..data_prep import split_rows

    train_rows, eval_rows = split_rows(rows, options.eval_fraction, seed=options.seed)
    return train_rows, eval_rows[: options.eval_limit or None]


def check_rows(rows: list[dict[str, Any]], env: str, env_args: dict[str, Any], *, what: str) -> None:
    """Every row builds its environment (class imported, tools and reward resolved, prompt found);
    ValueError naming the first row that does not."""
    from ..data_prep import check_rows as check

    check(rows, env, env_args, what=what)


# -- the plan ----------------------------------------------------------------------------------------
def _agent(options: TrainOptions) -> StrandsAgent:
    from ..evaluation.presets import PRESETS

    preset = PRESETS.get(options.example) if options.example else None
    system_prompt = options.system_prompt
    if system_prompt is None and options.agent is None and preset is not None:
        system_prompt = preset.resolved_system_prompt()
    factory = options.agent or (preset.agent_factory if preset is not None and system_prompt is None else None)
    return StrandsAgent(factory, system_prompt)


def train_plan(options: TrainOptions) -> RunPlan:
    """The run ``options`` describe. Everything a user can get wrong is checked here, before anything is
    written or the model's weights load (ValueError or OSError, one line): the environment, every row,
    the model directory, its tokenizer and chat template, the device, the ``--sft-data`` episodes (read,
    and the distilled ones replayed: that needs the tokenizer only)."""
    from .models import check_model_dir, lora_settings, model_record, resolve_device, resolve_dtype

    env = options.env_class
    if env is None:
        raise ValueError(
            f"no environment given: pass --env module:Class (e.g. --env {GENERIC_ENV}: tools and reward_fn from "
            "each row) or --example NAME"
        )
    if options.model is None:
        raise ValueError(f"--model is required: a local Hugging Face model directory, or {TINY} (no download)")
    tiny = options.model == TINY
    model_dir = None if tiny else check_model_dir(options.model)
    device = resolve_device(options.device)
    dtype = "float32" if tiny else resolve_dtype(options.dtype, device)
    train_rows, eval_rows = select_rows(options)
    check_rows(train_rows, env, options.env_args, what="--data" if options.data else "task")
    check_rows(eval_rows, env, options.env_args, what="--eval-data" if options.eval_data else "held-out row")
    from ..data_prep import check_disjoint

    check_disjoint(train_rows, eval_rows)
    agent = _agent(options)
    if model_dir is None:
        tokenizer, template = _tiny_tokenizer(options, [*train_rows, *eval_rows], env, agent)
    else:
        tokenizer, template = _tokenizer(options.tokenizer, model_dir)
    lora = lora_settings(options.lora_rank, options.lora_alpha)
    budget = Budget(max_turns=options.max_turns, max_total_tokens=options.max_total_tokens,
                    wall_clock_s=options.episode_timeout)  # fmt: skip
    eval_temperature = options.eval_temperature
    if eval_temperature is None:
        eval_temperature = 0.0 if options.eval_n == 1 else 1.0
    train_config = TrainConfig(
        run_dir=options.run_dir, steps=options.steps, prompts_per_step=options.prompts_per_step,
        group_size=options.group_size, lr=options.lr, kl_coef=options.kl_coef, eval_every=options.eval_every,
        save_every=options.save_every, seed=options.seed,
        sampling=SamplingParams(temperature=options.temperature, max_tokens_per_call=options.max_tokens_per_call),
        eval_sampling=SamplingParams(temperature=eval_temperature, max_tokens_per_call=options.max_tokens_per_call),
        budget=budget, micro_batch_tokens=options.micro_batch_tokens, wandb_project=options.wandb_project,
        max_steps_without_signal=options.max_steps_without_signal,
        wandb_mode=options.wandb_mode, tensorboard=options.tensorboard, eval_n=options.eval_n,
        eval_ks=tuple(options.eval_k), train_aux_calls=options.train_aux_calls,
    )  # fmt: skip
    plan = RunPlan(
        run_dir=Path(options.run_dir),
        title=f"agentboost train: {options.example or env}",
        config=asdict(options),
        train_rows=train_rows,
        eval_rows=eval_rows,
        env=env,
        env_args=dict(options.env_args),
        agent=agent,
        build_model=lambda: _load(model_dir, tokenizer, lora, device, dtype, seed=options.seed),
        model_record=model_record(str(model_dir) if model_dir else None, lora=lora, dtype=dtype),
        train_config=train_config,
        threshold=options.success_threshold,
        check_resumable=lambda run_dir: check_resumable(options, run_dir),
        seed=options.seed,
    )
    if options.sft_data:
        from .sft_data import build_sft_data
        from .warm_start import EpisodeWarmStart

        data = build_sft_data(
            options.sft_data, template=template, train_rows=train_rows, eval_rows=eval_rows, env=env,
            env_args=plan.env_args, agent=agent, budget=budget, max_tokens_per_call=options.max_tokens_per_call,
            threshold=options.success_threshold,
        )  # fmt: skip
        if not data.episodes:
            dropped = ", ".join(f"{n} {why}" for why, n in data.sources["dropped"].items()) or "none read"
            raise ValueError(f"--sft-data: none of the {data.sources['read']} episodes can be used ({dropped})")
        steps = options.sft_steps or max(1, math.ceil(3 * len(data.episodes) / options.sft_batch))
        plan.warm_start = EpisodeWarmStart(
            data.episodes, steps=steps, lr=options.sft_lr, batch_size=options.sft_batch,
            weight_decay=options.sft_weight_decay, seed=options.seed, sources=data.sources,
        )  # fmt: skip
    return plan


def _tiny_tokenizer(
    options: TrainOptions, rows: list[dict[str, Any]], env: str, agent: StrandsAgent
) -> tuple[Any, Any]:
    """``--model tiny``'s tokenizer: trained on the rows (:mod:`agentboost.train.starting_model`), or, resuming,
    the one the run started with (``model_init/``)."""
    from transformers import AutoTokenizer

    from ..chat.template import ChatTemplate
    from .run import MODEL_INIT

    saved = Path(options.run_dir) / MODEL_INIT
    if (saved / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(saved), local_files_only=True)
    else:
        tokenizer = tiny_tokenizer(rows, env, options.env_args, system_prompt=agent.system_prompt)
    return tokenizer, ChatTemplate(tokenizer)


def _tokenizer(ref: str | None, model_dir: Path) -> tuple[Any, Any]:
    """The tokenizer (``--tokenizer``: ``offline:<family>``, a directory or a cached hub id; else the model
    directory's) and its chat template; ValueError when it cannot be used, or when it has ids the model's
    embedding lacks (a tokenizer of another model)."""
    import json

    from transformers import AutoTokenizer

    from ..backends.factory import load_tokenizer
    from ..chat.template import ChatTemplate

    what = f"--tokenizer {ref}" if ref else f"the tokenizer of {model_dir}"
    try:
        tokenizer = load_tokenizer(ref) if ref else AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        template = ChatTemplate(tokenizer)
    except Exception as exc:  # transformers raises TypeError, OSError, ValueError, ...; TemplateError
        raise ValueError(f"{what} cannot be used: {type(exc).__name__}: {exc}") from None
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--model {model_dir}: config.json is not readable JSON ({exc})") from None
    vocab = (config.get("text_config") or config).get("vocab_size") if isinstance(config, dict) else None
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ValueError(f"{what} has {len(tokenizer)} tokens, more than the {vocab} of the model's vocabulary "
                         f"({model_dir}): a tokenizer of another model?")  # fmt: skip
    return tokenizer, template


def _load(
    model_dir: Path | None, tokenizer: Any, lora: dict[str, Any] | None, device: str, dtype: str, *, seed: int
) -> Any:
    """The model of ``model_dir`` and ``tokenizer``; None: the tiny model (``--model tiny``), drawn with ``seed``."""
    from .models import load_model

    if model_dir is None:
        return tiny_model(tokenizer, seed=seed).to(device), tokenizer
    return load_model(model_dir, tokenizer=tokenizer, lora=lora, device=device, dtype=dtype)
