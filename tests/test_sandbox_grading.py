"""Grading (issue 22, findings 9, 10 and 12): expected values keep the dataset's types, integers are exact,
reals follow the source benchmark's rule; batched verdicts equal single-run verdicts by construction; nothing
derived from a gold answer is in the program's reach; exit statuses are what they are; forked runs do not
share one hash seed. Issue 39 (findings 2, 3, 4 and 8): no output crashes or stalls a verdict, and no
output is held past its verdict.

On b14b9f6: an expected ``"100"`` became 100 (the right program scored 0, a wrong one 1); a float 999 away
from 1e9 passed for the integer 1e9; mtimes and extended attributes survived between the tests of one
harness; the output cap ``2 * len(gold) + 4096`` sat on the program's own stack; ``sys.exit(152)`` was
SIGXCPU; every forked run had the zygote's hash seed. On fdcdfc9: a result of 30,000 nested ``[`` raised
RecursionError out of the reward, 10**400 against a real raised OverflowError (both masked the episode
instead of scoring 0); ``"1" * 9000 + "x"`` against a real took seconds on the event loop (65,000 digits:
minutes); twelve 16 MiB outputs grew the reward's process by about 300 MiB.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentboost.episode import Episode
from agentboost.rewards.code import code_reward
from agentboost.sandbox import Sandbox, SandboxConfig, grading
from agentboost.sandbox.config import SandboxResult
from agentboost.sandbox.grading import CALL_MARK, EXACT, SHOWN_CHARS, TACO, is_number, judge, verdict
from agentboost.sandbox.testcases import (
    ERROR,
    JUDGE_TIME_LIMIT,
    NOT_RUN,
    OUTPUT_LIMIT,
    PASSED,
    WRONG,
    TestCase,
    run_test_cases,
)
from agentboost.types import Termination
from tests.sandbox_users import as_ordinary_user

LIMITS = {"wall_s": 10, "cpu_s": 5, "memory_mb": 256, "max_processes": 16}


@pytest.fixture(scope="module")
def box():
    sandbox = Sandbox(SandboxConfig(**LIMITS))
    yield sandbox
    sandbox.close()


def _score(box: Sandbox, task: dict, program: str, monkeypatch: pytest.MonkeyPatch) -> float:
    from agentboost.tools import strands_code_tool

    monkeypatch.setattr(strands_code_tool, "_default", box)
    text = f"Here it is.\n```python\n{program}\n```"
    episode = Episode(id="grading", messages=[{"role": "assistant", "content": [{"text": text}]}],
                      termination=Termination.COMPLETED)  # fmt: skip
    return asyncio.run(code_reward(task, episode)).reward


def _call(output, **extra) -> dict:
    return {"tests": [{"input": [], "output": output, "testtype": "functional", "fn_name": "f"}], **extra}


@pytest.mark.parametrize(
    ("expected", "right", "wrong"),
    [
        ("100", "'100'", "100"),
        ("true", "'true'", "True"),
        ("null", "'null'", "None"),
        ("[]", "'[]'", "[]"),
        ("0", "'0'", "0"),
    ],
)
def test_expected_strings_stay_strings(box, monkeypatch, expected, right, wrong) -> None:
    """Finding 9: TACO and PrimeIntellect store return values (TACO's wrapping removed when prepared): a
    string is a string, never JSON to be parsed again."""
    assert _score(box, _call(expected), f"def f():\n    return {right}", monkeypatch) == 1.0
    assert _score(box, _call(expected), f"def f():\n    return {wrong}", monkeypatch) == 0.0


def test_livecodebench_functional_outputs_are_json_text_decoded_once(box, monkeypatch) -> None:
    task = {"tests": [{"input": "[1, 5, 3]\n2", "output": "2", "testtype": "functional",
                       "metadata": {"func_name": "f"}}]}  # fmt: skip
    assert _score(box, task, "def f(xs, k):\n    return sum(x > k for x in xs)", monkeypatch) == 1.0
    assert _score(box, task, "def f(xs, k):\n    return str(sum(x > k for x in xs))", monkeypatch) == 0.0


def test_integers_are_exact_and_reals_follow_the_source_rule(box, monkeypatch) -> None:
    """Finding 10: a float passes for an integer only when it equals it; reals (only where expected) by
    the task's or its source benchmark's rule."""
    assert _score(box, _call(10**9), "def f():\n    return 1e9 + 999", monkeypatch) == 0.0
    assert _score(box, _call(10**9), "def f():\n    return 10 ** 9", monkeypatch) == 1.0
    assert _score(box, _call(10**9), "def f():\n    return 1e9", monkeypatch) == 1.0  # equal, as Python says
    assert _score(box, _call(2.5), "def f():\n    return 2.5000000001", monkeypatch) == 1.0
    stdin = {"tests": [{"input": "", "output": "1000000000\n0.5\n"}]}
    assert _score(box, stdin, "print(1000000999.0)\nprint(0.5)", monkeypatch) == 0.0
    assert _score(box, stdin, "print(1000000000)\nprint(0.50000001)", monkeypatch) == 1.0  # default 1e-6
    lcb = {**stdin, "data_source": "lcbv5"}  # LiveCodeBench compares decimals exactly
    assert _score(box, lcb, "print(1000000000)\nprint(0.50000001)", monkeypatch) == 0.0
    assert _score(box, lcb, "print(1000000000)\nprint('0.50')", monkeypatch) == 1.0
    taco = {**stdin, "data_source": "taco"}  # TACO: numpy's isclose (rtol 1e-5, atol 1e-8)
    assert _score(box, taco, "print(1000000000)\nprint(0.500004)", monkeypatch) == 1.0
    assert _score(box, taco, "print(1000000000)\nprint(0.5001)", monkeypatch) == 0.0


# --- finding 12: batched verdicts equal single runs, by construction ---------------------------------
_STATE = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
n = int(input())
first = not os.listxattr(".") and not os.listxattr("main.py") and time.time() - os.stat("main.py").st_mtime < 60
first = first and set(os.listdir("/tmp")) <= set(os.getcwd().split("/")[2:3])  # (the way to the workdir)
first = first and os.stat("main.py").st_ino == os.stat(".").st_ino + 1  # the first file of a fresh tmpfs
first = first and libc.shmget(0, 4096, 0o1000 | 0o600) == 0  # the first segment of a fresh IPC namespace
print(n if first else "stale")
for target in (".", "main.py", "/tmp"):  # what a test could leave for the next one
    try:
        os.setxattr(target, "user.seen", b"1")
    except OSError:
        pass
os.utime("main.py", (0, 0))
os.utime(".", (0, 0))
for i in range(50):
    open(f"/tmp/f{i}", "w").close()
for _ in range(3):
    if os.fork() == 0:
        os._exit(0)
"""


def test_nothing_one_test_does_reaches_the_next_batched_or_not(box) -> None:
    tests = [TestCase(f"{i}\n", f"{i}\n") for i in range(6)]
    batched = asyncio.run(run_test_cases(box, _STATE, tests, timeout_s=5))
    alone = asyncio.run(run_test_cases(box, _STATE, tests, timeout_s=5, batch=False))
    assert [o.verdict for o in batched] == [o.verdict for o in alone] == [PASSED] * 6, (batched, alone)


def _probe_for(expected: str) -> tuple[str, int]:
    """A program that looks everywhere in its address space it can (frames, objects) for the gold answer
    and for the cap b14b9f6 derived from it."""
    cap = 2 * len(expected.encode()) + 4096
    code = f"""
import gc, sys
CAP, GOLD = {cap}, {expected[:40]!r}
seen, found = {{id(globals())}}, []  # (its own constants are no find)
def look(value, depth=0):
    if id(value) in seen or depth > 6:
        return
    seen.add(id(value))
    if type(value) is int and value == CAP:
        found.append("cap")
    elif isinstance(value, (str, bytes)) and (GOLD in value if isinstance(value, str) else GOLD.encode() in value):
        found.append("gold")
    elif isinstance(value, dict):
        for v in list(value.values()):
            look(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in list(value):
            look(v, depth + 1)
frame = sys._getframe().f_back  # its callers' frames (the runner's, the harness's or the launcher's)
while frame is not None:
    look(dict(frame.f_locals))
    look(frame.f_globals)
    frame = frame.f_back
for obj in gc.get_objects():
    if isinstance(obj, dict):
        look(obj)
print("found " + ",".join(sorted(set(found))) if found else "clean")
"""
    return code, cap


def test_no_gold_derived_value_is_in_the_programs_address_space(box) -> None:
    gold = "YES\n" * 12000  # (48 KB: the cap b14b9f6 derived from it, 100096, was above its 64 KiB floor)
    code, _ = _probe_for(gold)
    tests = [TestCase(f"{i}\n", gold) for i in range(2)]
    for batch in (True, False):
        outcomes = asyncio.run(run_test_cases(box, code, tests, timeout_s=5, batch=batch))
        assert [o.got.strip() for o in outcomes] == ["clean", "clean"], (batch, outcomes)


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "alone"])
def test_an_exit_status_is_what_it_is(box, batch: bool) -> None:
    """``sys.exit(152)`` is a runtime error with status 152, not SIGXCPU (128 + 24): the rest of the suite
    still runs; a real CPU-limit death stays a time limit."""
    code = "import sys\nn = int(input())\nif n == 1:\n    sys.exit(152)\nprint(n)"
    tests = [TestCase(f"{i}\n", f"{i}\n") for i in range(3)]
    outcomes = asyncio.run(run_test_cases(box, code, tests, timeout_s=5, stop_after_timeout=True, batch=batch))
    assert [o.verdict for o in outcomes] == [PASSED, ERROR, PASSED] and outcomes[1].exit_code == 152, outcomes
    assert NOT_RUN not in [o.verdict for o in outcomes]


