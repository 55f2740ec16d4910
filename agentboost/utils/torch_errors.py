"""Telling a device that ran out of memory from a model that cannot do something.

One-time capability checks (is a shared prefix exact for this model?) catch ``RuntimeError``, which
is also what an out-of-memory error is: a passing OOM must not switch a feature off for good."""

from __future__ import annotations


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
