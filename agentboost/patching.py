"""Install agentboost's adapters into the installed rLLM and veRL (the logic of ``apply_patches.py``).

Nothing upstream is copied or overwritten whole. Each target module gets one marked block appended at
its end; the block imports the adapter from ``modified_rllm_files`` / ``modified_verl_files`` and calls
``install(globals())`` once the module has run, which subclasses or wraps the module's own classes::

    # >>> agentboost adapter v1 orig_sha256=<sha> orig_bytes=<n> (remove: python apply_patches.py --revert) >>>
    ...
    # <<< agentboost adapter <<<

Supported stacks (:data:`STACKS`; anything else is refused, naming these):

* rLLM v0.2.1.post1 (reports 0.2.1) + veRL 0.6.1: rLLM's ``agent_execution_engine.py`` and
  ``agent_ppo_trainer.py`` and veRL's ``vllm_async_server.py`` (0.6.1's server ignores ``max_tokens``);
* rLLM v0.3.0-pre (reports 0.3.0rc0) + veRL 0.7.1: the same two rLLM files; veRL 0.7.1's server is left
  alone (it honours ``max_tokens`` and reports aborts; agentboost's backend reads it as it is).

* The installed versions are checked first, as a pair (an rLLM release only with the veRL it pins), and so
  is every target file's sha256 against the upstream file the adapter was written for *in that release*;
  on a mismatch nothing is changed (``--force`` accepts unknown file contents of a supported version, never
  an unsupported version or a mixed pair). The vLLM version is compared with the pair's pin (a warning).
* All targets are prepared and checked before the first write; files are replaced atomically and a
  failure part-way (a write, removing a replaced file's stale bytecode, a backup) restores every file
  already touched, the failing one included, and removes the backups that run wrote: all or nothing.
* Idempotent: a target that carries the current block is left alone; one with an older block is
  brought up to date from its original bytes. The original is kept next to the file
  (``<file>.agentboost-orig``), written once and never overwritten.
* A patched file must be exactly its original bytes followed by the block agentboost writes for it. Code
  appended after the block or edited inside it makes the file ``modified``: a re-apply rewrites everything
  after the original bytes, so applying refuses such a file (naming what differs) unless ``--force``.
* The adapters must import in a fresh interpreter (this ``sys.executable``, no ``PYTHONPATH``, cwd outside the
  checkout): rLLM and veRL processes started elsewhere (Ray workers) would otherwise run upstream code.
* ``--revert`` restores the original bytes exactly (checked against the sha256 in the marker), dropping any
  changes made after patching, whatever the installed versions; ``--check`` reports each target's state
  (``clean``, ``unknown`` for an unpatched file that is not its release's upstream file, ``patched``,
  ``outdated``, ``modified``, ``damaged``, ``missing``) and exits 1 unless the pair is supported, all its
  targets are patched and current and the adapters import.
* Exit statuses: 0 done, 1 ``--check`` found something to do, 2 refused (nothing changed), 3 a file could not
  be read or written (every file written was restored); errors are single lines but for the diffs of edited files.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
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
PROBE_TIMEOUT_S = 120.0
"""Cap on the fresh interpreter that checks the adapters import (it imports only light modules)."""
_DIFF_INPUT_CAP = 64 * 1024
_SHOWN_LINES = 12
_SHOWN_LINE_CHARS = 160


EXIT_REFUSED = 2
"""Exit status of a refusal (versions, hashes, edited files, an interpreter without agentboost): nothing changed."""
EXIT_IO = 3
"""Exit status of a file that could not be read or written: every file written was restored."""


class PatchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    dist: str
    versions: tuple[str, ...]
    """The ``dist`` versions (as installed metadata reports them) whose file ``known_sha256`` describes."""
    module: str
    relpath: str
    adapter: str
    known_sha256: tuple[str, ...]


@dataclass(frozen=True)
class Stack:
    """One supported rLLM release with the veRL it pins, and the files agentboost patches in it."""

    name: str
    rllm: tuple[str, ...]
    """Versions rLLM reports for the release (``importlib.metadata``; a tag such as v0.3.0-pre is normalised)."""
    verl: tuple[str, ...]
    vllm: tuple[str, str]
    """The vLLM range the release pins (inclusive), for a warning: agentboost does not patch vLLM."""
    targets: tuple[Target, ...]
    unpatched: tuple[tuple[str, str], ...] = ()
    """(dist, line): files of the stack that agentboost deliberately leaves alone, and why."""
    note: str = ""
    """Said when a target file is missing (a later commit that reports the same version)."""
    same_version: str = ""
    """Said when a target's sha256 is unknown: another release that reports the same version, and what to do."""

    def versions(self, dist: str) -> tuple[str, ...]:
        return {"rllm": self.rllm, "verl": self.verl}[dist]


