"""Run a Python program in an already started (forked) interpreter as if ``python -I -B -S main.py`` had
just started it. Stdlib only, no imports beyond the modules every interpreter has loaded at startup.

A zygote child (:mod:`agentboost.sandbox._zygote`) and each test of the batch harness
(:mod:`agentboost.sandbox._harness`) are forks of a warm interpreter, not fresh ones. :func:`enter` makes
the interpreter state the program sees the one a fresh start gives, the same for every run:

* ``sys.modules``: exactly the modules loaded at interpreter start (``baseline``); anything the zygote or
  the harness imported afterwards is dropped (a later ``import`` loads it afresh);
* ``sys.path`` and ``sys.path_importer_cache`` as at start; ``sys.argv``, ``sys.orig_argv`` of the program;
* a new ``__main__`` module with the attributes a script gets (``__file__`` absolute, ``__loader__`` a
  ``SourceFileLoader``, ``__cached__`` None, ``__annotations__``, ``__builtins__``);
* ``os.environ`` (and the C environment) exactly the run's;
* Python's SIGINT handler back in place (the launcher's PID 1 ignored SIGINT at the C level).

:func:`run` then compiles and executes the program the way the interpreter runs a script: an uncaught
exception is printed by ``sys.excepthook`` without any frame of ours and gives status 1
(``KeyboardInterrupt``: the process dies by SIGINT, as the interpreter makes it); ``SystemExit`` gives
its code. :func:`finish` ends the process as the interpreter's finalisation does for the program's objects
(threads, atexit, flushing, ``__del__`` of module globals) without walking the zygote's memory: in a fork
that walk copies nearly every page on write, which cost more than the rest of a run.

Not reproduced: the hash seed and the address-space layout are the zygote's (shared by its runs, not
secret: no run's data ever lives in the zygote); ``sys.modules`` entries are fresh, but an extension
module dropped and imported again is re-initialised from the interpreter's extension cache.
"""

# ruff: noqa: SIM105 - no contextlib here: only modules every interpreter has loaded at start

import os
import sys

MARK = "agentboost-sandbox:"
PR_SET_DUMPABLE, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 4, 22, 2
_sealing = []  # (prctl, the sock_fprog type), made on first use


def seal(program):
    """The last step before the program's first instruction (after every other layer is set up): this
    process non-dumpable (its ``/proc/<pid>/{mem,pagemap,environ,auxv}`` then belong to root: the program
    cannot read them, nor can its forks and threads), then the system-call filter ``program`` (BPF bytes
    compiled from :mod:`agentboost.sandbox.policy`; None: none), which keeps it so (no ``PR_SET_DUMPABLE``,
    no ``execve``). Needs ``no_new_privs`` (set by the launcher). A filter the kernel refuses is noted on
    stderr (the isolation report shows the layer missing)."""
    prctl, fprog, c = sealer()
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if program is None:
        return
    bpf = fprog(len(program) // 8, program)
    if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, c.byref(bpf), 0, 0) != 0:
        sys.stderr.write(f"{MARK} no-seccomp {os.strerror(c.get_errno())}\n")
        sys.stderr.flush()


