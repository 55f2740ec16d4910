"""The launcher CI uses for its one real vLLM server (``python -m agentboost.testing.vllm_server``), without
vLLM: ``serve`` hands the arguments it does not know to vLLM's command line, ``wait --pid`` fails at once,
with the log's tail, when the server's process is gone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def _launcher(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentboost.testing.vllm_server", *args], capture_output=True,
                          text=True, timeout=timeout_s)  # fmt: skip


def test_serve_passes_unknown_arguments_to_vllm(tmp_path: Path) -> None:
    fake = tmp_path / "python"  # stands in for a vLLM interpreter: prints the command line it was given
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\nprint(json.dumps([sys.argv[1:], "
                    "os.environ.get('VLLM_CPU_KVCACHE_SPACE')]))\n")  # fmt: skip
    fake.chmod(0o755)
    done = _launcher("serve", "--python", str(fake), "--model", "m", "--port", "8123", "--enforce-eager")
    assert done.returncode == 0, done.stderr
    argv, kv_cache = json.loads(done.stdout.strip().splitlines()[-1])
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"] and argv[-1] == "--enforce-eager"
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--dtype") + 1] == "float32"
    assert kv_cache == "1"


def test_wait_rejects_unknown_arguments() -> None:
    done = _launcher("wait", "http://127.0.0.1:9", "--enforce-eager")
    assert done.returncode == 2 and "unrecognized arguments: --enforce-eager" in done.stderr


def test_wait_fails_at_once_when_the_server_process_is_gone(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("RuntimeError: the engine core died\n")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = _launcher("wait", "http://127.0.0.1:9", "--log", str(log), "--pid", str(gone.pid), "--timeout", "600")
    assert done.returncode == 1
    assert f"process {gone.pid} is gone" in done.stderr and "the engine core died" in done.stderr


def test_wait_takes_an_unreaped_server_for_dead() -> None:
    """CI's server is a child of the CI shell, which reaps it only when it waits: exited, it is a zombie."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):
            if Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                break
            time.sleep(0.05)
        done = _launcher("wait", "http://127.0.0.1:9", "--pid", str(child.pid), "--timeout", "600")
        assert done.returncode == 1 and f"process {child.pid} is gone" in done.stderr
    finally:
        child.wait()