DISTS = ("rllm", "verl")
_ENGINE = (
    "rllm",
    "rllm.engine.agent_execution_engine",
    "rllm/engine/agent_execution_engine.py",
    "modified_rllm_files.agent_execution_engine",
)
_TRAINER = (
    "rllm",
    "rllm.trainer.verl.agent_ppo_trainer",
    "rllm/trainer/verl/agent_ppo_trainer.py",
    "modified_rllm_files.agent_ppo_trainer",
)
_SERVER = (
    "verl",
    "verl.workers.rollout.vllm_rollout.vllm_async_server",
    "verl/workers/rollout/vllm_rollout/vllm_async_server.py",
    "modified_verl_files.vllm_async_server",
)
"""The files agentboost can patch: (dist, module, path inside the installed dist, adapter module)."""


def _stack(
    name: str,
    *,
    rllm: tuple[str, ...],
    verl: tuple[str, ...],
    vllm: tuple[str, str],
    files: dict[tuple[str, str, str, str], str],
    unpatched: tuple[tuple[str, str], ...] = (),
    note: str = "",
    same_version: str = "",
) -> Stack:
    """A stack whose targets carry the stack's versions, so a file's hash is only ever checked for its release."""
    versions = {"rllm": rllm, "verl": verl}
    targets = tuple(
        Target(dist, versions[dist], module, relpath, adapter, known_sha256=(sha,))
        for (dist, module, relpath, adapter), sha in files.items()
    )
    return Stack(name, rllm, verl, vllm, targets, unpatched, note, same_version)


STACKS: tuple[Stack, ...] = (
    _stack(
        "rLLM v0.2.1.post1 + verl 0.6.1",
        rllm=("0.2.1",),
        verl=("0.6.1",),
        vllm=("0.10.2", "0.11.0"),
        files={
            _ENGINE: "f7632728220805371b202eceb0af295188ea0bcd8eb1ce80815f50299c03c4e4",
            _TRAINER: "77b0a5c79cc0844e892dae9796eac79bea06953b8ca077113172f1e147069599",
            _SERVER: "731c21c4e240baf614ca256626f09f755360ade68e3d5fbd6669395d9e56095d",
        },
        same_version=(
            "rLLM's v0.2.1 tag reports the same version (0.2.1) as v0.2.1.post1, and its agent_execution_engine.py "
            "differs: install the tag the adapters were written for (pip install "
            "git+https://github.com/rllm-org/rllm.git@v0.2.1.post1), or rerun with --force to patch this file anyway"
        ),
    ),
    _stack(
        "rLLM v0.3.0-pre + verl 0.7.1",
        rllm=("0.3.0rc0", "0.3.0.pre"),
        verl=("0.7.1",),
        vllm=("0.17.0", "0.17.0"),
        files={
            _ENGINE: "39ce9338e51d5397f6b4203c2293d4ab93f79363bfe961f1d721d84b3bf4ed82",
            _TRAINER: "3ba101ba14e981baa0d8c4b2a5a01c9396801b82f9bb067ca1e944482670fda3",
        },
        unpatched=(
            ("verl", f"{_SERVER[1]}: not patched (verl 0.7.1's server honours max_tokens and reports aborts itself)"),
        ),
        note=(
            "rLLM's main branch after the v0.3.0-pre tag also reports 0.3.0rc0 but removed AgentExecutionEngine "
            "and AgentPPOTrainer: install the tag (git+https://github.com/rllm-org/rllm.git@v0.3.0-pre)"
        ),
        same_version=(
            "commits of rLLM after the v0.3.0-pre tag report the same version (0.3.0rc0): install the tag the "
            "adapters were written for (pip install git+https://github.com/rllm-org/rllm.git@v0.3.0-pre), or rerun "
            "with --force to patch this file anyway"
        ),
    ),
)
"""Every rLLM + veRL pair agentboost supports, with the upstream sha256 of each file it patches there."""

