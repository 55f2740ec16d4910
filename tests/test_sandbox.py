"""Hostile programs in the sandbox: none succeeds, and the caller survives."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import pytest

from agentboost.sandbox import Sandbox, SandboxConfig
from agentboost.sandbox.testcases import PASSED, TIMEOUT, WRONG, TestCase, outputs_match, run_test_cases
from agentboost.sandbox.uids import process_uid
from agentboost.tools.strands_code_tool import format_report, make_code_tool


@pytest.fixture(scope="module")
def sandbox():
    os.environ["AGENTBOOST_FAKE_SECRET"] = "sk-live-0000"
    # uids of their own: leftover checks by uid must not see other test processes' sandboxes
    box = Sandbox(SandboxConfig(wall_s=5, cpu_s=2, memory_mb=256, max_processes=16, uid_base=63000, uid_count=64))
    iso = box.isolation()
    print("sandbox isolation:", iso)
    return box


def run(box, code, stdin="", timeout_s=None):
    return asyncio.run(box.run(code, stdin=stdin, timeout_s=timeout_s))


def need(box, layer: str) -> None:
    if not box.isolation().get(layer):
        pytest.skip(f"isolation layer {layer!r} is not available on this machine: {box.isolation()}")


def test_runs_programs(sandbox) -> None:
    result = run(sandbox, "import sys\nprint(sys.stdin.read().upper(), end='')", stdin="hello")
    assert result.ok and result.stdout == "HELLO"


def test_environment_is_scrubbed(sandbox) -> None:
    result = run(sandbox, "import os\nprint(sorted(os.environ))\nprint(os.environ.get('AGENTBOOST_FAKE_SECRET'))")
    assert "sk-live" not in result.stdout
    assert result.stdout.splitlines()[-1] == "None"
    names = eval(result.stdout.splitlines()[0])
    assert set(names) <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE"}


def test_cannot_read_parent_environment(sandbox) -> None:
    if not (sandbox.isolation()["unprivileged_uid"] or sandbox.isolation()["private_proc"]):
        pytest.skip(f"neither an own uid nor a private /proc here: {sandbox.isolation()}")
    code = f"print(open('/proc/{os.getpid()}/environ').read())"
    result = run(sandbox, code)
    assert "sk-live" not in result.stdout and result.exit_code != 0


def test_cannot_write_outside_its_directory(sandbox, tmp_path) -> None:
    if not (sandbox.isolation()["unprivileged_uid"] or sandbox.isolation()["deny_by_default_fs"]):
        pytest.skip(f"neither an own uid nor a deny-by-default root here: {sandbox.isolation()}")
    for target in (tmp_path / "owned.txt", Path.cwd() / "owned-by-sandbox.txt", Path.home() / "owned.txt"):
        result = run(sandbox, f"open({str(target)!r}, 'w').write('x')")
        assert result.exit_code != 0, target
        refusals = ("Permission denied", "No such file or directory", "Read-only file system")  # hidden: read-only
        assert any(refusal in result.stderr for refusal in refusals), result.stderr
        assert not target.exists()


def test_private_tmp(sandbox) -> None:
    need(sandbox, "private_tmp")
    marker = f"/tmp/agentboost-sandbox-marker-{os.getpid()}"
    result = run(sandbox, f"open({marker!r}, 'w').write('x')\nprint('wrote')")
    assert result.ok  # it may write its own private /tmp...
    assert not os.path.exists(marker)  # ...which is not ours


def test_host_directories_are_hidden(sandbox) -> None:
    """Gold answers in prepared datasets are not readable: with the deny-by-default root nothing of the host
    is there, hidden or not; in the deny-list mode the hidden paths (working directory, home, rLLM's
    registry) are covered."""
    need(sandbox, "mount_namespace")
    hidden = sandbox.isolation()["hidden_paths"]
    cwd = os.path.realpath(os.getcwd())
    interpreter = os.path.realpath(sandbox.isolation()["python"])
    assert cwd in hidden or interpreter.startswith(cwd + "/"), (cwd, sandbox.isolation())
    secret = Path("/var/lib") / f"agentboost-test-{os.getpid()}"
    secret.mkdir(mode=0o755)
    try:
        (secret / "answers.jsonl").write_text('{"answer": "204"}')
        (secret / "answers.jsonl").chmod(0o644)
        path = str(secret / "answers.jsonl")
        code = (
            f"import os\ntry:\n    print(open({path!r}).read())\nexcept OSError as e:\n    print(type(e).__name__)\n"
            f"try:\n    print(os.listdir({str(secret)!r}))\nexcept OSError as e:\n    print(type(e).__name__)\n"
        )
        if sandbox.isolation()["deny_by_default_fs"]:
            absent = run(Sandbox(SandboxConfig(hidden_paths=())), code)
            assert absent.stdout.splitlines() == ["FileNotFoundError", "FileNotFoundError"]
        shown = run(Sandbox(SandboxConfig(hidden_paths=(), deny_by_default=False)), code)
        assert shown.stdout.splitlines() == ['{"answer": "204"}', "['answers.jsonl']"]  # deny-list: unless hidden
        listed = Sandbox(SandboxConfig(hidden_paths=(str(secret),), deny_by_default=False))
        concealed = run(listed, code)
        assert concealed.stdout.splitlines() == ["FileNotFoundError", "[]"]
        writes = run(listed, f"open({str(secret / 'x')!r}, 'w')")
        assert writes.exit_code != 0 and not (secret / "x").exists()
    finally:
        for child in secret.iterdir():
            child.unlink()
        secret.rmdir()


def test_more_runs_than_threads_finish_and_cancelled_waiters_return_their_slots(sandbox) -> None:
    """Waiting for a slot holds no thread: far more runs than the default executor's threads finish."""

    async def scenario() -> tuple[int, int]:
        results = await asyncio.wait_for(asyncio.gather(*(sandbox.run("print(1)") for _ in range(60))), 120)
        waiting = [asyncio.ensure_future(sandbox.run("import time; time.sleep(0.3)")) for _ in range(40)]
        await asyncio.sleep(0.1)
        for task in waiting[::2]:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return sum(r.ok for r in results), sandbox.slots.free

    ok, free = asyncio.run(scenario())
    assert ok == 60 and free == sandbox.config.slots


