"""GRPO on multi-hop QA with a Strands agent and a `retrieve` tool (rLLM + veRL).

Start the retrieval server first (examples/rag/README.md), run `python apply_patches.py` and
`python examples/rag/prepare_rag_data.py`, then `bash examples/rag/train_rag_with_strands.sh`.
"""

import hydra

from agentboost.environments.rag_env import SYSTEM_PROMPT, RagEnv
from agentboost.integration.train_entry import train_with_rllm


@hydra.main(config_path="pkg://rllm.trainer.config", config_name="agent_ppo_trainer", version_base=None)
def main(config) -> None:
    train_with_rllm(
        config,
        env_class=RagEnv,
        dataset="strands_rag",
        agent_args={"system_prompt": SYSTEM_PROMPT},
        prepare_script="examples/rag/prepare_rag_data.py",
    )


if __name__ == "__main__":
    main()