TARGETS: tuple[Target, ...] = tuple(t for stack in STACKS for t in stack.targets)
"""Every (stack, file) row, as defined here (functions read :data:`STACKS` when called)."""


def _all_targets() -> list[Target]:
    return [t for stack in STACKS for t in stack.targets]


def supported_text() -> str:
    return "; ".join(f"{s.name} (rllm {' / '.join(s.rllm)}, verl {' / '.join(s.verl)})" for s in STACKS)


def _version_in(version: str, versions: tuple[str, ...]) -> bool:
    return version in versions or any(version.startswith(v + ".post") for v in versions)


def stacks_for(dist: str, version: str, stacks: tuple[Stack, ...] | None = None) -> list[Stack]:
    return [s for s in (STACKS if stacks is None else stacks) if _version_in(version, s.versions(dist))]


def select_stack(installed: dict[str, str | None], stacks: tuple[Stack, ...] | None = None) -> Stack:
    """The supported stack the installed rLLM and veRL belong to; refuses other versions and mixed pairs.

    Every installed package counts (also with ``--only``): an rLLM release trains only on the veRL it pins.
    """
    stacks = STACKS if stacks is None else stacks
    present = {dist: v for dist, v in installed.items() if v is not None}
    if not present:
        raise PatchError(f"neither rLLM nor veRL is installed; agentboost supports {supported_text()}")
    unknown = [f"{dist} {v}" for dist, v in present.items() if not stacks_for(dist, v, stacks)]
    if unknown:
        raise PatchError(
            f"{' and '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} installed; agentboost's adapters "
            f"support {supported_text()}. Nothing was changed."
        )
    common = [s for s in stacks if all(_version_in(v, s.versions(d)) for d, v in present.items())]
    if not common:
        parts = [f"{dist} {v} belongs to {stacks_for(dist, v, stacks)[0].name}" for dist, v in present.items()]
        raise PatchError(
            f"mixed stack: {'; '.join(parts)}. An rLLM release runs only on the veRL it pins; agentboost "
            f"supports {supported_text()}. Nothing was changed."
        )
    return common[0]


def _release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string (``0.10.2+cu128`` -> (0, 10, 2))."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(x) for x in match.group(0).split(".")) if match else ()


def _installed_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def warn_vllm(stack: Stack, installed: str | None) -> None:
    """Warn when the installed vLLM is outside the stack's pin (none installed: a CPU node, nothing to say)."""
    if installed is None:
        return
    low, high = stack.vllm
    if not _release(low) <= _release(installed) <= _release(high):
        pinned = f"=={low}" if low == high else f">={low},<={high}"
        logger.warning("vllm %s is installed; %s pins vllm%s", installed, stack.name, pinned)


