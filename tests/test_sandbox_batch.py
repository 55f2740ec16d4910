"""Test suites through the batch harness give the verdicts one sandbox per test gives (today's path)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import time
import types

import pytest

from agentboost.sandbox import Sandbox, SandboxConfig
from agentboost.sandbox import batch as batch_module
from agentboost.sandbox.batch import check_batches
from agentboost.sandbox.testcases import NOT_RUN, OUTPUT_LIMIT, PASSED, TIMEOUT, TestCase, run_test_cases

LIMITS = {"wall_s": 5, "cpu_s": 2, "memory_mb": 256, "max_processes": 16, "uid_count": 64}


@pytest.fixture(scope="module")
def new():
    box = Sandbox(SandboxConfig(uid_base=63500, **LIMITS))
    if not asyncio.run(check_batches(box)):
        pytest.skip(f"no batches on this machine: {box.isolation()}")
    yield box
    box.close()


@pytest.fixture(scope="module")
def old():
    """Today's path: every test in a sandbox of its own, each starting its interpreters."""
    return Sandbox(SandboxConfig(uid_base=63600, zygote=False, **LIMITS))


def numbered(n: int, output=lambda i: f"{i}\n") -> list[TestCase]:
    return [TestCase(f"{i}\n", output(i)) for i in range(n)]


def calls(n: int, expected) -> list[TestCase]:
    return [TestCase([i], expected(i), kind="call", fn_name="f") for i in range(n)]


CASES = {
    "reads-all-stdin": (
        "import sys\nprint(sum(map(int, sys.stdin.read().split())))",
        [TestCase("1 2\n3\n", "6"), TestCase("4\n5 6\n\n", "15"), TestCase("", "0"), TestCase("7", "8")],
    ),
    "prints-to-stderr": ("import sys\nn = int(input())\nprint('debug', n, file=sys.stderr)\nprint(n)", numbered(4)),
    "exits-non-zero-on-one": ("import sys\nn = int(input())\nif n == 2:\n    sys.exit(1)\nprint(n)", numbered(4)),
    "raises-on-one": ("n = int(input())\nprint([0, 1][n])", numbered(3)),
    "slow-on-one": ("import time\nn = int(input())\nif n == 1:\n    time.sleep(30)\nprint(n)", numbered(4)),
    "burns-cpu-on-one": ("n = int(input())\nwhile n == 1:\n    pass\nprint(n)", numbered(3)),
    "floods-on-one": ("n = int(input())\nprint('y' * 10_000_000 if n == 1 else n)", numbered(3)),
    "global-state-between-calls": (
        "seen = []\ndef f(x):\n    seen.append(x)\n    return len(seen)",
        calls(4, lambda i: 1),
    ),
    "class-state-between-calls": (
        "class Solution:\n    seen = []\n    def f(self, x):\n        Solution.seen.append(x)\n"
        "        return len(Solution.seen)",
        calls(3, lambda i: 1),
    ),
    "files-between-tests": (
        "import os\npaths = ('seen', '/tmp/seen', '/dev/shm/seen')\nfresh = not any(map(os.path.exists, paths))\n"
        "for p in paths:\n    open(p, 'w').write('x')\nos.mkdir('dir')\nos.chmod('dir', 0)\n"
        "print(input() if fresh else 'stale')",
        numbered(3),
    ),
    "rewrites-its-source": (
        "import os\nsrc = open(__file__).read()\n"
        "fresh = 'TAMP' + 'ERED' not in src and os.stat(__file__).st_mode & 0o777 != 0o777\n"
        "open(__file__, 'a').write('\\n# TAMP' + 'ERED\\n')\nos.chmod(__file__, 0o777)\n"
        "print(input() if fresh else 'stale')",
        numbered(3),
    ),
    "replaces-its-source": (
        "import os\nfresh = os.path.isfile(__file__)\nos.unlink(__file__)\nos.mkdir(__file__)\n"
        "print(input() if fresh else 'stale')",
        numbered(3),
    ),
    "locks-its-directories": (
        "import os\nfresh = not os.path.exists('/tmp/x') and os.stat('.').st_mode & 0o777 == 0o700\n"
        "open('/tmp/x', 'w').close()\nfor d in ('/tmp', '/dev/shm', os.getcwd(), os.path.dirname(os.getcwd())):\n"
        "    try:\n        os.chmod(d, 0)\n    except OSError:\n        pass\n"
        "print(input() if fresh else 'stale')",
        numbered(3),
    ),
    "leaves-files-on-the-way": (
        "import os\nup = os.path.dirname(os.getcwd())\nfresh = True\n"
        "try:\n    fresh = 'left' not in os.listdir(up)\n    open(up + '/left', 'w').close()\n"
        "except OSError:\n    pass\n"
        "print(input() if fresh else 'stale')",
        numbered(3),
    ),
    "leaves-a-daemon": (
        "import os, time\nn = input()\ntime.sleep(0.05)\nprint(n, os.path.exists('/tmp/daemon'))\n"
        "if os.fork() == 0:\n    os.setsid()\n    while True:\n"
        "        open('/tmp/daemon', 'a').write('x')\n        time.sleep(0.01)",
        numbered(3, lambda i: f"{i} False\n"),
    ),
    "kills-its-parent": (
        "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\nprint(input())",
        numbered(3),
    ),
    "stops-its-parent": (
        "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGSTOP)\nexcept OSError:\n    pass\nprint(input())",
        numbered(2),
    ),
    "forges-reports": (
        "import os\ntry:\n    open(f'/proc/{os.getppid()}/fd/1', 'wb').write(b'\\0' * 64)\n    print('forged')\n"
        "except OSError as e:\n    print(type(e).__name__)",
        numbered(2, lambda i: "PermissionError\n"),
    ),
    "exit-time-output": (
        "import atexit\nn = int(input())\natexit.register(print, n)\nclass A:\n    def __del__(self):\n"
        "        print('bye')\na = A()\nf = open(1, 'w', closefd=False)\nf.write('x')",
        numbered(2),
    ),
    "syntax-error": ("print(", numbered(2)),
    "call-exits-early": ("import sys\ndef f(x):\n    return x\nsys.exit(0)", calls(2, lambda i: i)),
    "call-prints-and-returns": (
        "def f(x):\n    print('noise', x)\n    return [x, str(x)]",
        calls(3, lambda i: [i, str(i)]),
    ),
    "call-imports-json-itself": (
        "import json\njson.dumps = lambda r: '999'\ndef f(x):\n    return x",
        calls(2, lambda i: i),
    ),
}


