"""Arithmetic with a calculator tool: the embedded default task (quickstart, smoke runs).

Tasks are generated from a seed (no download): "What is 37 + 48 * 2?" with the exact integer answer.
The reward is 1 when the final answer text is exactly that integer, 0 otherwise.
"""

from __future__ import annotations

import hashlib
import random
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
        n_ops = rng.randint(1, max_ops)
        parts = [str(rng.randint(1, max_value))]
        for _ in range(n_ops):
            parts += [rng.choice(["+", "-", "*"]), str(rng.randint(1, max_value))]
        expression = " ".join(parts)
        if _held_out(expression) != want_held_out:
            continue
        i = len(tasks)
        if not spaced:
            expression = expression.replace(" ", "")
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
