"""How the in-process backend batches a GRPO step's rollouts: the quickstart's 64 episodes (8 tasks x 8
samples, its built-in model, its agent and tool) played by the trainer, batched (``max_batch_size`` 64,
the trainer's setting) and one request at a time (``max_batch_size`` 1), in one run.

Reported per mode: seconds per rollout (median of ``--repeats``), decoding batches and how many had each size,
compactions (finished rows leaving a batch), and the episodes' mean reward (the same in both modes:
seeded sampling draws the same tokens whatever the batch). ``--model DIR`` plays a trained quickstart
model (its ``final_model``); without it the freshly built model plays (untrained: long, unparsable
answers, so every batch decodes to its token budget). Goal: batched at least 3x faster per rollout.

    python benchmarks/rollout_batching.py [--model RUN/final_model] [--repeats 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agentboost.chat.template import ChatTemplate
from agentboost.quickstart import QuickstartConfig, quickstart_plan
from agentboost.train.trainer import GRPOTrainer


def measure(trainer: GRPOTrainer, rows: list[dict[str, Any]], *, repeats: int, n: int) -> dict[str, Any]:
    backend, sizes = trainer.backend, []
    decode = backend._decode_batch

    def recorded(requests: list[Any], stop: Any = None) -> Any:
        sizes.append(len(requests))
        return decode(requests, stop)

    backend._decode_batch = recorded  # type: ignore[method-assign]
    seconds, rewards, compactions = [], [], backend.compactions
    for k in range(repeats):
        started = time.perf_counter()
        episodes = trainer.rollout(rows, n=n, sampling=trainer.config.sampling, tag=f"bench{k}")
        seconds.append(time.perf_counter() - started)
        rewards.append(sum(e.reward or 0.0 for e in episodes) / len(episodes))
    return {
        "seconds_per_rollout": statistics.median(seconds),
        "batches_per_rollout": len(sizes) / repeats,
        "batch_sizes": {str(size): count for size, count in sorted(Counter(sizes).items())},
        "compactions_per_rollout": (backend.compactions - compactions) / repeats,
        "mean_reward": rewards,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a trained quickstart model directory (default: a fresh built-in model)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    cfg = QuickstartConfig(seed=0, run_dir="/tmp/agentboost-rollout-batching")
    plan = quickstart_plan(cfg)
    model, tokenizer = plan.build_model()
    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    template = ChatTemplate(tokenizer)
    results = {}
    for mode, batch in (("batched", None), ("one at a time", 1)):
        trainer = GRPOTrainer(model, template, plan.train_rows, env=plan.env, agent=plan.agent,
                              config=plan.train_config)  # fmt: skip
        if batch is not None:
            trainer.backend.max_batch_size = batch
        rows = plan.train_rows[: cfg.prompts_per_step]
        results[mode] = measure(trainer, rows, repeats=args.repeats, n=cfg.group_size)
    ratio = results["one at a time"]["seconds_per_rollout"] / results["batched"]["seconds_per_rollout"]
    report = {
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}",
        "model": "trained quickstart model" if args.model else "fresh built-in model (untrained)",
        "episodes_per_rollout": cfg.prompts_per_step * cfg.group_size,
        **results,
        "speedup": ratio,
        "goal_met": ratio >= 3.0,
    }
    for mode, r in results.items():
        print(f"{mode}: {r['seconds_per_rollout']:.2f} s per rollout, {r['batches_per_rollout']:.1f} batches, "
              f"{r['compactions_per_rollout']:.1f} compactions, mean reward {r['mean_reward']}")  # fmt: skip
    print(f"batched {ratio:.1f}x faster (goal: >= 3x): {'met' if ratio >= 3.0 else 'NOT met'}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
