"""How the isolation report is found: a real run, once per sandbox (:meth:`Sandbox.isolation`).

The probe program (:func:`.report.probe_program`) runs on the first interpreter that can run in the
sandbox; its output and the launcher's notes become the report (:func:`.report.layers`). Where zygotes are
wanted, the same probe then runs through one: runs fork from zygotes only if that gives the same layers.

The sandbox hands itself in; what the probe reads and sets of it is :class:`ProbedSandbox` (so this module
does not import :mod:`.sandbox`, which imports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .cgroups import Cgroups, RunCgroup
from .config import SandboxConfig, SandboxResult
from .mirror import mirror_for
from .pagecache import Warmer
from .paths import inside, interpreter_candidates
from .report import LAYERS, namespaces_of_this_process, probe_program, session_keyring
from .report import layers as report_layers
from .rootfs import RootPlan, RootPlanError, plan_for
from .seccomp import Filters
from .uids import UidLease
from .zygote import Zygote, ZygoteError, ZygotePool, precompile


class LaunchedRun(Protocol):
    cgroup: RunCgroup | None


class ProbedSandbox(Protocol):
    """What the probe uses of :class:`~agentboost.sandbox.sandbox.Sandbox`: it reads the configuration and
    sets the interpreter, the root plan, the cgroups and the zygote pool that the probe run found to work."""

    config: SandboxConfig
    _root: Path
    _hide: list[str]
    _is_root: bool
    _python: str | None
    _plan: RootPlan | None
    _mirror: str | None
    _cgroups: Cgroups | None
    _cgroup_why: str
    _zygotes: ZygotePool | None
    _filters: Filters | None
    _filter_why: str
    _uid_setup: str
    _warmer: Warmer | None

    def _find_cgroups(self) -> tuple[Cgroups | None, str]: ...
    def _program_argv(self, python: str, script: str = ...) -> list[str]: ...
    def _new_zygote(self, python: str, locale: list[Any]) -> Zygote: ...
    def _new_pool(self, python: str, locale: list[Any]) -> ZygotePool: ...
    async def _lease_uid(self, slot: int) -> UidLease | None: ...
    async def _run(
        self,
        code: str,
        stdin: str,
        timeout_s: float,
        uid: UidLease | None,
        python: str,
        *,
        stdout_cap: int | None = ...,
        zygotes: bool = ...,
        on_launch: Callable[[Any], None] | None = ...,
    ) -> SandboxResult: ...


def probe(box: ProbedSandbox) -> dict[str, Any]:
    """The isolation report (see :meth:`Sandbox.isolation`): a probe run on the first interpreter that runs,
    then, where zygotes are wanted, the same probe through one."""
    c = box.config
    last_error = ""
    canary = box._root / f".canary-{secrets.token_hex(6)}"
    marker = Path("/tmp") / f"agentboost-sandbox-probe-{secrets.token_hex(6)}"
    canary.write_text("host file")
    canary.chmod(0o644)
    with contextlib.suppress(OSError):
        marker.write_text("host /tmp")
    box._cgroups, box._cgroup_why = box._find_cgroups()
    try:
        for python in interpreter_candidates(c.python, c.site_packages, box._hide):
            plan_notes: list[str] = []
            box._plan = box._mirror = None
            if c.deny_by_default and c.private_tmp:
                try:
                    box._plan = plan_for(python, site_packages=c.site_packages, hidden=box._hide)
                except RootPlanError as exc:
                    plan_notes.append(f"no-fresh-root {exc}")
            if box._plan is not None:
                why = "SandboxConfig(root_in_memory=False)"
                if c.root_in_memory:
                    box._mirror, why = mirror_for(box._plan)
                if box._mirror is None:
                    plan_notes.append(f"no-memory-root {why}")
            result, group = asyncio.run(_probe_run(box, python, canary, marker))
            if result.exit_code == 0:
                box._python = python
                iso = _layers(box, python, result, plan_notes, group)
                if not iso["deny_by_default_fs"]:
                    box._plan = None  # runs go straight to the deny-list, not failing to build the root each time
                elif c.keep_cached and box._plan is not None and box._mirror is None:
                    box._warmer = Warmer(op[1] for op in box._plan.ops if op[0] == "ro")  # (what is bound)
                    box._warmer.poke()
                iso["zygote"] = _check_zygote(box, iso, python, canary, marker, plan_notes)
                return iso
            last_error = f"{python}: exit {result.exit_code}: {result.stderr[-300:]}"
    finally:
        canary.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            marker.unlink()
    raise RuntimeError(f"no interpreter can run inside the sandbox ({last_error})")


def _check_zygote(  # noqa: PLR0917 - private, called once
    box: ProbedSandbox, iso: dict[str, Any], python: str, canary: Path, marker: Path, plan_notes: list[str]
) -> bool:
    """Start a zygote and probe again through it: runs fork from zygotes only if they give the same
    layers (and only where a PID namespace with a private ``/proc`` keeps them out of their reach)."""
    why = None
    if not box.config.zygote:
        why = "SandboxConfig(zygote=False)"
    elif not (iso["pid_namespace"] and iso["private_proc"]):
        why = "no PID namespace with a private /proc: a forked program could reach the zygote"
    if why is not None:
        iso["notes"].append(f"no-zygote {why}")
        return False
    precompile(box._program_argv(python)[0])
    try:
        zygote = box._new_zygote(python, iso["locale"])
    except ZygoteError as exc:
        iso["notes"].append(f"no-zygote {exc}")
        return False
    pool = box._new_pool(python, iso["locale"])
    pool.adopt(zygote)
    box._zygotes = pool
    result, group = asyncio.run(_probe_run(box, python, canary, marker))
    differ: list[str] = []
    if pool.failures or pool.off is not None:
        why = f"its probe run failed ({pool.off or 'it died'})"
    elif result.exit_code != 0:
        why = f"its probe run failed: exit {result.exit_code}: {result.stderr[-300:]}"
    else:
        forked = _layers(box, python, result, plan_notes, group)
        differ = [k for k in (*LAYERS, "hidden_paths", "exposed_paths", "locale") if forked[k] != iso[k]]
        why = f"its runs differ from started ones in {', '.join(differ)}" if differ else None
    if why is not None:
        pool.close()
        box._zygotes = None
        iso["notes"].append(f"no-zygote {why}")
        return False
    return True


async def _probe_run(box: ProbedSandbox, python: str, canary: Path, marker: Path) -> tuple[SandboxResult, str | None]:
    allowed: dict[str, list[str]] = {}  # what a hidden directory may show: the way to the interpreter
    visible = box._plan.visible if box._plan else ()
    for hidden in box._hide:
        allowed[hidden] = sorted({v[len(hidden) :].strip("/").split("/")[0] for v in visible if inside(v, hidden)})
    probe = probe_program(str(canary), str(marker), allowed)
    uid = await box._lease_uid(0)
    groups: list[str | None] = []  # the probe run's cgroup, to find it in the program's /proc/self/cgroup

    def launched(run: LaunchedRun) -> None:
        groups.append(run.cgroup.name if run.cgroup else None)

    try:
        result = await box._run(probe, "", 20.0, uid, python, on_launch=launched)
    finally:
        if uid is not None:
            uid.release()
    return result, groups[-1] if groups else None


def _layers(
    box: ProbedSandbox, python: str, result: SandboxResult, plan_notes: list[str], group: str | None
) -> dict[str, Any]:
    data = json.loads(result.stdout.strip().splitlines()[-1])
    host = {"ns": namespaces_of_this_process(), "keyring": session_keyring()}
    notes = [*plan_notes, *result.isolation_notes]
    if box._cgroups is None:
        notes.append(f"no-cgroup {box._cgroup_why}")
    if box._filters is None:
        notes.append(f"no-seccomp {box._filter_why}")
    if result.uid is None:
        notes.append(f"no-separate-uid {box._uid_setup.removeprefix('none: ')}")
    iso = report_layers(data, notes, config=box.config, is_root=box._is_root, run_uid=result.uid, host=host,
                        fresh_root_planned=box._plan is not None, cgroup_name=group)  # fmt: skip
    fresh = iso["deny_by_default_fs"]
    hidden = data["hidden"]
    iso.update({
        "python": python,
        "hidden_paths": hidden,
        "exposed_paths": [p for p in box._hide if p not in hidden],
        "visible_paths": list(box._plan.visible) if fresh and box._plan is not None else None,
        "cgroup_setup": box._cgroup_why,
        "uid_setup": box._uid_setup,
    })  # fmt: skip
    return iso
