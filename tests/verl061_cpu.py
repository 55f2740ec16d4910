"""verl 0.6.1's rollout workers on a machine without GPUs: the one change they need, loaded from outside verl.

``verl/utils/distributed.py``'s ``initialize_global_process_group_ray`` (called by ``vLLMAsyncRollout._init_worker``
in ``verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py``) asks torch for the backend
``"cpu:gloo,<device>:nccl"``, which on a CPU device names ``cpu`` twice and torch refuses ("Duplicate device
type cpu"). This module makes it a plain ``gloo`` process group. verl imports it in every process when
``VERL_USE_EXTERNAL_MODULES=tests.verl061_cpu`` (``verl/__init__.py``) and the checkout is on ``PYTHONPATH``,
before ``vllm_rollout_spmd`` binds the function. Used by tests/rllm_route_probe.py only.
"""

from __future__ import annotations

from typing import Any


def _gloo_process_group(timeout_second: Any = None) -> None:
    from datetime import timedelta

    import torch.distributed

    if not torch.distributed.is_initialized():
        timeout = timedelta(seconds=timeout_second) if timeout_second is not None else None
        torch.distributed.init_process_group(backend="gloo", timeout=timeout)  # RANK, WORLD_SIZE, MASTER_*: Ray's


def _install() -> None:
    from verl.utils import distributed

    distributed.initialize_global_process_group_ray = _gloo_process_group


_install()
