"""Math reward: extraction, symbolic equivalence, hacking attempts, hostile expressions."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("math_verify")

from agentboost.episode import Episode
from agentboost.rewards.math import extract_answer, last_boxed, math_equal, math_reward
from agentboost.types import Termination


def episode_saying(text: str, reasoning: str | None = None) -> Episode:
    content: list[dict] = []
    if reasoning:
        content.append({"reasoningContent": {"reasoningText": {"text": reasoning}}})
    if text:
        content.append({"text": text})
    return Episode(
        id="e",
        messages=[{"role": "user", "content": [{"text": "q"}]}, {"role": "assistant", "content": content}],
        termination=Termination.COMPLETED,
    )


def reward(gold: str, text: str, reasoning: str | None = None):
    return asyncio.run(math_reward({"answer": gold}, episode_saying(text, reasoning)))


def test_extraction() -> None:
    assert last_boxed(r"x \boxed{\frac{a}{b^{2}}} y") == r"\frac{a}{b^{2}}"
    assert last_boxed(r"\boxed{1} then \boxed{2}") == "2"
    assert last_boxed(r"\boxed{unbalanced") is None
    assert extract_answer("Work.\nThe answer is 204.") == ("204", False)
    assert extract_answer(r"The answer is 204, 205, 206 \boxed{") == (None, False)  # unclosed box: no answer
    assert extract_answer("") == (None, False)


@pytest.mark.parametrize(
    ("gold", "text", "expected"),
    [
        ("204", r"So the total is \boxed{204}.", 1.0),
        ("\\frac{1}{2}", r"\boxed{0.5}", 1.0),
        ("2\\sqrt{2}", r"\boxed{\sqrt{8}}", 1.0),
        ("204", "The answer is 204.", 1.0),
        ("204", r"\boxed{205}", 0.0),
        ("204", "", 0.0),
    ],
)
def test_rewards(gold: str, text: str, expected: float) -> None:
    out = reward(gold, text)
    assert out.reward == expected and out.is_correct == (expected == 1.0)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("204.", "204"),
        ("**204**", "204"),
        ("Answer: 204", "204"),
        ("Therefore, the final answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("So the answer is 204.\n\nLet me know if you need more help!", "204"),  # chit-chat after it
        ("x = 5", "x = 5"),
        ("The answer is 204 (or maybe 205 or 206)", None),  # hedging prose: no answer
        ("Therefore the answer is 204, not 205.", None),
        ("Final answer: 204; or 205; or 206", None),
        ("I could not solve it.", None),
    ],
)
def test_plain_answers_are_bare_expressions(text: str, answer: str | None) -> None:
    assert extract_answer(text) == (answer, False)


@pytest.mark.parametrize(("gold", "text"), [("204", "204."), ("204", "**204**"), ("204", "Answer: 204"), ("5", "5.")])
def test_plain_answers_score(gold: str, text: str) -> None:
    assert reward(gold, text).reward == 1.0


def test_listing_many_answers_does_not_win() -> None:
    spray = " ".join(rf"\boxed{{{i}}}" for i in range(1000))
    assert reward("204", spray).reward == 0.0  # only the last boxed answer counts
    assert reward("204", "1, 2, 3, ..., 203, 204, 205").reward == 0.0


def test_answer_only_in_reasoning_earns_nothing() -> None:
    out = reward("204", "", reasoning=r"I think it is \boxed{204}")
    assert out.reward == 0.0 and out.metrics["has_answer"] == 0.0


def test_hostile_expression_is_bounded() -> None:
    started = time.monotonic()
    assert not math_equal("5", "10^{10^{10^{10}}}", timeout_s=2.0)
    assert time.monotonic() - started < 8
    assert math_equal("5", "5.0")  # the checker recovered


def test_a_hostile_answer_does_not_disturb_concurrent_checks() -> None:
    """Two hanging checks beside eight good ones on a two-worker runner: only the hanging ones fail."""
    from concurrent.futures import ThreadPoolExecutor

    calls = [("5", "10^{10^{10^{10}}}")] * 2 + [("204", r"\frac{408}{2}")] * 8
    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(lambda c: math_equal(*c, timeout_s=3.0), calls))
    assert results == [False] * 2 + [True] * 8  # queue time does not count against a check's timeout


def test_a_check_that_kills_its_process_costs_only_its_own_call() -> None:
    from agentboost.rewards.isolated import IsolatedRunner, WorkerDied
    from tests.isolated_fns import die_hard, slow_square

    runner = IsolatedRunner(max_workers=2)
    try:
        with pytest.raises(WorkerDied):
            runner.run(die_hard, timeout_s=10)
        with pytest.raises(ZeroDivisionError):  # the function's own exception comes back as is
            runner.run(slow_square, "boom", timeout_s=10)
        assert runner.run(slow_square, 7, timeout_s=10) == 49 and runner.deaths == 1
    finally:
        runner.close()


def test_workers_outlive_the_thread_that_first_used_them() -> None:
    """Linux's parent-death signal follows the starting *thread*; a worker must not die with it."""
    import threading

    from agentboost.rewards.isolated import IsolatedRunner
    from tests.isolated_fns import slow_square

    runner = IsolatedRunner(max_workers=1)
    try:
        results = []
        thread = threading.Thread(target=lambda: results.append(runner.run(slow_square, 3, timeout_s=30)))
        thread.start()
        thread.join()
        time.sleep(0.5)
        assert results == [9] and runner.run(slow_square, 4, timeout_s=30) == 16 and runner.deaths == 0
    finally:
        runner.close()


def test_missing_gold_is_an_error() -> None:
    with pytest.raises(ValueError):
        asyncio.run(math_reward({}, episode_saying("1")))
