"""Import references: ``"package.module:attr"`` strings that name code in config and dataset rows."""

from __future__ import annotations

import importlib
from typing import Any


def resolve(ref: Any) -> Any:
    """Return ``ref`` itself unless it is a ``"module:attr"`` / ``"module"`` string, which is imported."""
    if not isinstance(ref, str):
        return ref
    module_name, _, attr = ref.partition(":")
    if not module_name:
        raise ValueError(f"invalid import reference {ref!r} (expected 'package.module:attr')")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import {module_name!r} (from reference {ref!r}): {exc}") from exc
    if not attr:
        return module
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{module_name!r} has no attribute {attr!r} (from reference {ref!r})") from None
    return obj


def reference_of(obj: Any) -> str:
    """The ``"module:qualname"`` reference that :func:`resolve` maps back to ``obj``.

    Raises ``ValueError`` for objects that cannot be found again by import (lambdas, closures,
    objects defined in ``__main__`` of another process).
    """
    if isinstance(obj, str):
        return obj
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if module is None and hasattr(obj, "__spec__"):  # a module
        return str(obj.__name__)
    if not module or not qualname or "<" in qualname:
        raise ValueError(f"{obj!r} is not importable by reference (define it at module top level)")
    ref = f"{module}:{qualname}"
    if module != "__main__" and resolve(ref) is not obj:
        raise ValueError(f"{obj!r} does not resolve back from {ref!r}")
    return ref