def sealer():
    """What :func:`seal` calls ``prctl`` with, made once (a process that forks runs makes it before: a
    child then has it for nothing, instead of 0.3 ms of ``_ctypes`` type creation)."""
    if not _sealing:
        import _ctypes  # (not ctypes: importing the package costs milliseconds)

        class CInt(_ctypes._SimpleCData):
            _type_ = "i"

        class CUShort(_ctypes._SimpleCData):
            _type_ = "H"

        class CCharP(_ctypes._SimpleCData):
            _type_ = "z"

        class Fprog(_ctypes.Structure):
            _fields_ = (("len", CUShort), ("filter", CCharP))

        class Prctl(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = CInt

        class Libc:
            _handle = _ctypes.dlopen(None, 0)

        _sealing.extend((Prctl(("prctl", Libc())), Fprog, _ctypes))
    return _sealing


def capture():
    """The interpreter state to restore for every program; call before importing anything."""
    return frozenset(sys.modules), tuple(sys.path), frozenset(sys.path_importer_cache)


def enter(baseline, script, argv, orig_argv, env):
    """Make this interpreter look freshly started on ``script`` (an absolute path; see the module doc).
    Returns the new ``__main__`` module and the ids of the modules already loaded (for :func:`finish`)."""
    modules, path, cache = baseline
    for name in [n for n in sys.modules if n not in modules]:
        del sys.modules[name]
    sys.path[:] = path
    for key in [k for k in sys.path_importer_cache if k not in cache]:
        del sys.path_importer_cache[key]
    shared = frozenset(id(m) for m in sys.modules.values())  # left alone by finish()
    sys.path_importer_cache[script] = None  # the interpreter asks for an importer of the script path
    sys.argv = list(argv)
    sys.orig_argv = list(orig_argv)
    os.environ.clear()  # this module's os: also sets the C environment (for subprocesses, libraries)
    os.environ.update(env)
    posix = sys.modules["posix"]  # where a freshly imported os module reads the environment from
    posix.environ.clear()
    posix.environ.update((os.fsencode(k), os.fsencode(v)) for k, v in env.items())
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", script)
    main = type(sys)("__main__")  # a new module: the old one's functions may still be running (the harness)
    main.__dict__.update(__annotations__={}, __builtins__=sys.modules["builtins"], __file__=script, __cached__=None)
    main.__loader__ = loader
    sys.modules["__main__"] = main
    signals = sys.modules["_signal"]
    signals.signal(signals.SIGINT, signals.default_int_handler)
    return main, shared


def cold(baseline):
    r"""A started (not forked) run: the launcher, its set-up done, ``exec``\ s the program's interpreter on
    ``-c`` with this module's source (its working directory is the program's: nothing of the host is in
    the root) and a hex ``marshal`` of the seal's filter, the script, ``argv`` and environment. Sealed
    here, before the program, then run as a zygote's child runs it: no ``exec`` after the filter.
    ``baseline``: :func:`capture` before this module's own imports."""
    import marshal

    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    seal(cfg["seccomp"])
    main, shared = enter(baseline, cfg["script"], cfg["argv"][-1:], cfg["argv"], cfg["env"])
    finish(run(main), shared)


class _DieBy(int):
    """A status that means: end by this signal (not an exit code, which it could be mistaken for)."""


def run(main, code=None):
    """Execute the script of ``main`` (or the already compiled ``code`` of it) in ``main``'s namespace and
    return the exit status the interpreter would exit with (see the module doc)."""
    try:
        if code is None:
            with open(main.__file__, "rb") as fh:
                source = fh.read()
            code = compile(source, main.__file__, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException as exc:  # the interpreter's own top-level handling, minus our frame
        tb = exc.__traceback__
        tb = tb.tb_next if tb is not None and tb.tb_frame.f_code is run.__code__ else tb
        exc.__traceback__ = tb  # the hook prints the exception's own traceback
        sys.excepthook(type(exc), exc, tb)
        return _DieBy(2) if isinstance(exc, KeyboardInterrupt) else 1  # the interpreter dies by SIGINT then
    return 0


def _exit_status(exc):
    """What the interpreter makes of an uncaught ``SystemExit``: None is 0, an int is itself, anything
    else is printed on stderr and is 1."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:  # no stderr left to complain to
        pass
    return 1


_SPECIAL_SYS = ("path", "argv", "ps1", "ps2", "last_type", "last_value", "last_traceback", "path_hooks",
                "path_importer_cache", "meta_path", "__interactivehook__")  # fmt: skip


def finish(status, shared):
    """End the process as the interpreter's finalisation would, for the program's objects, then ``_exit``
    (always: whatever the program did to the interpreter, this process never returns to its caller).

    In CPython 3.11's order: wait for non-daemon threads, atexit callbacks, flush ``sys.stdout`` /
    ``sys.stderr`` (a failed flush of stdout turns status 0 into 120), collect garbage, drop the special
    ``sys`` names and put back the original standard streams, drop every module, collect garbage, clear
    the globals of the modules still alive (newest first; a single leading underscore first,
    ``__builtins__`` kept), flush the original streams. So ``__del__`` methods, unflushed file objects
    and atexit output behave as after a script. (An exception in an atexit callback is reported with one
    more traceback line, this function's.)
    ``shared``: ids of the modules the program found loaded (the interpreter's own, shared with the
    zygote): their globals are left alone, which saves copying every page of the zygote's memory on write.
    """
    signals = sys.modules["_signal"]
    try:
        status = _finalise(status, shared)
    finally:
        if isinstance(status, _DieBy):  # as the interpreter does after an uncaught KeyboardInterrupt
            try:
                signals.signal(status, signals.SIG_DFL)
                os.kill(os.getpid(), status)
            except BaseException:
                pass
            os._exit(128 + status)
        os._exit(status & 0xFF)


def _finalise(status, shared):
    import _weakref  # builtin modules: cheap, and importable before the import system is torn down below
    import atexit
    import gc

    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException as exc:
            _unraisable(exc, threading)
    atexit._run_exitfuncs()
    if not _flush_std() and status == 0:
        status = 120
    if gc.isenabled():
        gc.collect()
    builtins = sys.modules.get("builtins")
    if builtins is not None and hasattr(builtins, "_"):
        builtins._ = None
    for name in _SPECIAL_SYS:
        if hasattr(sys, name):
            setattr(sys, name, None)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    module_type = type(sys)
    alive = [
        _weakref.ref(module)
        for name, module in list(sys.modules.items())
        if isinstance(module, module_type) and id(module) not in shared and name not in ("sys", "builtins")
    ]
    module = None
    for name in list(sys.modules):
        sys.modules[name] = None
    sys.modules.clear()
    gc.collect()
    for ref in reversed(alive):
        if (module := ref()) is not None:
            _clear_globals(module.__dict__)
    module = None
    for stream in (sys.__stdout__, sys.__stderr__):  # what module teardown printed; silently, as the
        try:  # interpreter's own streams flush when they go (sys is empty by then: nowhere to complain)
            stream.flush()
        except BaseException:
            pass
    return status


def _clear_globals(namespace):
    """``_PyModule_ClearDict``: names with a single leading underscore first, then all but ``__builtins__``."""
    for key in list(namespace):
        if isinstance(key, str) and key[:1] == "_" and key[1:2] != "_" and namespace[key] is not None:
            namespace[key] = None
    for key in list(namespace):
        if isinstance(key, str) and key != "__builtins__" and namespace[key] is not None:
            namespace[key] = None


def _flush_std():
    """Flush ``sys.stdout`` then ``sys.stderr`` as the interpreter does at exit; False if stdout failed."""
    ok = True
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except BaseException as exc:
            if name == "stdout":
                ok = False
                _unraisable(exc, stream)
    return ok


def _unraisable(exc, obj):
    try:
        sys.__stderr__.write(f"Exception ignored in: {obj!r}\n{type(exc).__name__}: {exc}\n")
        sys.__stderr__.flush()
    except BaseException:
        pass