_SEEDS = (
    "import asyncio, json\nfrom agentboost.sandbox import Sandbox, SandboxConfig\n"
    "box = Sandbox(SandboxConfig(**{config!r}))\n"
    "async def runs():\n"
    "    return [await box.run(\"print(hash('agentboost'))\") for _ in range(8)]\n"
    "seeds = [r.stdout for r in asyncio.run(runs())]\nzygote = box.isolation()['zygote']\nbox.close()\n"
    "print(json.dumps({{'distinct': len(set(seeds)), 'zygote': zygote}}))\n"
)


@pytest.mark.parametrize("config", [{}, {"runs_per_zygote": 1}], ids=["default", "one-run-per-zygote"])
def test_forked_runs_do_not_all_share_one_hash_seed(config: dict) -> None:
    import json
    import subprocess
    import sys

    from tests.sandbox_users import PRELUDE, REPO

    script = PRELUDE.format(repo=str(REPO)) + _SEEDS.format(config=config)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd="/tmp")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if not report["zygote"]:
        pytest.skip("no zygote here: every run starts an interpreter of its own")
    assert report["distinct"] >= (8 if config else 2), report  # default: a zygote forks at most 8 runs


def test_as_an_ordinary_user_forked_runs_do_not_all_share_one_hash_seed() -> None:
    report = as_ordinary_user(_SEEDS.format(config={"runs_per_zygote": 1}))
    if not report["zygote"]:
        pytest.skip("no zygote as an ordinary user here")
    assert report["distinct"] == 8, report


