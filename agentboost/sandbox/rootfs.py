"""The deny-by-default filesystem of a sandboxed program: what its fresh root holds, computed on the host.

The program's root is an empty tmpfs. Into it go, read-only and at their host paths: the interpreter, its
standard library, the shared libraries the interpreter and the standard library's extension modules load
(found with ``ldd``), the loader's cache, and, only with ``site_packages=True``, the interpreter's
site-packages (plus the whole system library directories, since installed extensions may load any
library). Symlinks on the way (``/lib -> usr/lib``, a venv's ``bin/python``) are recreated, not followed
into bind mounts. Nothing else of the host is there: no ``/etc``, no home, no working directory, no data.

The plan is computed once per interpreter (a few subprocesses, ~0.3 s) and replayed by the launcher on
every run as a few dozen bind mounts (:mod:`agentboost.sandbox._launcher`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_MAX_LINK_DEPTH = 40
_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-fA-F]+\)")
_DISCOVER = (
    "import json, site, sys\n"
    "print(json.dumps({'path': [p for p in sys.path if p], 'site': site.getsitepackages(),"
    " 'prefix': sys.prefix, 'base_prefix': sys.base_prefix}))\n"
)
_RUNTIME_LIBS = ("libgcc_s.so.1",)
"""Loaded with ``dlopen`` by the C library (thread exit, unwinding), so ``ldd`` does not list them."""


class RootPlanError(RuntimeError):
    """The fresh root cannot be planned for this interpreter (no ``ldd``, the interpreter fails to start)."""


@dataclass(frozen=True)
class RootPlan:
    """Operations that build the program's root, in order (marshal-friendly tuples):
    ``("link", path, target)``, ``("ro", path, is_dir)`` (read-only bind of the host path at the same
    path), ``("hide", path)`` (an empty read-only tmpfs over a directory inside a bound tree)."""

    executable: str
    """The path to ``exec`` inside the root (the real binary unless a venv's site-packages are wanted)."""
    ops: tuple[tuple[object, ...], ...]
    visible: tuple[str, ...]
    """Every host path the program can see (bound, or a symlink on the way to one)."""


_plans: dict[tuple[str, bool, tuple[str, ...]], RootPlan] = {}
_plans_lock = threading.Lock()


def plan_for(python: str, *, site_packages: bool, hidden: Iterable[str] = ()) -> RootPlan:
    """The root for running ``python`` (cached per interpreter). ``hidden``: host directories to cover
    should they lie inside a bound tree (rLLM's dataset registry inside site-packages)."""
    key = (os.path.abspath(python), site_packages, tuple(hidden))
    with _plans_lock:
        plan = _plans.get(key)
    if plan is None:
        plan = _Planner(key[0], site_packages, key[2]).plan()
        with _plans_lock:
            _plans[key] = plan
    return plan


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _run(argv: list[str], what: str) -> str:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RootPlanError(f"{what}: {exc}") from None
    if done.returncode != 0:
        raise RootPlanError(f"{what}: exit {done.returncode}: {done.stderr[-300:]}")
    return done.stdout


class _Planner:
    def __init__(self, python: str, site_packages: bool, hidden: tuple[str, ...]) -> None:
        self.python = python
        self.site_packages = site_packages
        self.hidden = hidden
        self.links: dict[str, str] = {}
        self.binds: dict[str, bool] = {}

    def plan(self) -> RootPlan:
        real = os.path.realpath(self.python)
        executable = self.python if self.site_packages else real  # a venv only matters for its packages
        base = self._discover(real)
        self._expose(executable)
        self._expose(real)
        stdlib = [p for p in base["path"] if os.path.exists(p)]
        for path in stdlib:
            self._expose(path)
        exposed_sites: list[str] = []
        if self.site_packages:
            info = self._discover(executable, site=True)
            exposed_sites = [os.path.realpath(p) for p in info["site"] if os.path.isdir(p)]
            for path in info["site"]:
                if os.path.isdir(path):
                    self._expose(path)
            for directory in {os.path.dirname(executable), os.path.dirname(os.path.dirname(executable))}:
                if os.path.isfile(cfg := os.path.join(directory, "pyvenv.cfg")):
                    self._expose(cfg)
        libraries = self._libraries(real, stdlib)
        for library in libraries:
            self._expose(library)
        lib_dirs = list(dict.fromkeys(os.path.dirname(os.path.realpath(lib)) for lib in libraries))
        for directory in lib_dirs:
            for name in _RUNTIME_LIBS:
                if os.path.exists(candidate := os.path.join(directory, name)):
                    self._expose(candidate)
            if self.site_packages:
                self._expose(directory)
        if os.path.isfile("/etc/ld.so.cache"):
            self._expose("/etc/ld.so.cache")
        unexposed_sites = [os.path.realpath(p) for p in base["site"] if os.path.isdir(p)]
        covers = [p for p in (*self.hidden, *unexposed_sites) if p not in exposed_sites]
        return self._finish(executable, covers)

    # -- discovery ---------------------------------------------------------------------
    def _discover(self, python: str, *, site: bool = False) -> dict[str, list[str]]:
        """The interpreter's own account of its paths (``site``: with the site module, which is what
        makes a venv's site-packages its own)."""
        flags = ["-I"] if site else ["-I", "-S"]
        out = _run([python, *flags, "-c", _DISCOVER], f"{python} (paths)")
        try:
            info = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RootPlanError(f"{python}: unreadable path report {out[-200:]!r}") from None
        return info

    def _libraries(self, binary: str, stdlib: list[str]) -> list[str]:
        """Shared libraries of the interpreter and of the standard library's extension modules."""
        ldd = shutil.which("ldd", path="/usr/bin:/bin:/usr/local/bin")
        if ldd is None:
            raise RootPlanError("ldd not found: the interpreter's shared libraries cannot be listed")
        files = [binary]
        for directory in stdlib:
            if os.path.isdir(directory):
                files += sorted(e.path for e in os.scandir(directory) if e.name.endswith(".so") and e.is_file())
        found: list[str] = []
        for start in range(0, len(files), 64):
            out = _run([ldd, *files[start : start + 64]], f"ldd {binary}")
            for line in out.splitlines():
                match = _LDD_LINE.search(line)
                if match and os.path.exists(match.group(1)) and match.group(1) not in files:
                    found.append(match.group(1))
            if "not found" in out:
                logger.debug("ldd reports missing libraries for %s: %s", binary, out[-300:])
        return list(dict.fromkeys(found))

    # -- paths ---------------------------------------------------------------------------
    def _expose(self, path: str) -> None:
        real = self._resolve(os.path.abspath(path), 0)
        self.binds[real] = os.path.isdir(real)

    def _resolve(self, path: str, depth: int) -> str:
        """The real path of ``path``, recording every symlink met on the way (recreated in the root)."""
        if depth > _MAX_LINK_DEPTH:
            raise RootPlanError(f"too many levels of symbolic links: {path}")
        current = "/"
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                current = os.path.dirname(current)
                continue
            step = os.path.join(current, part)
            if os.path.islink(step):
                target = os.readlink(step)
                self.links[step] = target
                current = self._resolve(os.path.join(current, target), depth + 1)
            else:
                current = step
        return current

    def _finish(self, executable: str, covers: list[str]) -> RootPlan:
        dirs = sorted(p for p, is_dir in self.binds.items() if is_dir)

        def covered(path: str) -> bool:  # already visible through a bound directory above it
            return any(_inside(path, d) and path != d for d in dirs)

        ops: list[tuple[object, ...]] = []
        for path in sorted({*self.links, *self.binds}):
            if covered(path):
                continue
            if path in self.links:
                ops.append(("link", path, self.links[path]))
            else:
                ops.append(("ro", path, self.binds[path]))
        needed = [*self.binds, *self.links]
        for path in dict.fromkeys(os.path.realpath(p) for p in covers):
            if os.path.isdir(path) and covered(path) and not any(_inside(n, path) for n in needed):
                ops.append(("hide", path))
        visible = tuple(sorted(p for p in needed if not covered(p)))
        return RootPlan(executable=executable, ops=tuple(ops), visible=visible)
