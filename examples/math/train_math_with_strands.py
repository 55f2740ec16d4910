"""GRPO on math with a Strands agent and a sandboxed Python tool (rLLM + veRL; run apply_patches.py first).

bash examples/math/train_math_with_strands.sh   # every override that matters is there
"""

from __future__ import annotations

import hydra

from agentboost import StrandsAgent
from agentboost.environments.math_env import SYSTEM_PROMPT, MathEnv


@hydra.main(config_path="pkg://rllm.trainer.config", config_name="agent_ppo_trainer", version_base=None)
def main(config) -> None:
    from rllm.data.dataset import DatasetRegistry
    from rllm.trainer.agent_trainer import AgentTrainer

    train = DatasetRegistry.load_dataset("strands_math", "train")
    test = DatasetRegistry.load_dataset("strands_math", "test")
    if train is None or test is None:
        raise SystemExit("no data: run `python examples/math/prepare_math_data.py` first")
    AgentTrainer(
        agent_class=StrandsAgent,
        env_class=MathEnv,
        agent_args={"system_prompt": SYSTEM_PROMPT},
        env_args={},
        config=config,
        train_dataset=train,
        val_dataset=test,
    ).train()


if __name__ == "__main__":
    main()
