"""Install agentboost's adapters into the installed rLLM and veRL (the logic of ``apply_patches.py``).

Nothing upstream is copied or overwritten whole. Each target module gets one marked block appended at
its end; the block imports the adapter from ``modified_rllm_files`` / ``modified_verl_files`` and calls
``install(globals())`` once the module has run, which subclasses or wraps the module's own classes::

    # >>> agentboost adapter v1 orig_sha256=<sha> orig_bytes=<n> (remove: python apply_patches.py --revert) >>>
    ...
    # <<< agentboost adapter <<<

* The installed versions are checked first (rLLM 0.2.1 - the v0.2.1.post1 tag reports 0.2.1 - and veRL
  0.6.1) and so is every target file's sha256 against the upstream files the adapters were written
  for; on a mismatch nothing is changed (``--force`` accepts unknown file contents of a supported
  version, never an unsupported version).
* All targets are prepared and checked before the first write; files are replaced atomically and a
  failure part-way restores the ones already written.
* Idempotent: a target that carries the current block is left alone; one with an older block is
  brought up to date from its original bytes. The original is kept next to the file
  (``<file>.agentboost-orig``), written once and never overwritten.
* ``--revert`` restores the original bytes exactly (checked against the sha256 in the marker);
  ``--check`` reports each target's state and exits non-zero unless all are patched and current.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import logging
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

logger = logging.getLogger("agentboost.patching")

BLOCK_VERSION = 1
BEGIN = "# >>> agentboost adapter"
END = "# <<< agentboost adapter <<<"
BACKUP_SUFFIX = ".agentboost-orig"
_MARKER_RE = re.compile(
    r"\n?# >>> agentboost adapter v(?P<v>\d+) orig_sha256=(?P<sha>[0-9a-f]{64}) orig_bytes=(?P<n>\d+)[^\n]*\n"
)


@dataclass(frozen=True)
class Target:
    dist: str
    versions: tuple[str, ...]
    module: str
    relpath: str
    adapter: str
    known_sha256: tuple[str, ...]


TARGETS: tuple[Target, ...] = (
    Target(
        dist="rllm",
        versions=("0.2.1",),
        module="rllm.engine.agent_execution_engine",
        relpath="rllm/engine/agent_execution_engine.py",
        adapter="modified_rllm_files.agent_execution_engine",
        known_sha256=("f7632728220805371b202eceb0af295188ea0bcd8eb1ce80815f50299c03c4e4",),  # v0.2.1.post1
    ),
    Target(
        dist="rllm",
        versions=("0.2.1",),
        module="rllm.trainer.verl.agent_ppo_trainer",
        relpath="rllm/trainer/verl/agent_ppo_trainer.py",
        adapter="modified_rllm_files.agent_ppo_trainer",
        known_sha256=("77b0a5c79cc0844e892dae9796eac79bea06953b8ca077113172f1e147069599",),  # v0.2.1.post1
    ),
    Target(
        dist="verl",
        versions=("0.6.1",),
        module="verl.workers.rollout.vllm_rollout.vllm_async_server",
        relpath="verl/workers/rollout/vllm_rollout/vllm_async_server.py",
        adapter="modified_verl_files.vllm_async_server",
        known_sha256=("731c21c4e240baf614ca256626f09f755360ade68e3d5fbd6669395d9e56095d",),  # verl 0.6.1
    ),
)


class State(str, Enum):
    CLEAN = "clean"
    PATCHED = "patched"
    OUTDATED = "outdated"
    """Carries an older agentboost block."""
    DAMAGED = "damaged"
    """Carries a block, but the bytes before it are not the original they claim to be."""


class PatchError(RuntimeError):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def block_for(target: Target, original: bytes) -> bytes:
    text = (
        f"\n{BEGIN} v{BLOCK_VERSION} orig_sha256={sha256(original)} orig_bytes={len(original)} "
        "(remove: python apply_patches.py --revert) >>>\n"
        "try:\n"
        f"    from {target.adapter} import install as _agentboost_install\n"
        "except ImportError as _agentboost_error:  # agentboost is not importable here: upstream behaviour\n"
        "    import logging as _agentboost_logging\n\n"
        "    _agentboost_logging.getLogger(__name__).warning(\n"
        '        "agentboost adapter %s not loaded (%s); running upstream code", '
        f'"{target.adapter}", _agentboost_error\n'
        "    )\n"
        "else:\n"
        "    _agentboost_install(globals())\n"
        f"{END}\n"
    )
    return text.encode()


@dataclass
class Located:
    target: Target
    version: str | None
    path: Path | None


def locate(target: Target) -> Located:
    """Find the installed file without importing the package (importing veRL pulls in torch and vLLM)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(target.dist)
    except PackageNotFoundError:
        return Located(target, None, None)
    path = Path(str(dist.locate_file(target.relpath)))
    if not path.is_file():  # editable installs: ask the import system (imports the parent packages)
        try:
            spec = importlib.util.find_spec(target.module)
        except Exception:
            spec = None
        path = Path(spec.origin) if spec is not None and spec.origin else None  # type: ignore[assignment]
    return Located(target, dist.version, path if path is not None and path.is_file() else None)


