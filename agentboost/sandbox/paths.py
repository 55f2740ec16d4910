"""Which host directories a program must not see, and which interpreter can run it without them."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
SYSTEM_DIRS = frozenset({"/", "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/var", "/tmp", "/run",
                         "/opt", "/srv", "/home", "/boot", "/mnt", "/media", "/proc", "/sys", "/dev"})  # fmt: skip


def inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def rllm_data_dirs() -> list[str]:
    """Where rLLM's ``DatasetRegistry`` keeps registered datasets (found without importing rLLM)."""
    try:
        spec = importlib.util.find_spec("rllm")
    except (ImportError, ValueError):
        return []
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return [str(Path(loc) / "data") for loc in locations if (Path(loc) / "data").is_dir()]


def hide_candidates(wanted: tuple[str, ...] | None, sandbox_root: Path) -> list[str]:
    """The directories to hide (``SandboxConfig.hidden_paths``, default: this process's working directory,
    home and rLLM's registry), minus those that cannot be covered (system directories, the sandbox root)."""
    if wanted is None:
        wanted = (os.getcwd(), os.path.expanduser("~"), *rllm_data_dirs())
    root = os.path.realpath(sandbox_root)
    out: list[str] = []
    for path in wanted:
        real = os.path.realpath(path)
        if real in SYSTEM_DIRS or any(inside(real, d) for d in ("/proc", "/sys", "/dev")) or inside(root, real):
            continue
        out.append(real)
    return list(dict.fromkeys(out))


def hidden_for(hide: list[str], python: str) -> list[str]:
    """The hidden directories that leave ``python`` (and its installation) reachable (deny-list)."""
    keep = {os.path.abspath(python), os.path.realpath(python)}
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        keep |= {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    return [d for d in hide if not any(inside(k, d) for k in keep)]


def interpreter_candidates(configured: str | None, site_packages: bool, hide: list[str]) -> list[str]:
    """Interpreters to try, best first: the configured one; a system one when this one lives in a hidden
    directory and only the standard library is wanted; else this one."""
    if configured:
        candidates = [configured]
    elif not site_packages and len(hidden_for(hide, sys.executable)) < len(hide):
        candidates = [*SYSTEM_PYTHONS, sys.executable]
    else:
        candidates = [sys.executable, *SYSTEM_PYTHONS]
    return list(dict.fromkeys(x for x in candidates if x and os.path.exists(x)))