def test_as_an_ordinary_user_batched_verdicts_equal_single_ones_and_no_gold_is_in_reach() -> None:
    gold = "YES\n" * 12000  # (48 KB: the cap b14b9f6 derived from it, 100096, was above its 64 KiB floor)
    probe, _ = _probe_for(gold)
    script = (
        "import asyncio, json\nfrom agentboost.sandbox import Sandbox, SandboxConfig\n"
        "from agentboost.sandbox.testcases import TestCase, run_test_cases\n"
        "box = Sandbox(SandboxConfig(wall_s=10))\n"
        f"STATE, PROBE, GOLD = {_STATE!r}, {probe!r}, {gold!r}\n"
        "tests = [TestCase(f'{i}\\n', f'{i}\\n') for i in range(4)]\n"
        "out = {}\n"
        "for batch in (True, False):\n"
        "    out[str(batch)] = [o.verdict for o in asyncio.run(run_test_cases(box, STATE, tests, batch=batch))]\n"
        "    gold = [TestCase('0\\n', GOLD)]\n"
        "    probed = asyncio.run(run_test_cases(box, PROBE, gold * 2, batch=batch))\n"
        "    out['probe' + str(batch)] = [o.got.strip() for o in probed]\n"
        "box.close()\nprint(json.dumps(out))\n"
    )
    report = as_ordinary_user(script)
    assert report["True"] == report["False"] == [PASSED] * 4, report
    assert report["probeTrue"] == report["probeFalse"] == ["clean", "clean"], report


