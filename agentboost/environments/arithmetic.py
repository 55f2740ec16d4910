"""Arithmetic with a calculator tool: the embedded default task (quickstart, smoke runs).

Tasks are generated from a seed (no download): "What is 37 + 48 * 2?" with the exact integer answer.
The reward is 1 when the final answer text is exactly that integer, 0 otherwise.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Collection
from typing import Any

from ..episode import Episode
from ..rewards.answer import final_answer_text
from ..tools.calculator import calculator, evaluate, format_number
from ..types import RewardOutput
from .strands_env import StrandsEnv

SYSTEM_PROMPT = (
    "You are a calculator assistant. Use the calculator tool to compute the expression, "
    "then answer with the final number only."
)


def _held_out(expression: str) -> bool:
    """One expression in five (by a stable hash) is reserved for evaluation."""
    return int(hashlib.sha256(expression.encode()).hexdigest(), 16) % 5 == 0


def _expression(rng: random.Random, max_ops: int, operand: Callable[[], int]) -> str:
    """One spaced expression ("37 + 48 * 2"): 1 to ``max_ops`` operators, operands from ``operand()``."""
    n_ops = rng.randint(1, max_ops)
    parts = [str(operand())]
    for _ in range(n_ops):
        parts += [rng.choice(["+", "-", "*"]), str(operand())]
    return " ".join(parts)


def _task(split: str, seed: int, i: int, expression: str, *, spaced: bool) -> dict[str, Any]:
    if not spaced:
        expression = expression.replace(" ", "")
    return {
        "task_id": f"arith-{split}-{seed}-{i}",
        "prompt": f"What is {expression}?",
        "expression": expression,
        "answer": format_number(evaluate(expression)),
    }


def make_tasks(
    n: int, *, seed: int = 0, max_ops: int = 2, max_value: int = 99, split: str = "train", spaced: bool = True
) -> list[dict[str, Any]]:
    """``n`` arithmetic tasks, deterministic for a given seed.

    ``split="eval"`` draws only from expressions reserved for evaluation (one in five, by hash) and
    every other split only from the rest, so held-out expressions are never trained on. Tasks may
    repeat when ``n`` exceeds the number of distinct expressions. ``spaced=False`` writes the
    expressions without spaces ("7*8"): the same tasks and the same held-out split.
    """
    rng = random.Random(f"{split}:{seed}")
    want_held_out = split == "eval"
    tasks: list[dict[str, Any]] = []
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 1000 * max(n, 1):
            raise ValueError(f"cannot draw {n} {split} tasks with max_value={max_value}, max_ops={max_ops}")
        expression = _expression(rng, max_ops, lambda: rng.randint(1, max_value))
        if _held_out(expression) != want_held_out:
            continue
        tasks.append(_task(split, seed, len(tasks), expression, spaced=spaced))
    return tasks


def expression_space(max_ops: int, max_value: int) -> int:
    """How many expressions of 1 to ``max_ops`` operators with operands 1..``max_value`` there are."""
    return sum(max_value ** (k + 1) * 3**k for k in range(1, max_ops + 1))


def make_distinct_tasks(
    n: int,
    *,
    seed: int = 0,
    max_ops: int = 1,
    max_value: int = 999,
    spaced: bool = True,
    exclude: Collection[str] = (),
    split: str = "demo",
) -> list[dict[str, Any]]:
    """``n`` training-split tasks with ``n`` different expressions, none in ``exclude`` (compared
    without spaces) and none held out (the hash rule of :func:`make_tasks`, so no expression ever
    reserved for evaluation is among them). Every operand first draws its number of digits (1 to
    those of ``max_value``, equally likely), then its value: short operands stay as common as long
    ones, so a wide space still holds the task's own small expressions.

    The quickstart's demonstrations: drawn from a space far larger than ``n``, no expression is shown
    twice and none can be answered from memory, only by copying it."""
    if n > expression_space(max_ops, max_value) // 2:
        raise ValueError(
            f"cannot draw {n} different expressions from the {expression_space(max_ops, max_value)} with "
            f"max_value={max_value}, max_ops={max_ops} (at most half of them)"
        )
    rng = random.Random(f"{split}:{seed}")
    widest = len(str(max_value))

    def operand() -> int:
        digits = rng.randint(1, widest)
        return rng.randint(1 if digits == 1 else 10 ** (digits - 1), min(max_value, 10**digits - 1))

    taken = {e.replace(" ", "") for e in exclude}
    tasks: list[dict[str, Any]] = []
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 1000 * max(n, 1):
            raise ValueError(f"cannot draw {n} different expressions with max_value={max_value}, max_ops={max_ops}")
        expression = _expression(rng, max_ops, operand)
        if _held_out(expression) or expression.replace(" ", "") in taken:
            continue
        taken.add(expression.replace(" ", ""))
        tasks.append(_task(split, seed, len(tasks), expression, spaced=spaced))
    return tasks


def exact_answer_reward(task: dict[str, Any], episode: Episode) -> RewardOutput:
    """1 when the agent finished on its own and its final answer is exactly the number."""
    answer = (final_answer_text(episode) or "").strip().rstrip(".")
    correct = answer == str(task["answer"])
    return RewardOutput(1.0 if correct else 0.0, metrics={"answered": float(bool(answer))}, is_correct=correct)


class ArithmeticEnv(StrandsEnv):
    """``StrandsEnv`` with the calculator tool and the exact-answer reward as defaults."""

    def __init__(
        self, task: dict[str, Any] | None = None, tools: Any = None, reward_fn: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(
            task,
            tools=tools if tools is not None else [calculator],
            reward_fn=reward_fn if reward_fn is not None else exact_answer_reward,
            **kwargs,
        )


def windowed_agent(*, model: Any, tools: list[Any], task: Any, window_size: int = 2, **defaults: Any) -> Any:
    """The arithmetic agent with Strands' sliding window applied before every model call
    (``SlidingWindowConversationManager(window_size, per_turn=True)``): with the default of 2 messages the
    answer call sees only the calculator call and its result, so every episode is two trajectories (the
    call that asks the calculator, and the answer given its result). The multi-trajectory demo and tests
    use it; ``agent_args={"agent_factory": "agentboost.environments.arithmetic:windowed_agent"}``."""
    from strands import Agent
    from strands.agent.conversation_manager import SlidingWindowConversationManager

    window = SlidingWindowConversationManager(window_size=window_size, per_turn=True)
    return Agent(model=model, tools=tools, system_prompt=SYSTEM_PROMPT, conversation_manager=window,
                 callback_handler=None)  # fmt: skip