def _seen(outcomes) -> list[tuple]:
    """Verdicts and what was compared, working-directory names (random per run) and pids replaced."""
    return [(o.verdict, re.sub(r"/\S*/run-[0-9a-f-]+/", "<W>/", o.got)) for o in outcomes]


@pytest.mark.parametrize("name", list(CASES))
def test_verdicts_match_one_sandbox_per_test(new, old, name: str) -> None:
    code, tests = CASES[name]
    timeout_s = 1.0 if name in ("slow-on-one", "stops-its-parent") else 6.0
    batched = asyncio.run(run_test_cases(new, code, tests, timeout_s=timeout_s))
    alone = asyncio.run(run_test_cases(old, code, tests, timeout_s=timeout_s, batch=False))
    assert _seen(batched) == _seen(alone)


def test_the_tricky_cases_mean_what_they_say(new) -> None:
    """(So the comparison above compares something: a few of them, checked outright.)"""
    verdicts = {name: [o.verdict for o in asyncio.run(run_test_cases(new, *CASES[name], timeout_s=1.0))]
                for name in ("slow-on-one", "floods-on-one", "global-state-between-calls", "files-between-tests",
                             "leaves-a-daemon", "kills-its-parent", "forges-reports", "rewrites-its-source",
                             "replaces-its-source", "locks-its-directories", "leaves-files-on-the-way")}  # fmt: skip
    assert verdicts["slow-on-one"] == [PASSED, TIMEOUT, PASSED, PASSED]
    assert verdicts["floods-on-one"] == [PASSED, OUTPUT_LIMIT, PASSED]
    assert set(verdicts.pop("slow-on-one") + verdicts.pop("floods-on-one")) - {TIMEOUT, OUTPUT_LIMIT} == {PASSED}
    assert all(v == [PASSED] * len(v) for v in verdicts.values()), verdicts