class State(str, Enum):
    CLEAN = "clean"
    PATCHED = "patched"
    OUTDATED = "outdated"
    """Carries an older agentboost block, byte for byte as that version wrote it."""
    MODIFIED = "modified"
    """Original bytes intact, but what follows them is not the block agentboost wrote (code appended or edited)."""
    DAMAGED = "damaged"
    """Carries a block, but the bytes before it are not the original they claim to be."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _block_v1(target: Target, original: bytes) -> bytes:
    text = (
        f"\n{BEGIN} v1 orig_sha256={sha256(original)} orig_bytes={len(original)} "
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


BLOCK_RENDERERS: dict[int, Callable[[Target, bytes], bytes]] = {1: _block_v1}
"""Every block version this agentboost reproduces byte for byte. When bumping BLOCK_VERSION keep the old
renderers: a file with an old block is then verified exactly before it is upgraded (else it reads as modified)."""


def block_for(target: Target, original: bytes, version: int = BLOCK_VERSION) -> bytes:
    return BLOCK_RENDERERS[version](target, original)


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


@dataclass(frozen=True)
class Parsed:
    state: State
    original: bytes
    """The pre-agentboost bytes (the whole file when CLEAN or DAMAGED)."""
    detail: str = ""
    """What differs from the expected file (MODIFIED), for messages."""


def _printable(line: str) -> str:
    """A file line made safe for a terminal (escapes control characters) and short."""
    cut = line[:_SHOWN_LINE_CHARS]
    shown = "".join(c if c.isprintable() or c == "\t" else c.encode("unicode_escape").decode("ascii") for c in cut)
    return shown + (f" ... ({len(line) - len(cut)} more characters)" if len(line) > len(cut) else "")


def describe_difference(expected: bytes, actual: bytes) -> str:
    """What a file carries after its original bytes instead of the expected block, shortened for a message."""
    if actual.startswith(expected):
        extra = actual[len(expected) :]
        head = f"{len(extra)} bytes after the end of the adapter block"
        shown = ["+" + line for line in extra[:_DIFF_INPUT_CAP].decode("utf-8", errors="replace").splitlines()]
    elif len(actual) > _DIFF_INPUT_CAP:
        return f"{len(actual)} bytes where the {len(expected)}-byte adapter block should be"
    else:
        head = "the adapter block differs from the one agentboost writes"
        diff = difflib.unified_diff(
            expected.decode("utf-8", errors="replace").splitlines(),
            actual.decode("utf-8", errors="replace").splitlines(),
            lineterm="",
            n=1,
        )
        shown = [line for line in diff if not line.startswith(("---", "+++"))]
    body = ["    " + _printable(line) for line in shown[:_SHOWN_LINES]]
    if len(shown) > _SHOWN_LINES:
        body.append(f"    ... ({len(shown) - _SHOWN_LINES} more lines)")
    return head + (":\n" + "\n".join(body) if body else "")


def parse(target: Target, data: bytes) -> Parsed:
    """The file's state and its original (pre-agentboost) bytes; the whole file is compared, not just the marker."""
    text = data.decode("utf-8", errors="surrogateescape")
    match = _MARKER_RE.search(text)
    if match is None:
        if BEGIN.encode() in data:
            return Parsed(State.DAMAGED, data)
        return Parsed(State.CLEAN, data)
    size = int(match.group("n"))
    original = data[:size]
    if len(original) != size or sha256(original) != match.group("sha"):
        return Parsed(State.DAMAGED, data)
    version = int(match.group("v"))
    render = BLOCK_RENDERERS.get(version)
    if render is None:
        detail = f"it carries an adapter block v{version}, which this agentboost cannot verify"
        return Parsed(State.MODIFIED, original, detail)
    expected = render(target, original)
    if data[size:] != expected:
        return Parsed(State.MODIFIED, original, describe_difference(expected, data[size:]))
    return Parsed(State.PATCHED if version == BLOCK_VERSION else State.OUTDATED, original)


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
    if not _version_in(located.version, target.versions) and not revert:  # reverting is always allowed
        raise PatchError(
            f"{target.dist} {located.version} is installed; this adapter of {target.module} targets {target.dist} "
            f"{' / '.join(target.versions)} (agentboost supports {supported_text()}). Nothing was changed."
        )
    if located.path is None:
        notes = [s.note for s in stacks_for(target.dist, located.version) if s.note]
        raise PatchError(
            f"cannot find {target.relpath} in the installed {target.dist} {located.version}"
            + (f": {notes[0]}" if notes else "")
            + ". Nothing was changed."
        )
    data = located.path.read_bytes()
    parsed = parse(target, data)
    state, original = parsed.state, parsed.original
    if state is State.DAMAGED:
        backup = located.path.with_name(located.path.name + BACKUP_SUFFIX)
        raise PatchError(
            f"{located.path} carries an agentboost block that does not match its recorded original; restore "
            f"{backup} (if present) or reinstall {target.dist}. Nothing was changed."
        )
    if state is State.MODIFIED:
        note = f"{located.path} was changed after agentboost patched it: {parsed.detail}"
        if revert:
            logger.warning("%s\n--revert discards this and restores the original bytes", note)
        elif not force:
            raise PatchError(
                f"{note}\nApplying rewrites everything after the original bytes, so this would be lost: move it "
                "elsewhere, or rerun with --force to discard it. Nothing was changed."
            )
        else:
            logger.warning("%s\ndiscarding it (--force)", note)
    if revert:
        return Plan(located, state, original, original if state is not State.CLEAN else None)
    if sha256(original) not in target.known_sha256:
        note = (
            f"{located.path} (sha256 {sha256(original)[:12]}...) is not the upstream file the adapter was written for"
        )
        if not force:
            hints = [st.same_version for st in stacks_for(target.dist, located.version) if st.same_version]
            hint = f" ({hints[0]})" if hints else "; rerun with --force to patch it anyway"
            raise PatchError(f"{note}: an edited file or another release{hint}. Nothing was changed.")
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


