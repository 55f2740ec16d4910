"""The isolation report: which layers a run gets on this machine, found with a real run, and its log line.

:meth:`Sandbox.isolation <agentboost.sandbox.Sandbox.isolation>` runs :func:`probe_program` once in the
sandbox and turns what it printed (and the launcher's notes) into a dict with every layer of
:data:`LAYERS` as True/False (:func:`layers`); :func:`log_isolation` then logs a
WARNING naming every missing layer and what it means, or INFO when all are active.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Any

logger = logging.getLogger(__name__)

LAYERS: dict[str, str] = {
    "rlimits": "no CPU, memory, file-size or process limits: a runaway program can exhaust the host",
    "unprivileged_uid": "the program runs as this process's uid (a uid of its own needs root, or subordinate "
    "ids as an ordinary user: newuidmap and newgidmap, an /etc/subuid and /etc/subgid entry; the no-separate-uid "
    "note says what is missing): it can read and write what this uid can wherever it can see it; the PID "
    "namespace is what stops it signalling this uid's processes, the filter what keeps it from this uid's keys",
    "network_namespace": "the program has this host's network (it can reach local services and the internet)",
    "mount_namespace": "the program sees this host's whole filesystem: datasets with gold answers, caches and "
    "home directories are readable wherever file permissions allow",
    "deny_by_default_fs": "the program sees this host's filesystem minus the hidden paths: a dataset anywhere "
    "else (--data, --cache-dir) is readable",
    "root_in_memory": "the runs' read-only files (interpreter, standard library) are bound from this host's disk, "
    "whose caches every run shares (the no-memory-root note says why): a run that looks up a missing name there "
    "leaves a negative dentry a later run finds by timing the same lookup, a channel between episodes of any "
    "size",
    "private_tmp": "the program shares this host's /tmp",
    "pid_namespace": "the program can see host processes and signal those of its uid; processes it leaves "
    "behind are killed only through its process group (or its uid, as root)",
    "private_proc": "the program has no private /proc: it sees host processes there, or has no /proc at all",
    "ipc_namespace": "the program shares this host's System V IPC and POSIX message queues: it can read and "
    "remove the shared memory, queues and semaphores of its uid (as non-root, this process's own), leave its "
    "own behind after the run (outside every memory limit) and pass data to a later run",
    "uts_namespace": "the program sees this host's hostname",
    "private_keyrings": "the program shares kernel keyrings: this process's session keyring (Kerberos caches, "
    "tokens), or as root the user keyring an earlier run of its uid left keys in",
    "cgroup": "limits are per process, not per run (no cgroup could be made: no cgroup v1/v2 controllers this "
    "process may write, see SandboxConfig.cgroup): a run of many processes, or its files in /tmp and /dev/shm, "
    "can use many times memory_mb, and a run with many busy processes slows its neighbours down",
    "workdir_tmpfs": "the working directory is host storage: its size and number of files are limited only by "
    "file_size_mb per file",
    "seccomp": "no system-call filter (the no-seccomp note says why): the whole kernel interface is reachable: "
    "the program can make user namespaces (and in them TCP buffers and tmpfs mounts no limit counts), use kernel "
    "keyrings (as an ordinary user, the trainer's), probe and evict the page cache every run shares (a channel "
    "between episodes) and read its own /proc/self/pagemap",
}
"""Every isolation layer :meth:`Sandbox.isolation` reports as True/False, and what its absence means."""
KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "ppc64": 271, "s390x": 280}
"""``keyctl`` system-call numbers (the C library has no wrapper; libkeyutils is not needed)."""
KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING = 0, -3

_logged: set[tuple[Any, ...]] = set()
_logged_lock = threading.Lock()


def session_keyring() -> int | None:
    """This process's session keyring serial (None: no keyrings here, or none to find)."""
    number = KEYCTL.get(os.uname().machine)
    if number is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    serial = libc.syscall(ctypes.c_long(number), ctypes.c_long(KEYCTL_GET_KEYRING_ID),
                          ctypes.c_long(KEY_SPEC_SESSION_KEYRING), ctypes.c_long(0))  # fmt: skip
    return int(serial) if serial > 0 else None