def test_a_slow_program_stops_the_batch_after_its_first_timeout(new) -> None:
    tests = numbered(40)
    slow = "import time\nn = int(input())\ntime.sleep(60 if n == 5 else 0.1)\nprint(n)"
    started = time.monotonic()
    outcomes = asyncio.run(run_test_cases(new, slow, tests, timeout_s=1.0, stop_after_timeout=True))
    verdicts = [o.verdict for o in outcomes]
    assert verdicts[5] == TIMEOUT and verdicts.count(TIMEOUT) == 1
    assert set(verdicts) <= {PASSED, TIMEOUT, NOT_RUN} and NOT_RUN in verdicts
    assert time.monotonic() - started < 10


_SCANS_ITS_MEMORY = """
import ctypes, re, sys
sys.stdin.read()
found = set()
with open('/proc/self/maps') as maps:  # (its memory read in place: /proc/self/mem is not the program's to open)
    for line in maps:
        fields = line.split()
        if fields[1].startswith('r') and not (len(fields) > 5 and fields[5].startswith('[v')):
            lo, hi = (int(x, 16) for x in fields[0].split('-'))
            found.update(m.decode() for m in re.findall(rb'SECRET-[0-9]{4}-INPUT', ctypes.string_at(lo, hi - lo)))
print(' '.join(sorted(found)))
"""


def test_no_program_finds_a_later_input_in_its_memory(new) -> None:
    """The host sends the next input while the harness runs this one; the harness reads frame by frame, so
    the next input waits in the pipe, not in the memory each child inherits from the harness."""
    tests = [TestCase(f"SECRET-{i:04d}-INPUT\n", "") for i in range(12)]
    outcomes = asyncio.run(run_test_cases(new, _SCANS_ITS_MEMORY, tests, timeout_s=5.0))
    for i, outcome in enumerate(outcomes):
        seen = {int(m.split("-")[1]) for m in outcome.got.split()}
        assert i in seen, (i, outcome.got)  # the scan works: it finds the input it was given
        assert max(seen) == i, (i, outcome.got)


_LEAVES_FILES_ON_SOME = """
import os
n = int(input())
found = any(os.path.exists(p) for p in ('/tmp/left', '/dev/shm/left', 'left'))
if n in (2, 3):
    with open(('/tmp/left', '/dev/shm/left', 'left')[n % 3], 'wb') as fh:
        fh.write(b'x' * 4_000_000)
print(n, sum(1 for _ in open('/proc/self/mountinfo')), found)
"""


def test_inputs_that_leave_files_have_their_mounts_taken_off_at_once(new) -> None:
    """An input whose fresh mounts hold nothing at its end keeps them (covered by the next input's) until
    the session ends; one that left a file has them taken off before the next input: its files hold no
    memory of the run past it, and no later input sees them."""
    from agentboost.sandbox.batch import BatchInput, run_batch

    async def alone(i: int):
        raise AssertionError(f"input {i} was not reported")

    results = asyncio.run(run_batch(new, _LEAVES_FILES_ON_SOME, [BatchInput(f"{i}\n") for i in range(6)],
                                    timeout_s=5.0, stdout_cap=1000, single=alone, workers=1))  # fmt: skip
    seen = [r.stdout.split() for r in results]
    assert [s[0] for s in seen] == [str(i) for i in range(6)] and {s[2] for s in seen} == {"False"}, seen
    counts = [int(s[1]) for s in seen]
    steps = [b - a for a, b in itertools.pairwise(counts)]
    assert steps[0] > 0 and steps == [steps[0], steps[0], 0, 0, steps[0]], seen  # none kept after inputs 2, 3


_STOPS_ITS_HARNESS = """
import os, signal, sys, time
n = int(input())
r, w = os.pipe()
if os.fork() == 0:  # wakes the harness up once the program has exited
    os.close(w)
    os.read(r, 1)
    os.kill(2, signal.SIGCONT)
    os._exit(0)
os.close(r)
try:
    os.kill(os.getppid(), signal.SIGSTOP)  # the harness cannot enforce the time limit while stopped
except OSError:
    pass
time.sleep(n)
print(n)
sys.stdout.flush()
os._exit(0)
"""


