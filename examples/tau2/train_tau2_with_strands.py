"""GRPO on tau2-bench airline/retail with a Strands agent on a shared per-episode domain DB (rLLM + veRL).

Run `python apply_patches.py` and `python examples/tau2/prepare_tau2_data.py` first, then
`bash examples/tau2/train_tau2_with_strands.sh`. Solo mode unless a user simulator is configured: rows
prepared with --user-url/--user-model, or AGENTBOOST_TAU2_USER_URL / AGENTBOOST_TAU2_USER_MODEL (and
optionally ..._API_KEY_ENV, ..._TEMPERATURE, ..._TIMEOUT_S, ..._MAX_USER_TURNS, ..._RETRIES) set here,
which are passed to every episode as env_args (Ray actors on other nodes do not see this shell's
environment).
"""

import dataclasses

import hydra

from agentboost.environments.tau2_env import Tau2Env, UserConfig
from agentboost.integration.train_entry import train_with_rllm


def user_env_args() -> dict:
    """The user simulator configured here by $AGENTBOOST_TAU2_USER_*, sent to every episode as env_args."""
    config = UserConfig.from_environ()
    return {"user": dataclasses.asdict(config)} if config is not None else {}


@hydra.main(config_path="pkg://rllm.trainer.config", config_name="agent_ppo_trainer", version_base=None)
def main(config) -> None:
    train_with_rllm(config, env_class=Tau2Env, dataset="strands_tau2",
                    agent_args={"agent_factory": "agentboost.environments.tau2_env:tau2_agent"},
                    env_args=user_env_args(), prepare_script="examples/tau2/prepare_tau2_data.py")  # fmt: skip


if __name__ == "__main__":
    main()
