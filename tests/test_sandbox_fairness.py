"""Fair slots (issue 22, finding 8): a slow suite cannot starve other episodes' rewards, and waiting for a
slot is charged neither to the program nor to the reward's budget. On b14b9f6 a batch session held its slot
for its whole suite: a correct neighbour waited until a slow suite finished, and its reward timed out."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentboost.sandbox import Sandbox, SandboxConfig
from agentboost.sandbox.testcases import PASSED, TestCase, run_test_cases
from tests.sandbox_users import as_ordinary_user

SLOW = "import time\nn = int(input())\ntime.sleep(0.5)\nprint(n)"
GOOD = "print(int(input()) * 2)"


async def _race(box: Sandbox) -> dict[str, float | list[str]]:
    """Two slow suites take every slot (two sessions each); a third, quick suite arrives once they do."""
    started = time.monotonic()
    ends: dict[str, float | list[str]] = {}

    async def suite(name: str, code: str, tests: list[TestCase], wait_for_full: bool = False) -> None:
        for _ in range(200):  # the quick suite comes once the slow ones hold every slot
            slots = getattr(box, "slots", None)
            free = slots.free if slots is not None else len(box._free_slots)  # (b14b9f6 kept a list)
            if not wait_for_full or free == 0:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3 if wait_for_full else 0)
        outcomes = await run_test_cases(box, code, tests, timeout_s=5)
        ends[name] = time.monotonic() - started
        ends[name + "_verdicts"] = sorted({o.verdict for o in outcomes})

    slow_tests = [TestCase(f"{i}\n", f"{i}\n") for i in range(24)]
    quick_tests = [TestCase(f"{i}\n", f"{2 * i}\n") for i in range(2)]
    await asyncio.gather(suite("slow_a", SLOW, slow_tests), suite("slow_b", SLOW, slow_tests),
                         suite("quick", GOOD, quick_tests, wait_for_full=True))  # fmt: skip
    return ends


def _check_race(ends: dict) -> None:
    assert ends["quick_verdicts"] == ends["slow_a_verdicts"] == ends["slow_b_verdicts"] == [PASSED], ends
    assert ends["quick"] + 2.0 < min(ends["slow_a"], ends["slow_b"]), ends  # not at the end of a slow suite


def test_a_slow_suite_cannot_keep_another_suite_waiting_for_its_end() -> None:
    box = Sandbox(SandboxConfig(slots=4, wall_s=10, cpu_s=10, memory_mb=256, max_processes=16))
    try:
        ends = asyncio.run(_race(box))
    finally:
        box.close()
    _check_race(ends)


def test_as_an_ordinary_user_a_slow_suite_cannot_keep_another_waiting() -> None:
    import inspect

    script = (
        "import asyncio, json, time\nfrom agentboost.sandbox import Sandbox, SandboxConfig\n"
        "from agentboost.sandbox.testcases import TestCase, run_test_cases\n"
        f"SLOW, GOOD = {SLOW!r}, {GOOD!r}\n" + inspect.getsource(_race) +
        "box = Sandbox(SandboxConfig(slots=4, wall_s=10))\nends = asyncio.run(_race(box))\nbox.close()\n"
        "print(json.dumps(ends))\n"
    )  # fmt: skip
    report = as_ordinary_user(script)
    report.pop("_stderr")
    _check_race(report)


def test_waiting_for_a_slot_is_not_charged_to_a_suites_budget() -> None:
    """Every slot held for 6 s by another owner's run; a suite with a budget of 4 s still runs (its wait is
    not its own), and the program's own time limit starts when it does (budgets with room for a loaded
    machine: a run of the program takes well under a second alone)."""
    box = Sandbox(SandboxConfig(slots=1, wall_s=10, cpu_s=10, memory_mb=256, max_processes=16))

    async def scenario() -> tuple[list[str], float]:
        holder = asyncio.ensure_future(box.run("import time\ntime.sleep(6)", timeout_s=10))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        outcomes = await run_test_cases(box, GOOD, [TestCase("2\n", "4\n")], timeout_s=4.0, budget_s=4.0)
        waited = time.monotonic() - started
        await holder
        return [o.verdict for o in outcomes], waited

    try:
        verdicts, waited = asyncio.run(scenario())
    finally:
        box.close()
    assert waited > 4.0 and verdicts == [PASSED], (verdicts, waited)


# --- the slots and the clock themselves --------------------------------------------------------------
def test_a_released_slot_goes_to_the_owner_holding_fewest_and_a_greedy_owner_is_asked_to_yield() -> None:
    from agentboost.sandbox.slots import Slots

    async def scenario() -> list[str]:
        slots = Slots(2)
        greedy = object()
        held = [await slots.acquire(greedy), await slots.acquire(greedy)]
        order: list[str] = []

        async def want(name: str, owner: object) -> None:
            lease = await slots.acquire(owner)
            order.append(name)
            await asyncio.sleep(0.05)
            slots.release(lease)

        waiting = [
            asyncio.ensure_future(want("greedy-again", greedy)),
            asyncio.ensure_future(want("newcomer", object())),
        ]
        await asyncio.sleep(0.05)
        assert slots.should_yield(held[0])  # a newcomer holding 0 waits while greedy holds 2
        slots.release(held.pop())
        await asyncio.gather(*waiting[1:])
        slots.release(held.pop())
        await asyncio.gather(*waiting)
        assert slots.free == 2
        return order

    assert asyncio.run(scenario()) == ["newcomer", "greedy-again"]


def test_the_charged_clock_stops_while_its_holder_only_waits() -> None:
    from agentboost.utils.clock import ChargedClock, ChargedTimeout, run_charged

    clock = ChargedClock(10.0)
    clock.waiting(+1)
    time.sleep(0.3)
    assert clock.charged() < 0.1 and clock.waited() >= 0.29
    clock.holding(+1)  # got a slot while still asking for another: charged again
    time.sleep(0.2)
    clock.waiting(-1)
    assert 0.15 < clock.charged() < 0.5
    inner = ChargedClock(5.0, parent=clock)
    inner.holding(-1)
    inner.waiting(+1)  # reported upwards: the parent holds nothing and waits
    time.sleep(0.2)
    assert clock.waited() >= 0.49

    async def too_slow() -> None:
        await asyncio.sleep(5)

    with pytest.raises(ChargedTimeout, match="budget of 0.2s"):
        asyncio.run(run_charged(ChargedClock(0.2), too_slow()))


def test_as_an_ordinary_user_a_suite_stops_with_a_verdict_when_its_budget_is_spent() -> None:
    """Finding 11 at the suite's level (the reward's budget; see tests/test_rewards_code.py for the
    episode): tests never time out, the suite's budget ends it with a verdict, in time."""
    script = (
        "import asyncio, json, time\nfrom agentboost.sandbox import Sandbox, SandboxConfig\n"
        "from agentboost.sandbox.testcases import TestCase, run_test_cases\n"
        "box = Sandbox(SandboxConfig(wall_s=10))\n"
        "tests = [TestCase(f'{i}\\n', f'{i}\\n') for i in range(26)]\n"
        "started = time.monotonic()\n"
        "out = asyncio.run(run_test_cases(box, 'import time\\ntime.sleep(0.9)\\nprint(-1)', tests, budget_s=3.0))\n"
        "took = time.monotonic() - started\nbox.close()\n"
        "print(json.dumps({'verdicts': sorted({o.verdict for o in out}), 'took': took}))\n"
    )
    report = as_ordinary_user(script)
    # the tests that ended in time are judged (none may, on a loaded machine: the budget is 3 s); the rest get
    # the suite's verdict, never a timeout of their own
    assert "suite time limit exceeded" in report["verdicts"], report
    assert set(report["verdicts"]) <= {"suite time limit exceeded", "wrong answer"}, report
    assert report["took"] < 8, report