def test_a_program_that_stops_its_harness_still_times_out(new) -> None:
    """The program and its harness share a uid: it can stop the harness (SIGSTOP) and run past its time
    limit while a helper wakes the harness after its exit. The exit came too late: a timeout, as alone."""
    tests = [TestCase("2\n", "2\n"), TestCase("0\n", "0\n")]
    batched = asyncio.run(run_test_cases(new, _STOPS_ITS_HARNESS, tests, timeout_s=1.0))
    assert batched[0].verdict == TIMEOUT, batched
    alone = asyncio.run(new.run(_STOPS_ITS_HARNESS, stdin="2\n", timeout_s=1.0))
    assert alone.timed_out, alone


def test_shipped_sample_problems_get_the_same_verdicts(new, old, tmp_path) -> None:
    """Every DeepCoder sample problem: its reference solution passes every test and a wrong program
    fails, with the same verdicts as one sandbox per test."""
    from agentboost.rewards.code import tests_of
    from tests.test_data_prep import ROOT, _script, load_rows

    prep = _script("examples/deepcoder/prepare_deepcoder_data.py")
    assert prep.main(["--sample", "--out-dir", str(tmp_path), "--register", "no"]) == 0
    raw = {}
    for name in ("primeintellect_train", "taco_train", "lcbv5_train", "lcbv5_test"):
        source, split = name.split("_")
        for i, line in enumerate((ROOT / "examples/deepcoder/sample" / f"{name}.jsonl").read_text().splitlines()):
            raw[f"{source}-{split}-{i}"] = json.loads(line)
    rows = load_rows(tmp_path / "train.jsonl") + load_rows(tmp_path / "test.jsonl")
    assert len(rows) == 6
    for row in rows:
        tests = tests_of(row, "tests")
        for program in (raw[row["task_id"]]["reference_solution"], "print('no')"):
            batched = asyncio.run(run_test_cases(new, program, tests))
            assert _seen(batched) == _seen(asyncio.run(run_test_cases(old, program, tests, batch=False)))
        reference = asyncio.run(run_test_cases(new, raw[row["task_id"]]["reference_solution"], tests))
        assert {o.verdict for o in reference} == {PASSED}, row["task_id"]


def test_without_a_pid_namespace_tests_run_one_sandbox_each(caplog) -> None:
    box = Sandbox(SandboxConfig(pid_namespace=False, zygote=False, uid_base=63700, uid_count=8))
    with caplog.at_level(logging.WARNING, logger=batch_module.__name__):
        assert asyncio.run(check_batches(box)) is False
    assert any("batches unavailable (no pid_namespace, private_proc)" in r.getMessage() for r in caplog.records)
    outcomes = asyncio.run(run_test_cases(box, "print(int(input()) * 2)", numbered(3, lambda i: f"{2 * i}\n")))
    assert [o.verdict for o in outcomes] == [PASSED] * 3


@pytest.mark.parametrize(
    "frame",
    [
        b"",  # empty
        (1).to_bytes(4, "little") + bytes(13) + bytes(4),  # another input's report
        bytes(4) + bytes(9) + (10**6).to_bytes(4, "little") + bytes(4),  # stdout longer than its cap
        bytes(4) + bytes(9) + (2).to_bytes(4, "little") + b"ok" + (5).to_bytes(4, "little") + b"e",  # short stderr
        bytes(4) + bytes(4) + bytes([9]) + bytes(4) + bytes(4) + bytes(4),  # unknown flags
    ],
    ids=["empty", "other-input", "over-cap", "truncated", "flags"],
)
def test_reports_are_checked_as_untrusted(frame: bytes) -> None:
    with pytest.raises(batch_module._Anomaly):
        batch_module._parse(frame, 0, 1000, 1000, None)