def parse(data: bytes) -> tuple[State, bytes]:
    """The file's state and its original (pre-agentboost) bytes."""
    text = data.decode("utf-8", errors="surrogateescape")
    match = _MARKER_RE.search(text)
    if match is None:
        if BEGIN.encode() in data:
            return State.DAMAGED, data
        return State.CLEAN, data
    original = data[: int(match.group("n"))]
    if sha256(original) != match.group("sha"):
        return State.DAMAGED, data
    if int(match.group("v")) != BLOCK_VERSION:
        return State.OUTDATED, original
    return State.PATCHED, original


@dataclass
class Plan:
    located: Located
    state: State
    original: bytes
    new: bytes | None
    """Bytes to write (None: nothing to do)."""
    note: str = ""


def plan(located: Located, *, revert: bool, force: bool) -> Plan:
    target = located.target
    if located.version is None:
        raise PatchError(f"{target.dist} is not installed (needed for {target.module}). Nothing was changed.")
    supported = located.version in target.versions or any(
        located.version.startswith(v + ".post") for v in target.versions
    )
    if not supported and not revert:  # reverting is always allowed
        raise PatchError(
            f"{target.dist} {located.version} is installed; agentboost's adapters target {target.dist} "
            f"{' / '.join(target.versions)}. Nothing was changed."
        )
    if located.path is None:
        raise PatchError(f"cannot find {target.relpath} in the installed {target.dist} {located.version}")
    data = located.path.read_bytes()
    state, original = parse(data)
    if state is State.DAMAGED:
        backup = located.path.with_name(located.path.name + BACKUP_SUFFIX)
        raise PatchError(
            f"{located.path} carries an agentboost block that does not match its recorded original; restore "
            f"{backup} (if present) or reinstall {target.dist}. Nothing was changed."
        )
    if revert:
        return Plan(located, state, original, original if state is not State.CLEAN else None)
    if sha256(original) not in target.known_sha256:
        note = (
            f"{located.path} (sha256 {sha256(original)[:12]}...) is not the upstream file the adapter was written for"
        )
        if not force:
            raise PatchError(note + "; rerun with --force to patch it anyway. Nothing was changed.")
        logger.warning("%s; patching anyway (--force)", note)
    wanted = original + block_for(target, original)
    return Plan(located, state, original, None if data == wanted else wanted)


def _write_atomic(path: Path, data: bytes) -> None:
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _drop_bytecode(path)


def _drop_bytecode(path: Path) -> None:
    cache = path.parent / "__pycache__"
    for pyc in cache.glob(path.stem + ".*.pyc") if cache.is_dir() else []:
        pyc.unlink(missing_ok=True)


def execute(plans: list[Plan], *, revert: bool) -> list[str]:
    """Apply prepared plans all-or-nothing. Returns one line per target."""
    for p in plans:
        if p.new is not None and not revert:
            compile(p.new, str(p.located.path), "exec")  # never leave a file that cannot import
    done: list[tuple[Path, bytes]] = []
    lines = []
    try:
        for p in plans:
            path = p.located.path
            assert path is not None
            backup = path.with_name(path.name + BACKUP_SUFFIX)
            if p.new is None:
                lines.append(f"{p.located.target.module}: already {'original' if revert else 'patched'} ({path})")
                if revert:
                    backup.unlink(missing_ok=True)
                continue
            if not revert and not backup.exists():
                backup.write_bytes(p.original)  # written once, never overwritten
            before = path.read_bytes()
            _write_atomic(path, p.new)
            done.append((path, before))
            if revert:
                if sha256(path.read_bytes()) != sha256(p.original):  # pragma: no cover - defensive
                    raise PatchError(f"{path}: restored bytes do not match the original")
                backup.unlink(missing_ok=True)
            lines.append(f"{p.located.target.module}: {'restored' if revert else 'patched'} ({path})")
    except BaseException:
        for path, before in reversed(done):
            _write_atomic(path, before)
        raise
    return lines


def check_adapters_import() -> None:
    for target in TARGETS:
        try:
            importlib.import_module(target.adapter)
        except Exception as exc:
            raise PatchError(
                f"cannot import {target.adapter} ({exc}); install agentboost into this environment first "
                "(pip install -e .)"
            ) from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="apply_patches.py",
        description="Install agentboost's adapters into the installed rLLM v0.2.1.post1 and veRL 0.6.1.",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="report each target's state; exit 1 unless all patched")
    action.add_argument("--revert", action="store_true", help="restore the original upstream files exactly")
    parser.add_argument("--force", action="store_true", help="patch files whose contents are not the known upstream")
    parser.add_argument("--only", choices=["rllm", "verl"], help="only this package's targets")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    targets = [t for t in TARGETS if args.only in (None, t.dist)]
    located = [locate(t) for t in targets]

    if args.check:
        ok = True
        for loc in located:
            if loc.version is None or loc.path is None:
                state = "not installed"
            else:
                state = parse(loc.path.read_bytes())[0].value
            ok = ok and state == State.PATCHED.value
            logger.info("%-55s %-9s %s %s", loc.target.module, state, loc.version or "-", loc.path or "")
        return 0 if ok else 1

    try:
        if not args.revert:
            check_adapters_import()
        plans = [plan(loc, revert=args.revert, force=args.force) for loc in located]
        for line in execute(plans, revert=args.revert):
            logger.info("%s", line)
    except PatchError as exc:
        logger.error("apply_patches: %s", exc)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