class WriteFailed(PatchError):
    """A write failed part-way; every file written before it was restored (the message says if one was not)."""


def execute(plans: list[Plan], *, revert: bool) -> list[str]:
    """Apply prepared plans all-or-nothing. Returns one line per target.

    A failure anywhere (a write, the removal of stale bytecode after a replace, a backup) restores every
    target already touched, this one included, and removes the backups this run wrote, then raises
    :class:`WriteFailed`; backups of reverted files are removed only once every file is restored."""
    for p in plans:
        if p.new is not None and not revert:
            compile(p.new, str(p.located.path), "exec")  # never leave a file that cannot import
    touched: list[tuple[Path, bytes]] = []
    new_backups: list[Path] = []
    lines = []
    current: Path | None = None
    try:
        for p in plans:
            path = current = p.located.path
            assert path is not None
            backup = _backup_of(path)
            if p.new is None:
                lines.append(f"{p.located.target.module}: already {'original' if revert else 'patched'} ({path})")
                continue
            if not revert and (not backup.exists() or (p.state is State.CLEAN and backup.read_bytes() != p.original)):
                backup.write_bytes(p.original)  # the original of this patch (a stale one beside a clean file goes)
                new_backups.append(backup)
            before = path.read_bytes()
            touched.append((path, before))  # before the write: a failure after os.replace is rolled back too
            _write_atomic(path, p.new)
            if revert and sha256(path.read_bytes()) != sha256(p.original):  # pragma: no cover - defensive
                raise PatchError(f"{path}: restored bytes do not match the original")
            lines.append(f"{p.located.target.module}: {'restored' if revert else 'patched'} ({path})")
    except (OSError, PatchError) as exc:
        unrestored = _roll_back(touched, new_backups)
        why = f"{current}: {type(exc).__name__}: {exc}" if isinstance(exc, OSError) else str(exc)
        if unrestored:
            raise WriteFailed(
                f"{'reverting' if revert else 'patching'} failed ({why}) and {', '.join(unrestored)} could not be "
                "restored: restore it from its .agentboost-orig file or reinstall the package"
            ) from exc
        raise WriteFailed(f"{'reverting' if revert else 'patching'} failed ({why}); every file was restored. "
                          "Nothing was changed.") from exc  # fmt: skip
    except BaseException:  # Ctrl-C: still all or nothing
        _roll_back(touched, new_backups)
        raise
    if revert:
        for p in plans:
            assert p.located.path is not None
            _backup_of(p.located.path).unlink(missing_ok=True)
    return lines