def test_fork_bomb_is_contained(sandbox) -> None:
    started = time.monotonic()
    result = run(sandbox, "import os\nwhile True:\n    os.fork()")
    assert not result.ok and time.monotonic() - started < 6
    assert _leftovers(result.uid) == []


def test_memory_bomb_is_contained(sandbox) -> None:
    result = run(sandbox, "x = bytearray(4 * 1024**3)\nprint('allocated')")
    assert result.exit_code != 0 and "MemoryError" in result.stderr


def test_infinite_loop_hits_the_cpu_limit(sandbox) -> None:
    started = time.monotonic()
    result = run(sandbox, "while True:\n    pass")
    assert not result.ok
    assert result.signal == 24 or result.timed_out  # SIGXCPU after 2 CPU-seconds, or the wall clock
    assert time.monotonic() - started < 6


def test_sleeping_forever_hits_the_wall_clock(sandbox) -> None:
    result = run(sandbox, "import time\ntime.sleep(100)", timeout_s=1.0)
    assert result.timed_out and result.exit_code is None


def test_no_network(sandbox) -> None:
    need(sandbox, "network_namespace")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    result = run(sandbox, code)
    server.close()
    assert result.exit_code != 0 and "connected" not in result.stdout


def test_cannot_kill_its_parent_or_anything_else(sandbox) -> None:
    me = os.getpid()
    code = (
        "import os, signal\n"
        "hits = 0\n"
        f"for pid in [os.getppid(), {me}, 1]:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL); hits += 1\n"
        "    except OSError:\n        pass\n"
        "print(hits)"
    )
    result = run(sandbox, code)
    assert os.getpid() == me  # we are alive
    if sandbox.isolation().get("unprivileged_uid"):
        assert result.stdout.strip() == "0"  # a uid of its own: every kill is refused
    if sandbox.isolation().get("pid_namespace"):  # as non-root, kill(1) "succeeds" but the kernel drops it
        assert result.ok, result  # its PID 1, the only process outside itself it can name, survived


