"""The system-call filter compiled from :mod:`.policy` with libseccomp, once per process.

libseccomp (``libseccomp.so.2``, on most Linux hosts: systemd, apt and container runtimes use it) turns
the policy into a BPF program for this machine's architecture: it knows each architecture's call
numbers, tests the architecture field (a call through another ABI, the 32-bit ``int 0x80`` or x32, kills
the process) and compares 64-bit arguments in two halves. Nothing here writes BPF by hand. The program is
exported as bytes and handed to the launcher in the launch configuration; the launcher installs it with
``prctl(PR_SET_SECCOMP)`` (:mod:`._launcher`), which needs no library inside the sandbox.

Where libseccomp is missing (or cannot build the filter) runs go on without a filter: the isolation
report's ``seccomp`` layer is False and a one-line WARNING names what is missing (:func:`filters` says
why). No run ever gets half a filter.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from . import policy

logger = logging.getLogger(__name__)

LIBRARY = "libseccomp.so.2"
_ACT_ALLOW = 0x7FFF0000
_ACT_KILL_PROCESS = 0x80000000
_ACT_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
_ATTR_ACT_BADARCH, _ATTR_CTL_OPTIMIZE = 2, 8
_CMP_MASKED_EQ = 7


class _Compare(ctypes.Structure):
    """``struct scmp_arg_cmp``."""

    _fields_ = (("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64))  # fmt: skip


class SeccompUnavailable(RuntimeError):
    """No filter can be built here (libseccomp missing, or it refused the policy)."""


@dataclass(frozen=True)
class Filters:
    """BPF programs (``struct sock_filter`` arrays, as bytes) for this machine."""

    program: bytes
    """What every program runs under (:data:`.policy.ALLOWED`)."""
    setup: bytes
    """The batch harness's, until each input installs :attr:`program` (plus :data:`.policy.SETUP`)."""


@functools.cache
def _library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(LIBRARY, use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp ({LIBRARY}) not found: {exc}") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_Compare)]  # fmt: skip
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _number(lib: ctypes.CDLL, name: str) -> int | None:
    """The call's number on this architecture; None where it has none (or libseccomp does not know it)."""
    number = lib.seccomp_syscall_resolve_name(name.encode())
    return number if number >= 0 else None


def _compile(rules: Iterable[policy.Rule], denied: Iterable[str]) -> bytes:
    lib = _library()
    ctx = lib.seccomp_init(_ACT_ERRNO | _ENOSYS)
    if not ctx:
        raise SeccompUnavailable("libseccomp could not start a filter")
    try:
        if lib.seccomp_attr_set(ctx, _ATTR_ACT_BADARCH, _ACT_KILL_PROCESS) != 0:
            raise SeccompUnavailable("libseccomp cannot kill a process calling through another architecture's ABI")
        lib.seccomp_attr_set(ctx, _ATTR_CTL_OPTIMIZE, 2)  # a binary search over call numbers (libseccomp >= 2.5)
        for rule in rules:
            number = _number(lib, rule.name)
            if number is None:
                continue
            compares = (_Compare * max(1, len(rule.when)))(
                *(_Compare(arg, _CMP_MASKED_EQ, mask, value) for arg, mask, value in rule.when)
            )
            _check(lib.seccomp_rule_add_array(ctx, _ACT_ALLOW, number, len(rule.when), compares), rule.name)
        for name in denied:
            number = _number(lib, name)
            if number is not None:
                _check(lib.seccomp_rule_add_array(ctx, _ACT_ERRNO | _EPERM, number, 0, None), name)
        read, write = os.pipe()
        try:
            _check(lib.seccomp_export_bpf(ctx, write), "export")
            os.close(write)
            write = -1
            chunks = []
            while chunk := os.read(read, 65536):
                chunks.append(chunk)
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)
    finally:
        lib.seccomp_release(ctx)
    program = b"".join(chunks)
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported {len(program)} bytes, not a BPF program")
    return program


def _check(result: int, what: str) -> None:
    if result != 0:
        raise SeccompUnavailable(f"libseccomp refused {what}: {os.strerror(-result)}")


@functools.cache
def filters() -> Filters:
    """This machine's filters, compiled once (raises :class:`SeccompUnavailable` saying why not)."""
    setup_names = {rule.name for rule in policy.SETUP}
    allowed = {rule.name for rule in policy.ALLOWED}
    overlap = allowed & set(policy.DENIED)
    if overlap:  # (a policy edit that contradicts itself)
        raise SeccompUnavailable(f"the policy both allows and denies {sorted(overlap)}")
    return Filters(
        program=_compile(policy.ALLOWED, policy.DENIED),
        setup=_compile((*policy.ALLOWED, *policy.SETUP), [n for n in policy.DENIED if n not in setup_names]),
    )


@functools.cache
def available() -> tuple[Filters | None, str]:
    """The filters, or None and why there are none (a one-line WARNING, once per process)."""
    try:
        return filters(), "libseccomp"
    except SeccompUnavailable as exc:
        logger.warning("sandbox runs WITHOUT a system-call filter: %s", exc)
        return None, str(exc)