def test_output_limit_is_decided_on_the_host_with_the_same_floor_as_before(box) -> None:
    """A program may print up to ``stdout_cap`` (64 KiB) whatever the expected size, and twice a long
    expected output; past both it is ``output limit exceeded``, batched or not."""
    tests = [TestCase([], 1, kind="call", fn_name="f")] * 2
    printing = "def f():\n    print('x' * {})\n    return 1"
    for batch in (True, False):
        chatty = asyncio.run(run_test_cases(box, printing.format(30000), tests, batch=batch))
        flood = asyncio.run(run_test_cases(box, printing.format(200000), tests, batch=batch))
        assert [o.verdict for o in chatty] == [PASSED, PASSED], chatty
        assert [o.verdict for o in flood] == ["output limit exceeded"] * 2, flood


# --- issue 39: no output crashes or stalls a verdict, none is held past it ------------------------------
_DEEP = f"import sys\ndef f():\n    sys.stdout.write('\\n{CALL_MARK}' + '[' * 30000 + '\\n')\n    sys.exit(0)"
_HOSTILE = {  # name: (program, expected return value)
    "30000-nested": (_DEEP, [1]),  # finding 2: RecursionError in the verdict's JSON parsing
    "10**400-for-a-real": ("def f():\n    return 10 ** 400", 0.5),  # finding 3: OverflowError in float()
}


@pytest.mark.parametrize("name", list(_HOSTILE))
def test_a_result_whose_shape_broke_the_verdict_is_a_wrong_answer(box, monkeypatch, name: str) -> None:
    """Findings 2 and 3: the reward raised (the episode was masked); now it is 0, trained on."""
    from agentboost.tools import strands_code_tool

    program, expected = _HOSTILE[name]
    monkeypatch.setattr(strands_code_tool, "_default", box)
    answer = {"role": "assistant", "content": [{"text": f"```python\n{program}\n```"}]}
    episode = Episode(id="hostile", messages=[answer], termination=Termination.COMPLETED)
    result = asyncio.run(code_reward(_call(expected), episode))
    assert result.reward == 0.0 and result.metrics["verdict_wrong_answer"] == 1.0, result


def test_as_an_ordinary_user_a_result_whose_shape_broke_the_verdict_is_a_wrong_answer() -> None:
    script = (
        "import asyncio, json\nfrom agentboost.sandbox import Sandbox, SandboxConfig\n"
        "from agentboost.sandbox.testcases import TestCase, run_test_cases\n"
        f"HOSTILE = {_HOSTILE!r}\n"
        "box = Sandbox(SandboxConfig(wall_s=10))\nout = {}\n"
        "for name, (program, expected) in HOSTILE.items():\n"
        "    tests = [TestCase([], expected, kind='call', fn_name='f')] * 2\n"
        "    for batch in (True, False):\n"
        "        outcomes = asyncio.run(run_test_cases(box, program, tests, batch=batch))\n"
        "        out[f'{name}-{batch}'] = [o.verdict for o in outcomes]\n"
        "box.close()\nprint(json.dumps(out))\n"
    )
    report = as_ordinary_user(script)
    report.pop("_stderr")
    assert report and all(v == [WRONG, WRONG] for v in report.values()), report


_OLD_REAL = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")
_OLD_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789+-.eE x", max_size=12))
def test_numbers_are_scanned_by_the_grammar_the_regexes_had(token: str) -> None:
    """The linear scan accepts what the (quadratic) patterns did; one widening: ``.5e3`` is a real too."""
    assert is_number(token) == bool(_OLD_NUMBER.match(token)), token
    if not token.lstrip("+-").startswith("."):
        assert is_number(token, real=True) == bool(_OLD_REAL.match(token)), token


