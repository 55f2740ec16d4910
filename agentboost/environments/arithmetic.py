"""Arithmetic with a calculator tool: the embedded default task (quickstart, smoke runs).

Tasks are generated from a seed (no download): "What is 37 + 48 * 2?" with the exact integer answer.
The reward is 1 when the final answer text is exactly that integer, 0 otherwise.
"""

from __future__ import annotations

import random
from typing import Any

from ..episode import Episode
from ..tools.calculator import calculator, evaluate, format_number
from ..types import RewardOutput
from .strands_env import StrandsEnv

SYSTEM_PROMPT = (
    "You are a calculator assistant. Use the calculator tool to compute the expression, "
    "then answer with the final number only."
)


def make_tasks(
    n: int, *, seed: int = 0, max_ops: int = 2, max_value: int = 99, split: str = "train"
) -> list[dict[str, Any]]:
    """``n`` arithmetic tasks, deterministic for a given seed."""
    rng = random.Random(f"{split}:{seed}")
    tasks = []
    for i in range(n):
        n_ops = rng.randint(1, max_ops)
        parts = [str(rng.randint(1, max_value))]
        for _ in range(n_ops):
            parts += [rng.choice(["+", "-", "*"]), str(rng.randint(1, max_value))]
        expression = " ".join(parts)
        tasks.append(
            {
                "task_id": f"arith-{split}-{seed}-{i}",
                "prompt": f"What is {expression}?",
                "expression": expression,
                "answer": format_number(evaluate(expression)),
            }
        )
    return tasks


def exact_answer_reward(task: dict[str, Any], episode: Episode) -> RewardOutput:
    answer = episode.final_text.strip().rstrip(".")
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
