"""GRPO on tau2-bench airline/retail with a Strands agent on a shared per-episode domain DB (rLLM + veRL).

Run `python apply_patches.py` and `python examples/tau2/prepare_tau2_data.py` first, then
`bash examples/tau2/train_tau2_with_strands.sh` (solo mode by default; README: the user simulator).
"""

import hydra

from agentboost.environments.tau2_env import Tau2Env
from agentboost.integration.train_entry import train_with_rllm


@hydra.main(config_path="pkg://rllm.trainer.config", config_name="agent_ppo_trainer", version_base=None)
def main(config) -> None:
    train_with_rllm(config, env_class=Tau2Env, dataset="strands_tau2",
                    agent_args={"agent_factory": "agentboost.environments.tau2_env:tau2_agent"},
                    prepare_script="examples/tau2/prepare_tau2_data.py")  # fmt: skip


if __name__ == "__main__":
    main()