def namespaces_of_this_process() -> dict[str, str]:
    out = {}
    for kind in ("net", "mnt", "pid", "ipc", "uts"):
        try:
            out[kind] = os.readlink(f"/proc/self/ns/{kind}")
        except OSError:
            out[kind] = ""
    return out


def probe_program(canary: str, marker: str, allowed: dict[str, list[str]]) -> str:
    """What the probe run prints (one JSON line): its identity, namespaces, keyrings, cgroups, what it can
    see and write."""
    keyctl = KEYCTL.get(os.uname().machine, 0)
    return (
        "import _locale, json, os, socket, sys\n"
        "r = {'uid': os.getuid(), 'pid': os.getpid()}\n"
        "r['locale'] = [_locale.setlocale(_locale.LC_CTYPE), sys.flags.utf8_mode]\n"
        "try:\n    r['ifaces'] = sorted(n for _, n in socket.if_nameindex())\n"
        "except OSError:\n    r['ifaces'] = None\n"
        "def readable(p):\n"
        "    try:\n        open(p, 'rb').close(); return True\n"
        "    except OSError:\n        return False\n"
        f"r['canary'] = readable({canary!r})\n"
        f"r['tmp_marker'] = os.path.exists({marker!r})\n"
        "try:\n    open('/tmp/probe', 'w').close(); os.unlink('/tmp/probe'); r['tmp_writable'] = True\n"
        "except OSError:\n    r['tmp_writable'] = False\n"
        "try:\n    r['proc'] = sorted(d for d in os.listdir('/proc') if d.isdigit())\n"
        "except OSError:\n    r['proc'] = None\n"
        "def unseen(p, allowed):\n"
        "    try:\n        return set(os.listdir(p)) <= set(allowed)\n"
        "    except OSError:\n        return True\n"
        f"r['hidden'] = [p for p, a in {allowed!r}.items() if unseen(p, a)]\n"
        "r['ns'] = {}\n"
        "for k in ('net', 'mnt', 'pid', 'ipc', 'uts'):\n"
        "    try:\n        r['ns'][k] = os.readlink('/proc/self/ns/' + k)\n"
        "    except OSError:\n        r['ns'][k] = ''\n"
        "try:\n    r['cgroup'] = open('/proc/self/cgroup').read()\n"
        "except OSError:\n    r['cgroup'] = ''\n"
        "v = os.statvfs('.')\n"
        "r['workdir'] = [v.f_blocks * v.f_frsize, v.f_files]\n"
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        f"r['keyring'] = libc.syscall(ctypes.c_long({keyctl}), ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(0))"
        f" if {keyctl} else None\n"
        "r['dumpable'] = libc.prctl(3, 0, 0, 0, 0)\n"
        "r['seccomp'] = libc.prctl(21, 0, 0, 0, 0)\n"
        "print(json.dumps(r))\n"
    )


def layers(
    data: dict[str, Any],
    notes: list[str],
    *,
    config: Any,
    is_root: bool,
    run_uid: int | None,
    host: dict[str, Any],
    fresh_root_planned: bool,
    cgroup_name: str | None,
) -> dict[str, Any]:
    """The report from the probe run's output ``data`` and the notes of the launcher and the planner.
    ``host``: this process's namespaces and session keyring, to compare with the program's."""
    c = config
    text = " ".join(notes)
    mount = c.private_tmp and "no-mount-namespace" not in text
    wanted = {
        "net": c.isolate_network and "no-net-namespace" not in text,
        "mnt": mount,
        "pid": c.pid_namespace and "no-pid-namespace" not in text,
        "ipc": "no-ipc-namespace" not in text,
        "uts": "no-uts-namespace" not in text,
    }
    ns = data.get("ns") or {}
    own = {k: bool(v) and bool(ns.get(k)) and ns.get(k) != host["ns"].get(k) for k, v in wanted.items()}
    fresh = mount and fresh_root_planned and "no-fresh-root" not in text and not data["canary"]
    keyring = data.get("keyring")
    host_keyring = host.get("keyring")
    session_private = keyring is None or keyring <= 0 or host_keyring is None or keyring != host_keyring
    user_private = run_uid is None or "no-user-keyring-namespace" not in text
    groups = data.get("cgroup") or ""
    in_cgroup = cgroup_name is not None and "no-cgroup" not in text and _in_group(groups, cgroup_name)
    _, files = data.get("workdir") or [0, 0]
    workdir_tmpfs = mount and "no-workdir-tmpfs" not in text and 0 < files <= c.max_files + 16
    return {
        "namespaces": ("root" if is_root else "user namespace") if any(wanted.values()) else "none",
        "separate_process_group": True,
        "scrubbed_environment": True,
        "private_workdir": True,
        "rlimits": "no-RLIMIT" not in text,
        "unprivileged_uid": run_uid is not None and data["uid"] == run_uid,
        "network_namespace": own["net"] and set(data["ifaces"] or ()) <= {"lo"},
        "mount_namespace": mount,
        "deny_by_default_fs": fresh,
        "root_in_memory": fresh and "no-memory-root" not in text,
        "private_tmp": mount and data["tmp_writable"] and not data["tmp_marker"],
        "pid_namespace": own["pid"] and data["pid"] == 2,
        "private_proc": data["proc"] is not None and set(data["proc"]) <= {"1", "2"},
        "ipc_namespace": own["ipc"],
        "uts_namespace": own["uts"],
        "private_keyrings": session_private and user_private and "no-session-keyring" not in text,
        "cgroup": in_cgroup,
        "workdir_tmpfs": workdir_tmpfs,
        "seccomp": c.syscall_filter
        and data.get("seccomp") == 2
        and data.get("dumpable") == 0
        and "no-seccomp" not in text,
        "locale": data["locale"],
        "notes": notes,
    }