def _backup_of(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def _roll_back(touched: list[tuple[Path, bytes]], new_backups: list[Path]) -> list[str]:
    """Restore ``touched`` files and remove ``new_backups``; returns the files that could not be restored
    (their backups are kept). Stale bytecode is removed where possible: Python would not use it anyway (it
    records the size of the source it was compiled from)."""
    unrestored: list[str] = []
    for path, before in reversed(touched):
        try:
            if path.read_bytes() != before:
                try:
                    _write_atomic(path, before)
                except OSError:
                    if path.read_bytes() != before:  # the bytes are back if only the bytecode removal failed
                        raise
            with contextlib.suppress(OSError):
                _drop_bytecode(path)
        except OSError as exc:
            logger.error("could not restore %s: %s", path, exc)
            unrestored.append(str(path))
    keep = {_backup_of(Path(p)) for p in unrestored}
    for backup in new_backups:
        if backup not in keep:
            with contextlib.suppress(OSError):
                backup.unlink(missing_ok=True)
    return unrestored


_PROBE_SENTINEL = "agentboost-import-probe "
_PROBE = f"""
import importlib, json, sys
result = {{}}
for name in sys.argv[1:]:
    try:
        result[name] = {{"file": getattr(importlib.import_module(name), "__file__", None)}}
    except BaseException as exc:
        result[name] = {{"error": (type(exc).__name__ + ": " + str(exc))[:500]}}
print({_PROBE_SENTINEL!r} + json.dumps(result))
"""


def _install_hint() -> str:
    checkout = Path(__file__).resolve().parents[1]
    where = shlex.quote(str(checkout)) if (checkout / "pyproject.toml").is_file() else "<your agentboost checkout>"
    return f"{shlex.quote(sys.executable)} -m pip install -e {where}"


def check_adapters_import(targets: list[Target] | tuple[Target, ...] = TARGETS) -> str:
    """Refuse unless this interpreter imports the adapters on its own (no PYTHONPATH, cwd outside the checkout).

    Run in-process, the check would pass on the checkout in sys.path[0] while rLLM/veRL processes started
    elsewhere (Ray workers) fail the import and silently run upstream code. Returns where agentboost comes from.
    """
    names = ["agentboost", *dict.fromkeys(t.adapter for t in targets)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="agentboost-import-probe-") as cwd:
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PROBE, *names],
                check=False,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            raise PatchError(
                f"{sys.executable} took over {PROBE_TIMEOUT_S:.0f}s to import {', '.join(names)}. Nothing was changed."
            ) from exc
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_PROBE_SENTINEL)]
    if not lines:
        raise PatchError(
            f"{sys.executable} could not check whether it imports agentboost (exit {proc.returncode}): "
            f"{proc.stderr[-1000:].strip()}. Nothing was changed."
        )
    result: dict[str, dict[str, str | None]] = json.loads(lines[-1][len(_PROBE_SENTINEL) :])
    failed = {name: r["error"] for name, r in result.items() if "error" in r}
    if failed:
        name, error = next(iter(failed.items()))
        raise PatchError(
            f"{sys.executable} cannot import {', '.join(failed)} when started outside this checkout "
            f"({name}: {error}); rLLM and veRL processes started with it (Ray workers) would run upstream code. "
            f"Install agentboost into that interpreter first (pip install -e . from the checkout): {_install_hint()}. "
            "Nothing was changed."
        )
    found = result["agentboost"].get("file") or "?"
    here = Path(__file__).resolve().parent
    if found != "?" and Path(found).resolve().parent != here:
        logger.warning(
            "%s imports agentboost from %s, not from this copy (%s): rLLM and veRL will run that copy's adapters",
            sys.executable,
            Path(found).parent,
            here,
        )
    return str(Path(found).parent)


def _only_hint(installed: dict[str, str | None], flags: str) -> str:
    """The ``--only`` reruns that work with the packages that are installed."""
    present = [d for d in DISTS if installed.get(d) is not None]
    if len(present) == len(DISTS) or not present:
        return ""
    return " To work on the installed packages alone: " + " / ".join(
        f"python apply_patches.py{flags} --only {d}" for d in present
    )


def _refuse_missing(installed: dict[str, str | None], scope: tuple[str, ...], flags: str) -> None:
    missing = [d for d in scope if installed.get(d) is None]
    if missing:
        needed = "; ".join(f"{d} is not installed (needed for {', '.join(_modules(d))})" for d in missing)
        raise PatchError(f"{needed}. Nothing was changed.{_only_hint(installed, flags)}")


def _modules(dist: str) -> list[str]:
    return list(dict.fromkeys(t.module for t in _all_targets() if t.dist == dist))


def _revert_targets(scope: tuple[str, ...]) -> list[Target]:
    """One target per file of any stack: a block is removed by its marker, whatever version is installed."""
    seen: dict[tuple[str, str], Target] = {}
    for target in _all_targets():
        if target.dist in scope:
            seen.setdefault((target.dist, target.relpath), target)
    return list(seen.values())


def _log_unpatched(stack: Stack | None, scope: tuple[str, ...]) -> None:
    for dist, line in stack.unpatched if stack is not None else ():
        if dist in scope:
            logger.info("%s", line)


