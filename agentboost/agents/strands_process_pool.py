"""A pool of long-lived agent worker processes that runs many episodes in parallel, isolated from
each other and from the trainer.

* Workers (:mod:`agentboost.agents.strands_worker`) are spawned once and each runs many episodes
  concurrently on its own event loop; tokenizers and backend clients are built once per worker.
* Submit :class:`~agentboost.runs.EpisodeSpec` s (plain data), get :class:`~agentboost.episode.Episode` s
  back: ``submit()`` returns a ``concurrent.futures.Future``, so the pool works the same from
  synchronous code (``run_all``), from an asyncio program (``await pool.run(spec)``, ``await pool.map``)
  and across event loops (rLLM's trainer creates a new loop per step). A driver thread owns the
  processes; no state is bound to any event loop.
* Limits: episodes in flight globally and per worker, each episode's wall clock (enforced in the
  worker, and again here with a grace period), worker memory (RSS), worker liveness (heartbeats).
* A worker that crashes, hangs, exceeds its memory or leaks too many stuck tool threads is killed
  with its whole process group and replaced. Every episode it held comes back as an ``Episode`` with
  termination ``infra_error`` (or ``timeout`` if it was past its deadline), reward 0 and a zero
  loss mask: never lost, never silently dropped.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import logging
import math
import multiprocessing
import os
import queue
import signal
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from ..episode import Episode
from ..runs import EpisodeSpec, failed_episode
from ..types import Budget, Termination
from .strands_worker import worker_main

logger = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class _InFlight:
    spec: EpisodeSpec
    future: concurrent.futures.Future[Episode]
    started: float
    deadline: float


@dataclass
class _Worker:
    wid: int
    process: Any
    conn: Connection
    started: float
    pid: int | None = None
    ready: bool = False
    draining: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    busy_threads: int = 0
    reported_in_flight: int = 0
    leak_strikes: int = 0
    inflight: dict[str, _InFlight] = field(default_factory=dict)
    episodes_done: int = 0


@dataclass(frozen=True)
class PoolConfig:
    workers: int = 2
    max_in_flight: int = 256
    max_per_worker: int | None = None
    """Default: ``ceil(max_in_flight / workers)``."""
    tool_threads: int = 32
    memory_limit_mb: int | None = None
    heartbeat_timeout_s: float = 60.0
    deadline_grace_s: float = 30.0
    start_timeout_s: float = 180.0
    max_leaked_threads: int | None = None
    """Recycle a worker when this many tool threads are still busy with no episode running
    (default: half of ``tool_threads``)."""
    log_level: str = "WARNING"
    torch_in_workers: bool = False
    """Workers talk to inference servers and need no torch: keeping it out halves their memory
    (``USE_TORCH=0``). Set True for in-process model backends (``hf:``/``tiny``) inside workers."""
    env: dict[str, str] = field(default_factory=dict)
    preload: tuple[str, ...] = ("agentboost.runs", "strands")


class StrandsProcessPool:
    """See the module docstring. Use as a context manager (sync or async) or call ``start``/``close``."""

    def __init__(self, config: PoolConfig | None = None, **overrides: Any) -> None:
        if config is None:
            config = PoolConfig(**overrides)
        elif overrides:
            raise TypeError("give either a PoolConfig or keyword overrides")
        if config.workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.config = config
        self.max_per_worker = config.max_per_worker or math.ceil(config.max_in_flight / config.workers)
        self._leak_limit = config.max_leaked_threads or max(1, config.tool_threads // 2)
        self._ctx = multiprocessing.get_context("spawn")
        self._pending: collections.deque[tuple[EpisodeSpec, concurrent.futures.Future[Episode]]] = collections.deque()
        self._submit_lock = threading.Lock()
        self._workers: dict[int, _Worker] = {}
        self._next_wid = 0
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        self._commands: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._created = time.monotonic()
        self.stats_counters: dict[str, Any] = {
            "submitted": 0,
            "completed": 0,
            "terminations": collections.Counter(),
            "restarts": collections.Counter(),
        }
        self._completion_times: collections.deque[float] = collections.deque(maxlen=10_000)
        self._close_timeout_s = 30.0
        _LIVE_POOLS.add(self)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> StrandsProcessPool:
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._drive, name="agentboost-pool", daemon=True)
        self._thread.start()
        if not self._started.wait(self.config.start_timeout_s + 5):
            raise TimeoutError("the worker pool did not start")
        if self._start_error is not None:
            raise RuntimeError(f"the worker pool failed to start: {self._start_error}") from self._start_error
        return self

    async def astart(self) -> StrandsProcessPool:
        return await asyncio.to_thread(self.start)

    def close(self, *, drain: bool = False, timeout_s: float = 30.0) -> None:
        """Stop the workers (``drain``: let in-flight episodes finish first) and reap every process."""
        if self._thread is None or self._stopping.is_set():
            return
        self._close_timeout_s = timeout_s
        self._commands.put("drain" if drain else "stop")
        self._wake()
        self._thread.join(timeout_s + 10)
        self._stopping.set()

    async def aclose(self, *, drain: bool = False, timeout_s: float = 30.0) -> None:
        await asyncio.to_thread(self.close, drain=drain, timeout_s=timeout_s)

    def __enter__(self) -> StrandsProcessPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> StrandsProcessPool:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- submitting -------------------------------------------------------------------------
    def submit(self, spec: EpisodeSpec) -> concurrent.futures.Future[Episode]:
        if self._thread is None:
            self.start()
        if self._stopping.is_set():
            raise RuntimeError("the pool is closed")
        future: concurrent.futures.Future[Episode] = concurrent.futures.Future()
        with self._submit_lock:
            self._pending.append((spec, future))
            self.stats_counters["submitted"] += 1
        self._wake()
        return future

    async def run(self, spec: EpisodeSpec) -> Episode:
        return await asyncio.wrap_future(self.submit(spec))

    async def map(
        self, specs: Iterable[EpisodeSpec], on_done: Callable[[Episode], Awaitable[None] | None] | None = None
    ) -> list[Episode]:
        """Run ``specs``; returns episodes in input order, calling ``on_done`` as each finishes."""
        futures = [asyncio.wrap_future(self.submit(s)) for s in specs]
        if on_done is not None:
            for next_done in asyncio.as_completed(futures):
                maybe = on_done(await next_done)
                if asyncio.iscoroutine(maybe):
                    await maybe
        return list(await asyncio.gather(*futures))

    def run_all(self, specs: Iterable[EpisodeSpec], on_done: Callable[[Episode], None] | None = None) -> list[Episode]:
        """Synchronous ``map``."""
        futures = [self.submit(s) for s in specs]
        if on_done is not None:
            for done in concurrent.futures.as_completed(futures):
                on_done(done.result())
        return [f.result() for f in futures]

    # -- observability ----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        recent = [t for t in self._completion_times if now - t <= 10.0]
        workers = list(self._workers.values())
        return {
            "workers": len(workers),
            "ready_workers": sum(w.ready for w in workers),
            "in_flight": sum(len(w.inflight) for w in workers),
            "pending": len(self._pending),
            "submitted": self.stats_counters["submitted"],
            "completed": self.stats_counters["completed"],
            "episodes_per_s_10s": len(recent) / 10.0,
            "episodes_per_s_total": self.stats_counters["completed"] / max(now - self._created, 1e-9),
            "terminations": dict(self.stats_counters["terminations"]),
            "failures": {
                k: v
                for k, v in self.stats_counters["terminations"].items()
                if k not in ("completed", "max_turns", "max_tokens")
            },
            "restarts": dict(self.stats_counters["restarts"]),
            "per_worker": {
                w.wid: {"pid": w.pid, "in_flight": len(w.inflight), "done": w.episodes_done, "rss_mb": _rss_mb(w.pid)}
                for w in workers
            },
        }

    # -- driver thread -----------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send_bytes(b"x")

    def _drive(self) -> None:
        try:
            for _ in range(self.config.workers):
                self._spawn()
            deadline = time.monotonic() + self.config.start_timeout_s
            while not all(w.ready for w in self._workers.values()):
                if time.monotonic() > deadline:
                    raise TimeoutError("workers did not become ready in time")
                self._poll(0.2)
                self._reap_dead()
        except BaseException as exc:
            self._start_error = exc
            self._started.set()
            self._shutdown(drain=False)
            return
        self._started.set()
        last_check = 0.0
        mode = None
        while mode is None:
            with contextlib.suppress(queue.Empty):
                mode = self._commands.get_nowait()
            self._dispatch()
            self._poll(0.25)
            if time.monotonic() - last_check >= 0.5:
                last_check = time.monotonic()
                self._reap_dead()
                self._police()
        self._shutdown(drain=mode == "drain")

    def _spawn(self) -> None:
        wid = self._next_wid
        self._next_wid += 1
        parent, child = self._ctx.Pipe(duplex=True)
        env = {"TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
        if not self.config.torch_in_workers:
            env["USE_TORCH"] = "0"
        env.update(self.config.env)
        options = {
            "tool_threads": self.config.tool_threads,
            "log_level": self.config.log_level,
            "env": env,
            "preload": list(self.config.preload),
        }
        process = self._ctx.Process(target=worker_main, args=(child, wid, options), name=f"agentboost-worker-{wid}")
        process.daemon = False
        process.start()
        child.close()
        self._workers[wid] = _Worker(wid, process, parent, time.monotonic(), pid=process.pid)
        logger.debug("spawned worker %d (pid %s)", wid, process.pid)

    def _capacity(self, worker: _Worker) -> int:
        if not worker.ready or worker.draining:
            return 0
        return self.max_per_worker - len(worker.inflight)

    def _dispatch(self) -> None:
        in_flight = sum(len(w.inflight) for w in self._workers.values())
        while self._pending and in_flight < self.config.max_in_flight:
            candidates = [w for w in self._workers.values() if self._capacity(w) > 0]
            if not candidates:
                return
            worker = max(candidates, key=self._capacity)
            with self._submit_lock:
                spec, future = self._pending.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            now = time.monotonic()
            budget = Budget.from_dict((spec.settings or {}).get("budget"))
            deadline = now + budget.wall_clock_s + budget.reward_timeout_s + self.config.deadline_grace_s
            try:
                worker.conn.send(("run", spec.to_dict()))
            except (OSError, ValueError) as exc:
                future.set_result(failed_episode(spec, Termination.INFRA_ERROR, f"could not send to worker: {exc}"))
                self._note(future.result())
                continue
            worker.inflight[spec.episode_id] = _InFlight(spec, future, now, deadline)
            in_flight += 1

    def _poll(self, timeout: float) -> None:
        conns = {w.conn: w for w in self._workers.values()}
        try:
            ready = wait([*conns, self._wake_r], timeout=timeout)
        except OSError:
            return
        for conn in ready:
            if conn is self._wake_r:
                with contextlib.suppress(OSError, EOFError):
                    while self._wake_r.poll():
                        self._wake_r.recv_bytes()
                continue
            worker = conns[conn]
            try:
                while conn.poll():
                    self._handle(worker, conn.recv())
            except (EOFError, OSError):
                worker.last_seen = 0.0  # dead: the reaper will notice

    def _handle(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        worker.last_seen = time.monotonic()
        kind = message[0]
        if kind == "ready":
            worker.ready, worker.pid = True, int(message[1])
        elif kind == "heartbeat":
            worker.reported_in_flight, worker.busy_threads = int(message[1]), int(message[2])
            leaking = worker.reported_in_flight == 0 and worker.busy_threads >= self._leak_limit
            worker.leak_strikes = worker.leak_strikes + 1 if leaking else 0
        elif kind == "done":
            entry = worker.inflight.pop(message[1], None)
            if entry is None:
                return  # already failed by the pool (deadline) and replaced
            worker.episodes_done += 1
            try:
                episode = Episode.from_dict(message[2])
            except Exception as exc:
                episode = failed_episode(entry.spec, Termination.INFRA_ERROR, f"unreadable episode from worker: {exc}")
            self._complete(entry, episode)

    def _complete(self, entry: _InFlight, episode: Episode) -> None:
        if not entry.future.done():
            entry.future.set_result(episode)
        self._note(episode)

    def _note(self, episode: Episode) -> None:
        self.stats_counters["completed"] += 1
        self.stats_counters["terminations"][episode.termination.value] += 1
        self._completion_times.append(time.monotonic())

    # -- failure handling -------------------------------------------------------------------
    def _reap_dead(self) -> None:
        for worker in list(self._workers.values()):
            code = worker.process.exitcode
            if code is None and worker.last_seen > 0:
                continue
            if code is None:
                worker.process.join(0.5)
                code = worker.process.exitcode
            reason = _describe_exit(code)
            self._replace(worker, "crash", f"worker {worker.wid} died ({reason})")

    def _police(self) -> None:
        now = time.monotonic()
        limit = self.config.memory_limit_mb
        for worker in list(self._workers.values()):
            if not worker.ready:
                if now - worker.started > self.config.start_timeout_s:
                    self._replace(worker, "start_timeout", f"worker {worker.wid} did not start")
                continue
            # Memory first: a worker that allocates in one long C call (a big memset) also misses
            # heartbeats, and "over the memory limit" is the diagnosis the user can act on.
            if limit is not None:
                rss = _rss_mb(worker.pid)
                if rss is not None and rss > limit:
                    self._replace(worker, "memory", f"worker {worker.wid} used {rss:.0f} MB > limit {limit} MB")
                    continue
            if now - worker.last_seen > self.config.heartbeat_timeout_s:
                self._replace(worker, "hang", f"worker {worker.wid} stopped responding")
                continue
            late = [e for e in worker.inflight.values() if now > e.deadline]
            if late:
                ids = ", ".join(e.spec.episode_id for e in late[:3])
                self._replace(
                    worker, "episode_deadline", f"worker {worker.wid} held episode(s) {ids} past the deadline"
                )
                continue
            if not worker.inflight and worker.leak_strikes >= 3:  # three heartbeats in a row
                self._replace(
                    worker, "leaked_threads", f"worker {worker.wid} leaked {worker.busy_threads} tool threads"
                )

    def _replace(self, worker: _Worker, reason: str, detail: str) -> None:
        logger.warning("%s; replacing it (%d episode(s) in flight come back as failures)", detail, len(worker.inflight))
        self._kill(worker)
        self.stats_counters["restarts"][reason] += 1
        now = time.monotonic()
        for entry in worker.inflight.values():
            if now > entry.deadline:
                termination, text = Termination.TIMEOUT, f"episode exceeded its deadline; {detail}"
            else:
                termination, text = Termination.INFRA_ERROR, detail
            episode = failed_episode(entry.spec, termination, text, wall_s=now - entry.started)
            self._complete(entry, episode)
        worker.inflight.clear()
        del self._workers[worker.wid]
        if not self._stopping.is_set():
            self._spawn()

    def _kill(self, worker: _Worker) -> None:
        pid = worker.pid or worker.process.pid
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        worker.process.join(5)
        with contextlib.suppress(OSError):
            worker.conn.close()

    def _shutdown(self, *, drain: bool) -> None:
        self._stopping.set()
        deadline = time.monotonic() + self._close_timeout_s
        for worker in self._workers.values():
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(("stop", drain))
        while self._workers and time.monotonic() < deadline:
            self._poll(0.1)
            for worker in list(self._workers.values()):
                if worker.process.exitcode is not None:
                    self._finish_worker(worker, "the pool was closed")
        for worker in list(self._workers.values()):
            self._finish_worker(worker, "the pool was closed")
        with self._submit_lock:
            pending = list(self._pending)
            self._pending.clear()
        for spec, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_result(failed_episode(spec, Termination.INFRA_ERROR, "the pool was closed"))

    def _finish_worker(self, worker: _Worker, detail: str) -> None:
        self._kill(worker)
        for entry in worker.inflight.values():
            self._complete(entry, failed_episode(entry.spec, Termination.INFRA_ERROR, detail))
        worker.inflight.clear()
        self._workers.pop(worker.wid, None)


def _rss_mb(pid: int | None) -> float | None:
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE / 2**20
    except (OSError, ValueError, IndexError):
        return None


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "connection lost"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_LIVE_POOLS: weakref.WeakSet[StrandsProcessPool] = weakref.WeakSet()


@atexit.register
def _close_all_pools() -> None:  # no orphan workers when the interpreter exits
    for pool in list(_LIVE_POOLS):
        with contextlib.suppress(Exception):
            pool.close(timeout_s=5)
