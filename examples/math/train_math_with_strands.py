"""GRPO on math with a Strands agent and a sandboxed Python tool (rLLM + veRL).

Run `python apply_patches.py` and `python examples/math/prepare_math_data.py` first, then
`bash examples/math/train_math_with_strands.sh` (every override that matters is there).
"""

import hydra

from agentboost.environments.math_env import SYSTEM_PROMPT, MathEnv
from agentboost.integration.train_entry import train_with_rllm


@hydra.main(config_path="pkg://rllm.trainer.config", config_name="agent_ppo_trainer", version_base=None)
def main(config) -> None:
    train_with_rllm(config, env_class=MathEnv, dataset="strands_math", agent_args={"system_prompt": SYSTEM_PROMPT},
                    prepare_script="examples/math/prepare_math_data.py")  # fmt: skip


if __name__ == "__main__":
    main()