UNKNOWN = "unknown"
"""--check's state of an unpatched target whose contents are not the upstream file of its release."""


def _check(installed: dict[str, str | None], scope: tuple[str, ...]) -> int:
    try:
        stack: Stack | None = select_stack({d: installed.get(d) for d in DISTS})
    except PatchError as exc:
        logger.error("apply_patches: %s", exc)
        stack = None
    if stack is not None:
        logger.info("stack: %s", stack.name)
        warn_vllm(stack, _installed_version("vllm"))
    targets = [t for t in stack.targets if t.dist in scope] if stack is not None else _revert_targets(scope)
    ok = stack is not None
    for loc in [locate(t) for t in targets]:
        detail = ""
        if loc.version is None or loc.path is None:
            state = "not installed" if loc.version is None else "missing"
        else:
            parsed = parse(loc.target, loc.path.read_bytes())
            state, detail = parsed.state.value, parsed.detail
            known = sha256(parsed.original) in loc.target.known_sha256
            if stack is not None and parsed.state is State.CLEAN and not known:
                state = UNKNOWN
                detail = (f"{loc.path} is not the upstream file the adapter was written for (edited, or another "
                          "release reporting the same version); applying needs --force")  # fmt: skip
            elif stack is not None and parsed.state is State.PATCHED and not known:
                detail = f"{loc.path}: the adapter sits on a file that is not its release's upstream one (--force)"
        ok = ok and state == State.PATCHED.value
        logger.info("%-55s %-9s %s %s", loc.target.module, state, loc.version or "-", loc.path or "")
        if detail:
            logger.warning("  %s", detail.replace("\n", "\n  "))
    _log_unpatched(stack, scope)
    hint = _only_hint(installed, " --check")
    if hint:
        logger.info("%s", hint.strip())
    if not targets:
        return 0 if ok else 1
    try:
        where = check_adapters_import(targets)
    except PatchError as exc:
        logger.error("apply_patches: %s", exc)
        return 1
    logger.info("adapters import in %s (agentboost from %s)", sys.executable, where)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="apply_patches.py",
        description="Install agentboost's adapters into the installed rLLM and veRL. Supported: "
        + supported_text()
        + ".",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--check", action="store_true", help="report each target's state; exit 1 unless all patched and importable"
    )
    action.add_argument("--revert", action="store_true", help="restore the original upstream files exactly")
    parser.add_argument(
        "--force", action="store_true", help="patch files whose contents are not the known upstream or were edited"
    )
    parser.add_argument("--only", choices=DISTS, help="only this package's targets")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    scope = DISTS if args.only is None else (args.only,)
    installed = {d: _installed_version(d) for d in DISTS}

    if args.check:
        try:
            return _check(installed, scope)
        except OSError as exc:
            logger.error("apply_patches: %s: %s", type(exc).__name__, exc)
            return EXIT_IO

    try:
        _refuse_missing(installed, scope, " --revert" if args.revert else "")
        if args.revert:
            targets = _revert_targets(scope)
        else:
            stack = select_stack(installed)
            logger.info("stack: %s", stack.name)
            warn_vllm(stack, _installed_version("vllm"))
            _log_unpatched(stack, scope)
            targets = [t for t in stack.targets if t.dist in scope]
            if targets:
                check_adapters_import(targets)
            else:
                logger.info("nothing to patch in %s for %s", ", ".join(scope), stack.name)
        plans: list[Plan] = []
        errors: list[str] = []
        for loc in [locate(t) for t in targets]:  # every target is checked, so one run reports every problem
            try:
                plans.append(plan(loc, revert=args.revert, force=args.force))
            except PatchError as exc:
                errors.append(str(exc))
        if errors:
            raise PatchError("\n".join(errors))
        for line in execute(plans, revert=args.revert):
            logger.info("%s", line)
    except WriteFailed as exc:
        logger.error("apply_patches: %s", exc)
        return EXIT_IO
    except PatchError as exc:
        logger.error("apply_patches: %s", exc)
        return EXIT_REFUSED
    except OSError as exc:  # reading a target or a backup: nothing was written yet
        logger.error("apply_patches: %s: %s. Nothing was changed.", type(exc).__name__, exc)
        return EXIT_IO
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
