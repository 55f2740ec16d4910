"""Registers agentboost with the verl of this process when imported: the ``strands_agent`` agent loop and the
``agentboost_grpo`` advantage estimator (:func:`agentboost.integration.verl_agent_loop.install`).

verl imports it through ``actor_rollout_ref.model.external_lib=agentboost.integration.verl_plugin`` in every
process that builds the model config (the trainer's, where advantages are computed, and the agent-loop
workers'). An unsupported verl version fails the import with a message naming the supported ones. To
combine it with an ``external_lib`` of your own, import this module from yours.
"""

from __future__ import annotations

from .verl_agent_loop import install

install()