def test_output_is_capped_and_a_flood_ends_the_run(sandbox) -> None:
    started = time.monotonic()
    result = run(sandbox, "print('x' * 10_000_000)\nimport time\ntime.sleep(30)", timeout_s=20)
    assert result.stdout_truncated and len(result.stdout) == SandboxConfig().stdout_cap
    assert result.output_limited and not result.ok and result.signal == 9 and not result.timed_out
    assert time.monotonic() - started < 15  # killed when it went past the cap, not at the wall clock


def test_daemons_die_with_the_program(sandbox) -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = run(sandbox, code)
    assert result.ok
    assert _leftovers(result.uid) == []


def _leftovers(uid: int | None) -> list[str]:
    """Host processes still running as the run's own uid (None: it had none; its PID namespace is gone)."""
    if uid is None:
        return []
    time.sleep(0.2)
    return [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == uid]


def _uid_of(pid: str) -> int:
    """(From ``status``: a program is not dumpable, its ``/proc/<pid>`` belongs to root.)"""
    uid = process_uid(int(pid))
    return -1 if uid is None else uid


# --- test cases and the code tool -------------------------------------------------------
def test_outputs_match() -> None:
    assert outputs_match("1 2\n3\n", "1 2   \n3")
    assert not outputs_match("1 2\n3", "1 2 3")
    assert outputs_match("0.3333333", "0.33333334", float_tolerance=1e-6)
    assert not outputs_match("0.33", "0.34", float_tolerance=1e-6)


def test_stdin_and_call_tests(sandbox) -> None:
    tests = [
        TestCase("3\n1 2 3\n", "6"),
        TestCase("2\n5 5\n", "10"),
        TestCase([[1, 2, 3]], [3, 2, 1], kind="call", fn_name="rev"),
    ]
    code = "def rev(x):\n    return x[::-1]\nimport sys\nif __name__ == '__main__' and False: pass\n"
    stdin_code = "n = int(input())\nprint(sum(map(int, input().split())))"
    outcomes = asyncio.run(run_test_cases(sandbox, stdin_code, tests[:2]))
    assert [o.verdict for o in outcomes] == [PASSED, PASSED]
    call = asyncio.run(run_test_cases(sandbox, code, tests[2:]))
    assert call[0].verdict == PASSED
    wrong = asyncio.run(run_test_cases(sandbox, "print(7)", tests[:1]))
    assert wrong[0].verdict == WRONG
    slow = asyncio.run(run_test_cases(sandbox, "while True: pass", tests[:1], timeout_s=1.0))
    assert slow[0].verdict == TIMEOUT


def test_code_tool_report_is_deterministic(sandbox) -> None:
    tests = [TestCase("1 2", "3"), TestCase("2 2", "4")]
    tool = make_code_tool(tests, sandbox=sandbox)
    code = "a, b = map(int, input().split())\nprint(a + b if a == 1 else a * b + 1)"
    first = asyncio.run(tool._tool_func(code=code))
    second = asyncio.run(tool._tool_func(code=code))
    assert first == second
    text = first["content"][0]["text"]
    assert text.startswith("Public tests: 1/2 passed.")
    assert "Test 2: wrong answer" in text and "expected:\n    4" in text and "got:\n    5" in text
    assert tool.tool_spec["inputSchema"]["json"]["required"] == ["code"]
    empty = asyncio.run(tool._tool_func(code="  "))
    assert empty["status"] == "error"


def test_format_report_caps_fields() -> None:
    from agentboost.sandbox.testcases import TestOutcome

    report = format_report([TestCase("x" * 5000, "y")], [TestOutcome(WRONG, "z" * 5000)], 5.0)
    assert "more characters" in report and len(report) < 2000
