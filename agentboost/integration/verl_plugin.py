"""Registers agentboost with the verl of this process when imported: the ``strands_agent`` agent loop, the
``agentboost_grpo`` advantage estimator and the V1 trainer's mini-batches of whole episodes
(:func:`agentboost.integration.verl_agent_loop.install`, :mod:`agentboost.integration.verl_minibatch`).

verl imports it through ``actor_rollout_ref.model.external_lib=agentboost.integration.verl_plugin`` in every
process that builds the model config (the trainer's, where advantages are computed, and the agent-loop
workers'). An unsupported verl version fails the import with a message naming the supported ones. To
combine it with an ``external_lib`` of your own, import this module from yours.

It also works around one verl 0.9.1 defect the launch scripts hit: ``PPOTrainerSeparateAsync._setup``
(``verl/trainer/ppo/v1/trainer_separate_async.py:181``) calls ``logger.info(..., flush=True)`` when
``actor_rollout_ref.hybrid_engine=false`` (what ``ASYNC=separate`` sets); ``logging`` refuses ``flush`` and the
trainer dies at start-up whenever that logger is at INFO, its default. The trainer process imports this
module (building its model config) after that trainer module and before the call: that one logger is
raised to WARNING.
"""

from __future__ import annotations

import logging
import sys

from .verl_agent_loop import install

SEPARATE_ASYNC_MODULE = "verl.trainer.ppo.v1.trainer_separate_async"


def quiet_separate_async_logger() -> bool:
    """Raise verl 0.9.1's separate_async trainer logger to WARNING (see the module docstring); whether it did."""
    module = sys.modules.get(SEPARATE_ASYNC_MODULE)
    trainer_logger = getattr(module, "logger", None)
    if isinstance(trainer_logger, logging.Logger) and trainer_logger.getEffectiveLevel() < logging.WARNING:
        trainer_logger.setLevel(logging.WARNING)
        return True
    return False


install()
quiet_separate_async_logger()
