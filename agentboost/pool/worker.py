"""A long-lived agent worker process: many episodes concurrently on one asyncio loop.

Started by :class:`~agentboost.pool.pool.StrandsProcessPool` (``spawn``), it owns a session of its
own and is a child subreaper (the pool can kill it and everything it started), builds tokenizers and
backend clients once (``build_model`` caches them per process), runs synchronous tools in a bounded
:class:`~agentboost.pool.threads.ToolThreadPool`, and talks to the pool over a socket with
length-prefixed JSON frames (:mod:`agentboost.pool.wire`). Nothing is exchanged over stdout, so
tools may print freely; bytes a tool writes into the socket make the worker *unreadable* (the pool
replaces it), never execute anything.

Messages, pool -> worker: ``["run", spec_dict]``, ``["stop", drain]``.
Worker -> pool: ``["ready", pid]``, ``["done", episode_id, packed_episode]`` (:func:`wire.pack_episode`),
``["heartbeat", in_flight, busy_tool_threads, time]``, ``["fatal", traceback]`` (the worker could not
start; it exits next). Tool threads still busy when no episode is running are leaked (a timed-out
synchronous tool cannot be interrupted): the pool recycles a worker that leaks too many. When an
episode ends, the processes it started are killed (:mod:`agentboost.pool.procs`) before its
result is sent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from . import procs, wire
from .threads import ToolThreadPool

logger = logging.getLogger("agentboost.worker")

HEARTBEAT_S = 1.0
STOP_GRACE_S = 1.0
EXIT_START_FAILED = 3
EXIT_PROTOCOL = 4
_MAX_FATAL_CHARS = 8000


def worker_main(conn: Connection, worker_id: int, options: dict[str, Any]) -> None:
    """Process entry point (must be importable for ``spawn``)."""
    fd = conn.fileno()
    code = 0
    try:
        with contextlib.suppress(OSError):  # already a session leader
            os.setsid()
        os.set_inheritable(fd, False)  # no subprocess may hold (or scribble on) the pool's channel
        procs.become_subreaper()
        for key, value in (options.get("env") or {}).items():
            os.environ[key] = str(value)
        procs.install_markers(str(options.get("marker") or f"worker-{worker_id}"))
        logging.basicConfig(
            level=options.get("log_level", "WARNING"),
            format=f"%(asctime)s %(levelname)s worker-{worker_id} %(name)s: %(message)s",
        )
        for module in options.get("preload", []):
            __import__(module)
    except BaseException:
        text = traceback.format_exc()
        with contextlib.suppress(Exception):
            wire.write_all(fd, wire.encode(["fatal", text[-_MAX_FATAL_CHARS:]]))
        with contextlib.suppress(Exception):
            os.write(2, f"agentboost worker {worker_id} failed to start:\n{text}".encode())
        os._exit(EXIT_START_FAILED)
    # Not asyncio.run(): its teardown waits for every task and tool thread, and a tool blocked in a
    # thread would keep a stopped worker alive. The process exits as soon as serving ends.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    reaper = procs.EpisodeReaper()
    try:
        code = loop.run_until_complete(_serve(fd, worker_id, options, reaper))
    except BaseException:
        logger.exception("worker %d failed", worker_id)
        code = 1
    finally:
        with contextlib.suppress(Exception):
            reaper.sweep(set(), everything=True)  # nothing the worker started outlives it
        with contextlib.suppress(OSError):
            conn.close()
        logging.shutdown()
        os._exit(code)


async def _serve(fd: int, worker_id: int, options: dict[str, Any], reaper: procs.EpisodeReaper) -> int:
    from ..runs import EpisodeSpec, failed_episode, run_spec
    from ..types import Termination

    loop = asyncio.get_running_loop()
    executor = ToolThreadPool(max_workers=int(options.get("tool_threads", 32)), thread_name_prefix="tool")
    loop.set_default_executor(executor)
    sweeper = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweeper")
    max_frame = int(options.get("max_frame_bytes") or wire.DEFAULT_MAX_FRAME)
    inbox: asyncio.Queue[list[Any]] = asyncio.Queue()

    def reader() -> None:
        while True:
            try:
                message = wire.read_frame(fd, wire.TO_WORKER, max_frame=max_frame)
            except wire.WireError as exc:  # something in this process read or wrote our channel
                logger.error("unreadable message from the pool (%s): the channel is corrupt, exiting", exc)
                message = ["corrupt", None]
            except OSError:
                message = None
            if message is None:  # the pool is gone: stop, do not linger as an orphan
                message = ["stop", False]
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message[0] in ("stop", "corrupt"):
                return

    threading.Thread(target=reader, name="pool-reader", daemon=True).start()
    running: dict[str, asyncio.Task[None]] = {}
    tokens: dict[str, str] = {}

    def send(frame: bytes) -> None:
        try:
            wire.write_all(fd, frame)
        except OSError:
            logger.warning("pool connection lost")

    async def one(spec: EpisodeSpec) -> None:
        token = tokens[spec.episode_id]
        procs.episode_marker.set(token)  # this task's context: its tools' subprocesses carry it
        try:
            episode = await run_spec(spec)
        except asyncio.CancelledError:
            episode = failed_episode(spec, Termination.INFRA_ERROR, "cancelled: the worker was stopped")
        except BaseException as exc:  # run_spec never raises; this guards against the impossible
            logger.exception("episode %s crashed the runner", spec.episode_id)
            episode = failed_episode(spec, Termination.INFRA_ERROR, f"worker error: {type(exc).__name__}: {exc}")
        finally:
            running.pop(spec.episode_id, None)
            tokens.pop(spec.episode_id, None)
        live = set(tokens.values())
        try:  # before the result: nothing the episode started outlives it
            if procs.has_children():  # a /proc scan: off the loop
                await loop.run_in_executor(sweeper, reaper.sweep, live)
            else:
                reaper.sweep(live)  # one system call
        except Exception:
            logger.exception("episode %s: could not clean up its processes", spec.episode_id)
        send(done_frame(spec, episode, max_frame=max_frame))

    async def heartbeat() -> None:
        while True:
            send(wire.encode(["heartbeat", len(running), executor.busy, time.time()]))
            await asyncio.sleep(HEARTBEAT_S)

    beat = asyncio.ensure_future(heartbeat())
    send(wire.encode(["ready", os.getpid()]))
    try:
        while True:
            message = await inbox.get()
            if message[0] == "run":
                try:
                    spec = EpisodeSpec.from_dict(message[1])
                except Exception as exc:  # well-formed JSON, wrong content: the pool's bug, not ours
                    logger.error("unreadable episode spec (%s: %s): exiting", type(exc).__name__, exc)
                    return EXIT_PROTOCOL
                tokens[spec.episode_id] = secrets.token_hex(8)
                running[spec.episode_id] = asyncio.ensure_future(one(spec))
            elif message[0] == "corrupt":
                return EXIT_PROTOCOL
            elif message[0] == "stop":
                drain = bool(message[1])
                if drain and running:
                    await asyncio.gather(*running.values(), return_exceptions=True)
                for task in list(running.values()):
                    task.cancel()
                if running:  # a tool blocked in a thread may ignore cancellation: do not wait for it
                    await asyncio.wait(list(running.values()), timeout=STOP_GRACE_S)
                return 0
    finally:
        beat.cancel()
        executor.shutdown(wait=False, cancel_futures=True)
        sweeper.shutdown(wait=False)


def done_frame(spec: Any, episode: Any, *, max_frame: int = wire.DEFAULT_MAX_FRAME) -> bytes:
    """The ``done`` frame of an episode. An episode that cannot be serialised (a value JSON cannot
    hold, too large) becomes that episode's ``infra_error``, so its result is still sent at once."""
    from ..runs import failed_episode
    from ..types import Termination

    try:
        return wire.encode(["done", spec.episode_id, wire.pack_episode(episode)], max_frame=max_frame)
    except Exception as exc:
        detail = f"the episode could not be serialised: {type(exc).__name__}: {_safe_str(exc)}"
        logger.warning("episode %s: %s", spec.episode_id, detail)
        failed = failed_episode(spec, Termination.INFRA_ERROR, detail[:2000])
        return wire.encode(["done", spec.episode_id, wire.pack_episode(failed)], max_frame=max_frame)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)[:1000]
    except Exception:
        return "<unprintable>"
