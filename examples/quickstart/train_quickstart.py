"""The quickstart as a script: the same loop as ``agentboost quickstart`` and ``agentboost train``
(:func:`agentboost.train.run.run_training`), with every piece spelled out so you can swap in your own
rows, environment (tools, reward), agent, model and warm start.

    python examples/quickstart/train_quickstart.py --run-dir runs/my-quickstart [--grpo-steps 20]

Steps: tasks -> small model + tokenizer -> demonstrations (real episodes played by a scripted policy)
-> supervised warm start -> held-out evaluation -> GRPO -> held-out evaluation -> curves, summary.json
(rerun the same command to resume, after Ctrl-C too). For rows in a file and a model directory, the
command line does all of this: ``agentboost train --data rows.jsonl --env module:Env --model DIR``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks
from agentboost.quickstart import ENV, QuickstartConfig, build_quickstart_model, check_resumable
from agentboost.train.demonstration import DemonstrationWarmStart
from agentboost.train.models import model_record
from agentboost.train.run import RunPlan, format_run_summary, run_training
from agentboost.train.trainer import TrainConfig
from agentboost.types import Budget, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="runs/quickstart-script")
    parser.add_argument("--grpo-steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    # 1. Rows that your environment's from_dict understands (prompt + whatever the reward needs), and the
    #    environment (tools + reward) as module:Class. Written "7*8" (see QuickstartConfig.spaced_expressions).
    quick = QuickstartConfig(seed=args.seed, grpo_steps=args.grpo_steps, run_dir=args.run_dir, wandb_project=None)
    tasks = {"seed": args.seed, "max_ops": quick.max_ops, "max_value": quick.max_value, "spaced": False}
    train_rows = make_tasks(quick.train_tasks, split="train", **tasks)
    eval_rows = make_tasks(quick.eval_tasks, split="eval", **tasks)
    env = ENV  # your "mypkg.envs:MyEnv"

    # 2. The agent: a system prompt, or StrandsAgent(my_agent_factory) for your own strands.Agent.
    agent = StrandsAgent(system_prompt=SYSTEM_PROMPT)

    # 3. The model: () -> (model, tokenizer). Here a small model built from a config; for a real one,
    #    agentboost.train.models.load_model("models/Qwen2.5-0.5B-Instruct", lora=..., device=..., dtype=...).
    def build_model():
        return build_quickstart_model(quick, train_rows)

    # 4. GRPO, with rollouts from the live weights.
    config = TrainConfig(
        run_dir=args.run_dir, steps=args.grpo_steps, prompts_per_step=8, group_size=8, lr=3e-4, eval_every=10,
        seed=args.seed, sampling=SamplingParams(temperature=1.0, max_tokens_per_call=48),
        eval_sampling=SamplingParams(temperature=0.0, max_tokens_per_call=48),
        budget=Budget(max_turns=4, max_total_tokens=1024), wandb_project=None,
    )  # fmt: skip

    # 5. A warm start (None for a pretrained model that already calls tools): both answer styles per prompt,
    #    30% bare number (rewarded) / 70% "The answer is 56." (not rewarded), until a check shows the policy
    #    reproduces them in both styles (ceiling 2400 steps). Anything with run(trainer, directory, progress=) works
    #    (agentboost.train.warm_start: EpisodeWarmStart trains on episodes, e.g. a frontier model's).
    warm = DemonstrationWarmStart(quick, train_rows, steps=2400)

    plan = RunPlan(
        run_dir=Path(args.run_dir), title="Quickstart (script)", config=asdict(quick), train_rows=train_rows,
        eval_rows=eval_rows, env=env, agent=agent, build_model=build_model,
        model_record=model_record(None, lora=None, dtype="float32"), train_config=config, warm_start=warm,
        seed=args.seed, check_resumable=lambda run_dir: check_resumable(quick, run_dir),  # same tasks and vocabulary
    )  # fmt: skip
    summary = run_training(plan)
    sys.stdout.write(format_run_summary(summary, title="Quickstart (script): held-out tasks") + "\n")


if __name__ == "__main__":
    main()
