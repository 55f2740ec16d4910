"""A long-lived agent worker process: many episodes concurrently on one asyncio loop.

Started by :class:`~agentboost.agents.strands_process_pool.StrandsProcessPool` (``spawn``), it owns a
session of its own (so the pool can kill it and everything it started as one process group), builds
tokenizers and backend clients once (``build_model`` caches them per process), runs synchronous
tools in a bounded thread pool, and talks to the pool over a ``multiprocessing`` pipe with pickled,
structured messages. Nothing is exchanged over stdout, so tools may print freely.

Messages, pool -> worker: ``("run", spec_dict)``, ``("stop", drain: bool)``.
Worker -> pool: ``("ready", pid)``, ``("done", episode_id, episode_dict)``,
``("heartbeat", in_flight, busy_tool_threads, time)``. Tool threads still busy when no episode is
running are leaked (a timed-out synchronous tool cannot be interrupted): the pool recycles a worker
that leaks too many.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

logger = logging.getLogger("agentboost.worker")

HEARTBEAT_S = 1.0
STOP_GRACE_S = 1.0


def worker_main(conn: Connection, worker_id: int, options: dict[str, Any]) -> None:
    """Process entry point (must be importable for ``spawn``)."""
    with contextlib.suppress(OSError):  # already a session leader
        os.setsid()
    for key, value in (options.get("env") or {}).items():
        os.environ[key] = str(value)
    logging.basicConfig(
        level=options.get("log_level", "WARNING"),
        format=f"%(asctime)s %(levelname)s worker-{worker_id} %(name)s: %(message)s",
    )
    for module in options.get("preload", []):
        __import__(module)
    # Not asyncio.run(): its teardown waits for every task and tool thread, and a tool blocked in a
    # thread would keep a stopped worker alive. The process exits as soon as serving ends.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    code = 0
    try:
        loop.run_until_complete(_serve(conn, worker_id, options))
    except BaseException:
        logger.exception("worker %d failed", worker_id)
        code = 1
    finally:
        with contextlib.suppress(OSError):
            conn.close()
        logging.shutdown()
        os._exit(code)


async def _serve(conn: Connection, worker_id: int, options: dict[str, Any]) -> None:
    from ..episode import Episode
    from ..runs import EpisodeSpec, failed_episode, run_spec
    from ..types import Termination

    loop = asyncio.get_running_loop()
    tool_threads = int(options.get("tool_threads", 32))
    executor = CountingExecutor(max_workers=tool_threads, thread_name_prefix="tool")
    loop.set_default_executor(executor)
    inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    def reader() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the pool is gone: stop, do not linger as an orphan
                message = ("stop", False)
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message[0] == "stop":
                return

    threading.Thread(target=reader, name="pool-reader", daemon=True).start()
    running: dict[str, asyncio.Task[None]] = {}

    def send(message: tuple[Any, ...]) -> None:
        try:
            conn.send(message)
        except (BrokenPipeError, OSError):
            logger.warning("pool connection lost")

    async def one(spec: EpisodeSpec) -> None:
        try:
            episode: Episode = await run_spec(spec)
        except asyncio.CancelledError:
            episode = failed_episode(spec, Termination.INFRA_ERROR, "cancelled: the worker was stopped")
        except BaseException as exc:  # run_spec never raises; this guards against the impossible
            logger.exception("episode %s crashed the runner", spec.episode_id)
            episode = failed_episode(spec, Termination.INFRA_ERROR, f"worker error: {type(exc).__name__}: {exc}")
        send(("done", spec.episode_id, episode.to_dict()))
        running.pop(spec.episode_id, None)

    async def heartbeat() -> None:
        while True:
            send(("heartbeat", len(running), executor.busy, time.time()))
            await asyncio.sleep(HEARTBEAT_S)

    beat = asyncio.ensure_future(heartbeat())
    send(("ready", os.getpid()))
    try:
        while True:
            message = await inbox.get()
            if message[0] == "run":
                spec = EpisodeSpec.from_dict(message[1])
                running[spec.episode_id] = asyncio.ensure_future(one(spec))
            elif message[0] == "stop":
                drain = bool(message[1])
                if drain and running:
                    await asyncio.gather(*running.values(), return_exceptions=True)
                for task in list(running.values()):
                    task.cancel()
                if running:  # a tool blocked in a thread may ignore cancellation: do not wait for it
                    await asyncio.wait(list(running.values()), timeout=STOP_GRACE_S)
                return
    finally:
        beat.cancel()
        executor.shutdown(wait=False, cancel_futures=True)


class CountingExecutor(ThreadPoolExecutor):
    """A thread pool that knows how many of its threads are busy."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._busy = 0
        self._busy_lock = threading.Lock()

    @property
    def busy(self) -> int:
        return self._busy

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        def counted() -> Any:
            with self._busy_lock:
                self._busy += 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self._busy_lock:
                    self._busy -= 1

        return super().submit(counted)
