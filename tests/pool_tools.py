"""Tools and a directed fake policy for the worker-pool tests (importable by spawned workers).

The task prompt says which tool to call: ``CALL <tool> <json arguments>``. The policy calls it once,
then answers ``done``.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from strands import tool

from agentboost.backends.base import FINISH_STOP, GenerationRequest, GenerationResult
from agentboost.chat.template import ChatTemplate
from agentboost.tools.strands_code_tool import make_code_tool

_HOARD: list[bytearray] = []

FAIL_FLAG_VAR = "AGENTBOOST_TEST_FAIL_FLAG"
if os.environ.get(FAIL_FLAG_VAR) and os.path.exists(os.environ[FAIL_FLAG_VAR]):  # a worker that cannot start
    raise RuntimeError(f"refusing to start: {os.environ[FAIL_FLAG_VAR]} exists")


@tool
def crash_worker() -> str:
    """Kill the process this tool runs in."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@tool
async def block_loop(seconds: float) -> str:
    """Block the worker's event loop (a badly written async tool).

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "unblocked"


@tool
def eat_memory(mb: int) -> str:
    """Allocate memory and hold it.

    Args:
        mb: megabytes
    """
    for _ in range(mb // 8):  # in 8 MB pieces, as real code grows: the worker keeps beating
        _HOARD.append(bytearray(8 * 2**20))
    time.sleep(30)
    return "ate"


@tool
def slow(seconds: float) -> str:
    """Sleep in a thread.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "slept"


@tool
def noisy(text: str) -> str:
    """Write to stdout and stderr in every way possible.

    Args:
        text: what to write
    """
    print(text)
    print(text, file=sys.stderr)
    os.write(1, b'{"not": "a protocol message"}\n')
    sys.stdout.flush()
    return "quiet now"


class _MakeDir:
    """Unpickling this creates a directory: proof that the reader executed a forged pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _ipc_sockets() -> list[int]:
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.append(int(name))
        except OSError:
            continue
    return fds


@tool
def scribble_ipc(mode: str, path: str = "") -> str:
    """Write into every socket of this process: junk, or a pickle frame that would run code when read.

    Args:
        mode: junk or pickle
        path: the directory the forged pickle creates
    """
    if mode == "pickle":
        payload = pickle.dumps(_MakeDir(path))
        data = struct.pack("!i", len(payload)) + payload
    else:
        data = b"hello from a tool, this is not a frame\n" * 4
    fds = _ipc_sockets()
    for fd in fds:
        os.write(fd, data)
    time.sleep(0.2)
    return f"scribbled on {len(fds)} socket(s)"


class Unrepresentable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise RuntimeError("no pickle")


@tool
def unrepresentable() -> dict:
    """Return a tool result holding an object whose repr and pickle raise."""
    return {"status": "success", "content": [{"text": "ok"}], "extra": Unrepresentable()}


_SLEEPER = [sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))"]
_DAEMONIZE = (
    "import subprocess, sys\n"
    "quiet = subprocess.DEVNULL\n"
    "p = subprocess.Popen(sys.argv[1:], start_new_session=True, stdin=quiet, stdout=quiet, stderr=quiet)\n"
    "print(p.pid, flush=True)\n"
)


def _detach(how: str, seconds: float) -> list[int]:
    """Start a sleeper that tries to outlive whoever started it; returns the pids to watch."""
    sleeper = [*_SLEEPER, str(seconds)]
    if how == "session":  # a new session: out of the worker's process group
        return [subprocess.Popen(sleeper, start_new_session=True).pid]
    if how == "double":  # double fork: the intermediate exits, the sleeper is orphaned
        out = subprocess.run([sys.executable, "-c", _DAEMONIZE, *sleeper], capture_output=True, text=True, timeout=30)
        return [int(out.stdout.split()[0])]
    if how == "fork":  # os.fork twice, the grandchild in a new session, no exec at all
        r, w = os.pipe()
        child = _fork()
        if child == 0:  # pragma: no cover - runs in the forked copies
            try:
                os.setsid()
                grandchild = os.fork()
                if grandchild == 0:
                    os.closerange(3, 1 << 16)  # hold no copy of the worker's pipes (others' subprocess.run)
                    time.sleep(seconds)
                else:
                    os.write(w, str(grandchild).encode())
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(child, 0)
        pid = int(os.read(r, 64))
        os.close(r)
        return [pid]
    raise ValueError(how)


@tool
def spawn(how: str, seconds: float = 300.0, hold: float = 0.0, pidfile: str = "") -> str:
    """Start a process that tries to outlive the episode, hold for a while, report whether it lives.

    Args:
        how: session, double or fork
        seconds: how long the process sleeps
        hold: how long this tool waits before checking its process
        pidfile: also write the pids here
    """
    pids = _detach(how, seconds)
    if pidfile:
        Path(pidfile).write_text(" ".join(map(str, pids)))
    time.sleep(hold)
    alive = all(_alive(pid) for pid in pids)
    return f"pids {' '.join(map(str, pids))} {'alive' if alive else 'dead'}"


@tool
def spawn_then_crash(pidfile: str) -> str:
    """Start a double-forked sleeper, record its pid, then kill the worker.

    Args:
        pidfile: where to write the pids
    """
    pids = _detach("double", 300) + _detach("session", 300)
    Path(pidfile).write_text(" ".join(map(str, pids)))
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def _fork() -> int:
    """``os.fork``, retried while a library's at-fork guard refuses (filelock does, briefly)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return os.fork()
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def tools_for(task: dict[str, Any]) -> list[Any]:
    public = [{"input": "", "output": "ok"}]
    return [
        crash_worker, block_loop, eat_memory, slow, noisy, make_code_tool(public, timeout_s=5.0),
        scribble_ipc, unrepresentable, spawn, spawn_then_crash,
    ]  # fmt: skip


def reward(task: dict[str, Any], episode: Any) -> float:
    return float(episode.final_text.strip() == "done")


class DirectedPolicy:
    """Calls the tool the prompt names (``CALL <tool> <json arguments>`` at its end), then answers ``done``,
    or the JSON string after ``ANSWER `` where the prompt has one."""

    def __init__(self, tokenizer: Any) -> None:
        self.template = ChatTemplate(tokenizer)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        text = self.template.decode(request.prompt_ids)
        start = text.find("ANSWER ")
        answer = json.JSONDecoder().raw_decode(text, start + len("ANSWER "))[0] if start >= 0 else "done"
        if "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
            out = answer
        else:
            match = re.search(r"CALL (\w+) (\{.*?\})\s*<\|im_end\|>", text, re.DOTALL)
            if match is None:
                out = answer
            else:
                call = {"name": match.group(1), "arguments": json.loads(match.group(2))}
                out = "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        ids = [*self.template.encode(out), self.template.info.eot_token_id]
        return GenerationResult(ids, [-0.1] * len(ids), FINISH_STOP, server="directed")


def directed_backend(spec: Any, tokenizer: Any) -> DirectedPolicy:
    return DirectedPolicy(tokenizer)