def _report(i: int, out: bytes, err: bytes = b"") -> bytes:
    body = b"".join((i.to_bytes(4, "little"), bytes(4), bytes(1), (5).to_bytes(4, "little"),
                     len(out).to_bytes(4, "little"), out, len(err).to_bytes(4, "little"), err))  # fmt: skip
    return len(body).to_bytes(4, "little") + body


def test_a_reports_stdout_past_what_its_input_keeps_is_dropped_as_it_arrives() -> None:
    """Issue 39, finding 8: the host held every report whole (up to 16 MiB) until parsed. Now what an input
    keeps (its output limit and a byte) is all it holds, even while nothing waits for the report (the
    host judging the one before) and with reports back to back; lengths are still checked."""
    from agentboost.sandbox.process import Fd

    reports = [(b"x" * 3_000_000, 10), (b"y" * 50, None), (b"abcdef", 3)]

    async def scenario() -> tuple[int, list[tuple[str, int | None]]]:
        read_end, write_end = os.pipe()
        stdin_read, stdin_write = os.pipe()
        run = types.SimpleNamespace(stdin=Fd(stdin_write), stdout=Fd(read_end))
        channel = batch_module._Channel(run)
        for _, keep in reports:
            channel.expect(keep)
        data = b"".join(_report(i, out, b"err") for i, (out, _) in enumerate(reports))
        writing = asyncio.ensure_future(asyncio.to_thread(_write_all, write_end, data))
        await writing  # all of it sent before anything receives
        await asyncio.sleep(0.2)  # (the loop reads what is left in the pipe)
        held = len(channel._buffer)
        parsed = []
        for i in range(len(reports)):
            frame, dropped = await channel.receive(10, 1 << 25)
            result = batch_module._parse(frame, i, 1 << 24, 100, None, dropped=dropped)
            parsed.append((result.stdout, result.stdout_size, result.stderr))
        channel.close()
        for fd in (read_end, stdin_read, stdin_write):
            os.close(fd)
        return held, parsed

    held, parsed = asyncio.run(scenario())
    assert held < 4096, held
    assert parsed == [("x" * 10, 3_000_000, "err"), ("y" * 50, 50, "err"), ("abc", 6, "err")], parsed


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:65536]) :]
    os.close(fd)


_AS_USER = """
import asyncio, json, sys, types
pkg = types.ModuleType('agentboost'); pkg.__path__ = [{repo!r} + '/agentboost']; sys.modules['agentboost'] = pkg
from agentboost.sandbox import Sandbox, SandboxConfig
from agentboost.sandbox.batch import check_batches
from agentboost.sandbox.testcases import TestCase, run_test_cases
cases = {cases!r}
box = Sandbox(SandboxConfig(wall_s=5, cpu_s=2, memory_mb=256, max_processes=16))
report = {{"batches": asyncio.run(check_batches(box))}}
for name, code in cases.items():
    tests = [TestCase(f"{{i}}\\\\n", f"{{i}}\\\\n") for i in range(3)]
    report[name] = [o.verdict for o in asyncio.run(run_test_cases(box, code, tests, timeout_s=2.0))]
box.close()
print(json.dumps(report))
"""


def test_as_an_ordinary_user_no_test_sees_what_the_previous_one_left() -> None:
    """As non-root the working directory lies under the private /tmp, on a way the program owns: what it
    leaves there, or anywhere it can write, is gone before the next test."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    candidates = ("/usr/bin/python3", "/usr/local/bin/python3")
    python = next((os.path.realpath(p) for p in candidates if os.path.exists(p)), None)
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if python is None or setpriv is None:
            pytest.skip("running as user nobody needs setpriv and a system python")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python]
    else:
        prefix = [sys.executable]
    names = ("files-between-tests", "rewrites-its-source", "locks-its-directories", "leaves-files-on-the-way")
    script = _AS_USER.format(repo=str(Path(__file__).resolve().parents[1]), cases={n: CASES[n][0] for n in names})
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    done = subprocess.run([*prefix, "-c", script], cwd="/tmp", env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if not report.pop("batches"):
        pytest.skip(f"no batches as an ordinary user here: {done.stderr[-500:]}")
    assert all(v == [PASSED] * 3 for v in report.values()), (report, done.stderr[-2000:])