def _in_group(proc_cgroup: str, name: str) -> bool:
    """Whether ``/proc/self/cgroup`` shows the memory and pids controllers (v1), or the unified hierarchy
    (v2), in the run's own group ``name``."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else ["unified" if parts[0] == "0" else ""]:
            paths[controller] = parts[2]
    relevant = [paths.get(k, "") for k in ("memory", "pids")] if "memory" in paths else [paths.get("unified", "")]
    return all(p.rstrip("/").endswith("/" + name) for p in relevant)


def log_isolation(iso: dict[str, Any]) -> None:
    """WARNING (once per process and situation) naming each missing layer and what it means; INFO when
    every layer this sandbox provides is active."""
    missing = [k for k in LAYERS if iso.get(k) is False]
    exposed = list(iso.get("exposed_paths", ()))
    zygote_off = [n[len("no-zygote ") :] for n in iso.get("notes", ()) if n.startswith("no-zygote ")]
    key = (tuple(missing), tuple(exposed), iso.get("python"), iso.get("namespaces"), tuple(zygote_off))
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    start = "runs fork from a warm interpreter (zygote)" if iso.get("zygote") else (
        f"every run starts its interpreters (no zygote: {'; '.join(zygote_off) or 'not probed'})")  # fmt: skip
    if missing or exposed:
        lines = [f"  {k}: {LAYERS[k]}" for k in missing]
        if exposed:
            lines.append(f"  exposed_paths: the program can read {', '.join(exposed)}")
        logger.warning(
            "sandbox isolation INCOMPLETE (namespaces: %s, interpreter %s); missing layers:\n%s\n%s",
            iso.get("namespaces"), iso.get("python"), "\n".join(lines), start,
        )  # fmt: skip
    else:
        logger.info(
            "sandbox isolation: all layers active (%s; namespaces: %s, interpreter %s); %s",
            ", ".join(LAYERS), iso.get("namespaces"), iso.get("python"), start,
        )  # fmt: skip
    if os.geteuid() != 0 and iso.get("cgroup") is False and iso.get("unprivileged_uid") is False:
        logger.warning(
            "sandbox runs have NEITHER a cgroup NOR a uid of their own (uid %d; cgroup: %s; uid: %s): limits "
            "are per process, and a run may use what this uid may (its files, pipe and process quotas)",
            os.geteuid(), iso.get("cgroup_setup") or "none", uid_missing(iso),
        )  # fmt: skip


def uid_missing(iso: dict[str, Any]) -> str:
    """Why runs got no uid of their own: the launcher's note where it failed, else what the host lacks."""
    for note in iso.get("notes", ()):
        if note.startswith(("no-subordinate-ids ", "no-separate-uid ", "no-uid-drop ")):
            return note
    return str(iso.get("uid_setup") or "none")
