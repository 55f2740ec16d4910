"""GRPO on DeepCoder problems with a Strands agent and a sandboxed code tool (rLLM + veRL).

Run `python apply_patches.py` and `python examples/deepcoder/prepare_deepcoder_data.py` first, then
`bash examples/deepcoder/train_deepcoder_with_strands.sh` (every override that matters is there).
"""

import hydra

from agentboost.environments.code_env import SYSTEM_PROMPT, CodeEnv
from agentboost.integration.train_entry import train_with_rllm


@hydra.main(config_path="pkg://rllm.trainer.config", config_name="agent_ppo_trainer", version_base=None)
def main(config) -> None:
    train_with_rllm(config, env_class=CodeEnv, dataset="strands_deepcoder",
                    agent_args={"system_prompt": SYSTEM_PROMPT},
                    prepare_script="examples/deepcoder/prepare_deepcoder_data.py")  # fmt: skip


if __name__ == "__main__":
    main()
