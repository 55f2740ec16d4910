"""The body of every ``examples/<x>/train_<x>_with_strands.py``: rLLM's ``AgentTrainer`` with agentboost's agent."""

from __future__ import annotations

from typing import Any


def train_with_rllm(
    config: Any,
    *,
    env_class: type,
    dataset: str,
    prepare_script: str,
    agent_args: dict[str, Any] | None = None,
    env_args: dict[str, Any] | None = None,
) -> None:
    """Train ``StrandsAgent`` in ``env_class`` on the ``train``/``test`` splits of the registered ``dataset``."""
    from rllm.data.dataset import DatasetRegistry
    from rllm.trainer.agent_trainer import AgentTrainer

    from ..agents.strands_agent import StrandsAgent

    train = DatasetRegistry.load_dataset(dataset, "train")
    test = DatasetRegistry.load_dataset(dataset, "test")
    if train is None or test is None:
        raise SystemExit(f"dataset {dataset!r} is not registered: run `python {prepare_script}` first")
    AgentTrainer(
        agent_class=StrandsAgent,
        env_class=env_class,
        agent_args=dict(agent_args or {}),
        env_args=dict(env_args or {}),
        config=config,
        train_dataset=train,
        val_dataset=test,
    ).train()
