"""The quickstart as a script: the same code as `agentboost quickstart`, spelled out so you can swap in
your own environment, tools, reward and model.

    python examples/quickstart/train_quickstart.py --run-dir runs/my-quickstart [--grpo-steps 40]

Steps: tasks -> small model + tokenizer -> demonstrations (real episodes played by a scripted policy)
-> supervised warm start -> held-out evaluation -> GRPO -> held-out evaluation -> curves.
"""

from __future__ import annotations

import argparse
import logging

from agentboost.agents.strands_agent import StrandsAgent
from agentboost.chat.template import ChatTemplate
from agentboost.environments.arithmetic import SYSTEM_PROMPT, make_tasks
from agentboost.quickstart import ENV, QuickstartConfig, _build_model, warm_start
from agentboost.train.metrics import plot_curves
from agentboost.train.trainer import GRPOTrainer, TrainConfig
from agentboost.types import Budget, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="runs/quickstart-script")
    parser.add_argument("--grpo-steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    # 1. Tasks: rows that StrandsEnv.from_dict understands (prompt + whatever the reward needs).
    quick = QuickstartConfig(seed=args.seed)
    #    Written "7*8" (quick.spaced_expressions is False): see QuickstartConfig for why.
    tasks = {"seed": args.seed, "max_ops": 1, "max_value": quick.max_value, "spaced": quick.spaced_expressions}
    train_rows = make_tasks(512, split="train", **tasks)
    eval_rows = make_tasks(64, split="eval", **tasks)

    # 2. Model and tokenizer (replace with AutoModelForCausalLM / AutoTokenizer for a real model).
    model, tokenizer = _build_model(quick, train_rows)
    template = ChatTemplate(tokenizer)
    agent = StrandsAgent(system_prompt=SYSTEM_PROMPT)  # or StrandsAgent(my_agent_factory)

    # 3. The trainer: GRPO with rollouts from the live weights.
    config = TrainConfig(
        run_dir=args.run_dir, steps=args.grpo_steps, prompts_per_step=8, group_size=8, lr=3e-4, eval_every=10,
        seed=args.seed, sampling=SamplingParams(temperature=1.0, max_tokens_per_call=48),
        eval_sampling=SamplingParams(temperature=0.0, max_tokens_per_call=48),
        budget=Budget(max_turns=4, max_total_tokens=1024), wandb_project=None,
    )  # fmt: skip
    trainer = GRPOTrainer(model, template, train_rows, eval_rows=eval_rows, env=ENV, agent=agent, config=config)

    # 4. Warm start on demonstrations (skip for a pretrained model that can already call tools): both
    #    answer styles per prompt, 30% bare number (rewarded) / 70% "The answer is 56." (not rewarded),
    #    until a sampled check shows the policy reproduces them, rewarded style included (ceiling: 1500 steps).
    warm = warm_start(quick, trainer, train_rows, steps=1500)
    logging.info("warm start: %d steps, sampled check %.2f", warm["steps"], warm["check"])

    # 5. GRPO.
    before = trainer.evaluate(tag="before")
    history = trainer.fit(resume=True)
    after = trainer.evaluate(tag="after")
    plot_curves(history, f"{args.run_dir}/curves.png")
    logging.info("held-out success: %.3f -> %.3f", before["eval/success_rate"], after["eval/success_rate"])


if __name__ == "__main__":
    main()