_PIECES = [
    b"[", b"]", b"{", b"}", b'{"a":', b",", b":", b'"', b"\\", b'\\"', b"1", b"9", b"0", b".", b"e", b"E", b"-",
    b"+", b"x", b" ", b"\n", b"\r\n", b"\t", b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf", b"null", b"true",
    b"\xff", b"\xc3", b"\xe2\x82", b"\x00", "\u0661\u00b2".encode(), b"1e400", b"1" * 401, b"0." + b"3" * 500,
]  # fmt: skip
_OUTPUTS = st.lists(st.tuples(st.sampled_from(_PIECES), st.integers(1, 70_000)), max_size=4).map(
    lambda parts: b"".join(piece * (count if len(piece) < 8 else count // 64 + 1) for piece, count in parts)
)
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.just(10**400)
_VALUES = st.recursive(
    _SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=12
)
_STDIN = st.lists(st.sampled_from(["0.5", "1e-9", "3", "-2.50", "YES", ".5", "1e400", "nan", "\n", " "]), max_size=8)


@settings(max_examples=150, deadline=timedelta(seconds=10), suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(["call", "stdin"]),
    expected=_VALUES,
    stdin_expected=_STDIN.map(" ".join),
    raw=_OUTPUTS,
    marked=st.booleans(),
    rule=st.sampled_from([EXACT, TACO, 1e-6, None]),
    floor=st.sampled_from([64 * 1024, 1 << 20]),
)
@example(kind="call", expected=[1], stdin_expected="", raw=b"[" * 30000, marked=True, rule=TACO, floor=64 * 1024)
@example(kind="call", expected=0.5, stdin_expected="", raw=str(10**400).encode(), marked=True, rule=TACO,
         floor=64 * 1024)  # fmt: skip
@example(kind="stdin", expected=None, stdin_expected="0.5", raw=b"1" * 9000 + b"x", marked=False, rule=TACO,
         floor=64 * 1024)  # fmt: skip
def test_no_output_crashes_or_stalls_a_verdict(kind, expected, stdin_expected, raw, marked, rule, floor) -> None:
    """Fuzz: adversarial outputs (huge numbers, deep nesting, NaN and infinities, invalid UTF-8, huge lines,
    many lines, nested values against every expected type) get a verdict, never an exception, each in
    bounded time (the example's deadline: the patterns of fdcdfc9 took seconds to minutes)."""
    test = TestCase([], expected, kind="call", fn_name="f") if kind == "call" else TestCase("", stdin_expected)
    stdout = (b"\n" + CALL_MARK.encode() if marked else b"") + raw
    keep = grading.output_limit(test, floor) + 1  # what a run keeps of it (bytes, then decoded)
    result = SandboxResult(stdout=stdout[:keep].decode("utf-8", errors="replace"), stderr="e" * 16384, exit_code=0,
                           stdout_size=len(stdout))  # fmt: skip
    outcome = judge(test, result, rule, output_floor=floor)
    assert outcome.verdict in (PASSED, WRONG, OUTPUT_LIMIT), outcome
    assert len(outcome.got) <= SHOWN_CHARS and len(outcome.stderr) <= SHOWN_CHARS  # (held until the suite ends)


@pytest.mark.parametrize("rule", [EXACT, TACO])
def test_a_correct_result_nested_to_the_depth_cap_passes(rule) -> None:
    """Every nesting the grader parses compares: a right result 512 deep (``MAX_JSON_DEPTH``) passes, on the
    event loop (a tiny verdict) and in a thread, and one wrong leaf at the bottom fails. On 9147589 the
    comparison recursed two frames a level: from about 490 deep a correct program got a wrong answer."""
    right: object = [[0.5, {"k": [True, None, "s"]}]]
    wrong: object = [[0.5, {"k": [True, None, "t"]}]]
    for _ in range(grading.MAX_JSON_DEPTH - 4):
        right, wrong = [right], [wrong]
    test = TestCase([], right, kind="call", fn_name="f")

    def outcome(value: object) -> str:
        result = SandboxResult(stdout=f"\n{CALL_MARK}{json.dumps(value)}\n", stderr="", exit_code=0)
        return asyncio.run(verdict(test, result, rule)).verdict

    assert outcome(right) == PASSED and outcome(wrong) == WRONG
    threaded = threading.Thread(target=lambda: results.append(judge(test, SandboxResult(
        stdout=f"\n{CALL_MARK}{json.dumps(right)}\n", stderr="", exit_code=0), rule).verdict))  # fmt: skip
    results: list[str] = []
    threaded.start()
    threaded.join()
    assert results == [PASSED]


@pytest.mark.parametrize("batch", [True, False])
def test_a_program_no_file_can_hold_is_a_runtime_error(box, batch: bool) -> None:
    """A program with a lone surrogate (the code tool's arguments are JSON: ``"\\ud800"`` decodes to one) is
    the program's error, not the reward's: on 148eb1e encoding it raised UnicodeEncodeError out of the suite
    (the tool failed, a reward would be masked)."""
    tests = [TestCase("1", "1"), TestCase("2", "2")]
    outcomes = asyncio.run(run_test_cases(box, 'mark = "\ud800"\nprint(input())', tests, batch=batch))
    assert [o.verdict for o in outcomes] == [ERROR, ERROR], outcomes
    assert "utf-8" in outcomes[0].stderr, outcomes[0]


def test_a_verdict_is_reached_off_the_event_loop_within_its_deadline(monkeypatch) -> None:
    """Finding 4: the verdict ran on the reward's event loop (a pool worker's heartbeat with it). Now it runs
    in a thread; one past its deadline is the program's (0, trained on), and the loop never waits on it."""
    release = threading.Event()

    def stalled(*args, **kwargs):
        release.wait(60)
        return grading.TestOutcome(PASSED)

    monkeypatch.setattr(grading, "judge", stalled)
    result = SandboxResult(
        stdout="1\n" * grading.INLINE_BYTES, stderr="", exit_code=0
    )  # (not tiny: judged in a thread)

    async def scenario() -> tuple[str, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        beat = asyncio.ensure_future(ticker())
        try:
            outcome = await verdict(TestCase("", "1"), result, deadline_s=1.0)
        finally:
            beat.cancel()
            release.set()
        return outcome.verdict, ticks

    got, ticks = asyncio.run(scenario())
    assert got == JUDGE_TIME_LIMIT and ticks > 1, (got, ticks)


_MEMORY = """
import asyncio, json, resource
from agentboost.sandbox import Sandbox, SandboxConfig
from agentboost.sandbox.testcases import OUTPUT_CAP, TestCase, run_test_cases
box = Sandbox(SandboxConfig(wall_s=30, cpu_s=20, memory_mb=512))
FLOOD = f"import sys\\nsys.stdout.write('x' * {{OUTPUT_CAP}})"  # the cap itself: not killed, past every limit
warm = [TestCase(f"{{i}}\\n", f"{{i}}\\n") for i in range(3)]
asyncio.run(run_test_cases(box, "print(input())", warm, batch={batch}))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
tests = [TestCase(f"{{i}}\\n", f"{{i}}\\n") for i in range(12)]
outcomes = asyncio.run(run_test_cases(box, FLOOD, tests, timeout_s=30, batch={batch}))
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - before
box.close()
print(json.dumps({{"verdicts": sorted({{o.verdict for o in outcomes}}), "grew_mb": grew}}))
"""


def _in_a_fresh_process(script: str) -> dict:
    import subprocess
    import sys

    from tests.sandbox_users import PRELUDE, REPO

    done = subprocess.run([sys.executable, "-c", PRELUDE.format(repo=str(REPO)) + script], capture_output=True,
                          text=True, timeout=300, cwd="/tmp")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("user", ["this", "ordinary"])
@pytest.mark.parametrize("batch", [True, False], ids=["batched", "alone"])
def test_no_output_is_held_past_its_verdict(user: str, batch: bool) -> None:
    """Finding 8: every test's output (up to 16 MiB, decoded) was held until the suite ended: twelve of them
    grew the process's peak by about 200 MiB. Outputs are cut at the test's limit as they come (bytes, before
    decoding) and dropped once judged. (Each in a fresh process: its peak memory is this suite's.)"""
    report = (as_ordinary_user if user == "ordinary" else _in_a_fresh_process)(_MEMORY.format(batch=batch))
    assert report["verdicts"] == [OUTPUT_LIMIT] and report["grew_mb"] < 48, report  # (one output: 16 MiB)
