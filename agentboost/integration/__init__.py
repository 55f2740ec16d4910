"""The bridge from Strands episodes to rLLM + veRL 0.6.1 training and to verl 0.9's agent loops.

Everything here is plain agentboost code that imports neither rLLM nor veRL at module import, so it is
tested in CI with faithful fakes. ``modified_rllm_files/`` and ``modified_verl_files/`` hold the small
adapters that ``apply_patches.py`` hooks into the installed upstream modules; they call into here.

* :mod:`.config`: rLLM/veRL config -> train and validation :class:`~agentboost.rollout.RolloutSettings`.
* :mod:`.rollouts`: run a batch of Strands episodes against the rollout servers (weights woken and
  synced before, servers put to sleep after; sticky routing by episode and GRPO group).
* :mod:`.verl_batch`: episodes -> the tensors rLLM's PPO trainer expects, masked padding, per-row
  GRPO group isolation of failed episodes.
* :mod:`.metrics`: Strands metrics for W&B and the rollout-vs-trainer log-prob gap alarm.
* :mod:`.train_entry`: the body of the examples' ``train_<x>_with_strands.py`` (rLLM's ``AgentTrainer``).
* :mod:`.verl_agent_loop`: the patch-free route for verl 0.9: the ``strands_agent`` agent loop (wired
  by the shipped ``verl_agent_loop.yaml`` and Hydra overrides), :mod:`.verl_advantage` (the
  ``agentboost_grpo`` estimator that carries the masking rule) and :mod:`.verl_plugin` (registers both
  through ``actor_rollout_ref.model.external_lib``).
"""
