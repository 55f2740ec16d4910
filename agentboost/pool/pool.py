"""A pool of long-lived agent worker processes that runs many episodes in parallel, isolated from
each other and from the trainer.

* Workers (:mod:`agentboost.pool.worker`) are spawned once and each runs many episodes
  concurrently on its own event loop; tokenizers and backend clients are built once per worker.
* Submit :class:`~agentboost.runs.EpisodeSpec` s (plain data), get :class:`~agentboost.episode.Episode` s
  back: ``submit()`` returns a ``concurrent.futures.Future``, so the pool works the same from
  synchronous code (``run_all``), from an asyncio program (``await pool.run(spec)``, ``await pool.map``)
  and across event loops (rLLM's trainer creates a new loop per step). A driver thread owns the
  processes and reads every worker without ever blocking on one; no state is bound to any loop.
* Limits: episodes in flight globally and per worker, each episode's wall clock (enforced in the
  worker, and again here with a grace period), worker memory (RSS), worker liveness (heartbeats).
* A worker that crashes, hangs, exceeds its memory, leaks too many stuck tool threads or sends
  bytes that are not a well-formed frame (a tool wrote into its channel) is killed with every
  process it started (:mod:`agentboost.pool.procs`) and replaced. Every episode it held comes back
  as an ``Episode`` with termination ``infra_error`` (also one held past its deadline: the worker
  failed to end it, not the policy), reward 0 and a zero loss mask: never lost, never silently dropped.
* Workers that keep dying before they are ready (a broken environment, an import error) fail the
  pool with the worker's own error instead of being respawned forever: ``start()`` raises it, or,
  later, every pending and in-flight episode comes back as ``infra_error`` naming it and
  ``submit()`` refuses.
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
import secrets
import selectors
import signal
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..episode import Episode
from ..runs import EpisodeSpec, failed_episode
from ..types import Budget, Termination
from ..utils.clock import wall_cap
from . import procs, wire
from .worker import EXIT_PROTOCOL, EXIT_START_FAILED, worker_main

logger = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_READ_CHUNK = 1 << 20
_MAX_DETAIL = 2000


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
    conn: Any
    fd: int
    decoder: wire.FrameDecoder
    started: float
    marker: str
    pid: int | None = None
    ready: bool = False
    outbox: bytearray = field(default_factory=bytearray)
    last_seen: float = field(default_factory=time.monotonic)
    lost: bool = False
    fatal: str | None = None
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
    max_start_failures: int = 3
    """Workers in a row that die (or time out) before they are ready: the pool fails with the last
    one's error rather than respawning forever."""
    max_leaked_threads: int | None = None
    """Recycle a worker when this many tool threads are still busy with no episode running
    (default: half of ``tool_threads``)."""
    max_message_mb: int = 512
    """Largest message (an episode record) a worker may send."""
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
        self._max_frame = config.max_message_mb * 2**20
        self._ctx = multiprocessing.get_context("spawn")
        self._token = secrets.token_hex(6)
        self._pending: collections.deque[tuple[EpisodeSpec, concurrent.futures.Future[Episode]]] = collections.deque()
        self._submit_lock = threading.Lock()
        self._workers: dict[int, _Worker] = {}
        self._processes: dict[int, tuple[Any, str]] = {}  # wid -> (process, marker); for close() of last resort
        self._processes_lock = threading.Lock()
        self._swept = False
        self._next_wid = 0
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._commands: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._failure: str | None = None
        self._start_failures = 0
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
            if self._start_error is not None:
                raise RuntimeError(f"the worker pool failed to start: {self._start_error}")
            return self
        self._thread = threading.Thread(target=self._drive, name="agentboost-pool", daemon=True)
        self._thread.start()
        if not self._started.wait(self.config.start_timeout_s + 5):
            self.close(timeout_s=5)
            raise TimeoutError("the worker pool did not start")
        if self._start_error is not None:
            self.close(timeout_s=5)
            raise RuntimeError(f"the worker pool failed to start: {self._start_error}") from self._start_error
        return self

    async def astart(self) -> StrandsProcessPool:
        return await asyncio.to_thread(self.start)

    def close(self, *, drain: bool = False, timeout_s: float = 30.0) -> None:
        """Stop the workers (``drain``: let in-flight episodes finish first) and kill every process
        they started. Always terminates every worker, also when the driver thread died or hangs."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            if not self._stopping.is_set():
                self._close_timeout_s = timeout_s
                self._commands.put("drain" if drain else "stop")
                self._wake()
            thread.join(timeout_s + 10)
        self._stopping.set()
        if thread is not None and thread.is_alive():
            logger.error("the pool's driver thread did not stop; killing its workers from here")
        self._kill_everything()

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
        if self._failure is not None:
            raise RuntimeError(f"the worker pool failed: {self._failure}")
        if self._stopping.is_set():
            raise RuntimeError("the pool is closed")
        if self._thread is None:
            self.start()
        future: concurrent.futures.Future[Episode] = concurrent.futures.Future()
        with self._submit_lock:
            self._pending.append((spec, future))
            self.stats_counters["submitted"] += 1
        self._wake()
        if self._stopping.is_set():  # closed meanwhile: the driver will not see it
            self._fail_pending(self._failure or "the pool was closed")
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
    @property
    def failure(self) -> str | None:
        """Why the pool failed (workers die before they are ready), or ``None``."""
        return self._failure

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
            "failed": self._failure,
            "per_worker": {
                w.wid: {"pid": w.pid, "in_flight": len(w.inflight), "done": w.episodes_done, "rss_mb": _rss_mb(w.pid)}
                for w in workers
            },
        }

    # -- driver thread -----------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes the driver
            os.write(self._wake_w, b"x")

    def _drive(self) -> None:
        try:
            self._run_driver()
        except BaseException as exc:  # a bug here must not leave workers running or futures hanging
            logger.exception("the worker pool's driver thread failed")
            if self._failure is None:
                self._failure = f"the pool's driver thread failed: {type(exc).__name__}: {exc}"
            if not self._started.is_set():
                self._start_error = exc
                self._started.set()
        finally:
            self._stopping.set()
            with contextlib.suppress(BaseException):
                self._kill_everything()

    def _run_driver(self) -> None:
        try:
            for _ in range(self.config.workers):
                self._spawn()
            deadline = time.monotonic() + self.config.start_timeout_s
            while not all(w.ready for w in self._workers.values()) or len(self._workers) < self.config.workers:
                if self._failure is not None:
                    raise RuntimeError(self._failure)
                if time.monotonic() > deadline:
                    raise TimeoutError("workers did not become ready in time")
                self._poll(0.2)
                self._reap_dead()
                self._police()
            if self._failure is not None:
                raise RuntimeError(self._failure)
        except BaseException as exc:
            self._start_error = exc
            self._started.set()
            self._shutdown(drain=False)
            return
        self._started.set()
        last_check = 0.0
        mode = None
        while mode is None and self._failure is None:
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
        marker = f"{self._token}-{wid}"
        env = {"TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
        if not self.config.torch_in_workers:
            env["USE_TORCH"] = "0"
        env.update(self.config.env)
        options = {
            "tool_threads": self.config.tool_threads,
            "log_level": self.config.log_level,
            "env": env,
            "preload": list(self.config.preload),
            "marker": marker,
            "max_frame_bytes": self._max_frame,
        }
        process = self._ctx.Process(target=worker_main, args=(child, wid, options), name=f"agentboost-worker-{wid}")
        process.daemon = False
        process.start()
        child.close()
        fd = parent.fileno()
        os.set_blocking(fd, False)
        worker = _Worker(
            wid, process, parent, fd, wire.FrameDecoder(wire.TO_POOL, max_frame=self._max_frame),
            time.monotonic(), marker, pid=process.pid,
        )  # fmt: skip
        self._workers[wid] = worker
        with self._processes_lock:
            self._processes[wid] = (process, marker)
        self._selector.register(fd, selectors.EVENT_READ, worker)
        logger.debug("spawned worker %d (pid %s)", wid, process.pid)

    def _capacity(self, worker: _Worker) -> int:
        if not worker.ready or worker.lost:
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
            try:
                budget = Budget.from_dict((spec.settings or {}).get("budget"))
                # The reward's budget is charged time: waiting for sandbox slots is not, up to its clock's cap.
                deadline = now + budget.wall_clock_s + wall_cap(budget.reward_timeout_s) + self.config.deadline_grace_s
                frame = wire.encode(["run", spec.to_dict()], max_frame=self._max_frame)
            except Exception as exc:  # not plain data: this episode's failure, not the worker's
                detail = f"the episode spec cannot be sent to a worker: {type(exc).__name__}: {exc}"
                self._resolve(future, failed_episode(spec, Termination.INFRA_ERROR, detail[:_MAX_DETAIL]))
                continue
            worker.inflight[spec.episode_id] = _InFlight(spec, future, now, deadline)
            worker.outbox += frame
            self._flush(worker)
            in_flight += 1

    def _flush(self, worker: _Worker) -> None:
        """Write what the worker's socket takes now; the rest waits for it to become writable."""
        if worker.lost:
            return
        try:
            while worker.outbox:
                written = os.write(worker.fd, worker.outbox)
                del worker.outbox[:written]
        except BlockingIOError:
            pass
        except OSError:
            worker.lost = True  # gone: the reaper will notice
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if worker.outbox else 0)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.modify(worker.fd, events, worker)

    def _poll(self, timeout: float) -> None:
        try:
            ready = self._selector.select(timeout)
        except OSError:
            return
        for key, events in ready:
            worker = key.data
            if worker is None:
                with contextlib.suppress(OSError):
                    while os.read(self._wake_r, 4096):
                        pass
                continue
            if self._workers.get(worker.wid) is not worker:
                continue  # replaced while handling an earlier event
            if events & selectors.EVENT_WRITE:
                self._flush(worker)
            if events & selectors.EVENT_READ:
                self._read(worker)

    def _read(self, worker: _Worker) -> None:
        total = 0
        try:
            while total < 64 * _READ_CHUNK:  # then let the other workers have a turn
                data = os.read(worker.fd, _READ_CHUNK)
                if not data:
                    self._lose(worker)
                    return
                total += len(data)
                for message in worker.decoder.feed(data):
                    self._handle(worker, message)
                    if self._workers.get(worker.wid) is not worker:
                        return
        except BlockingIOError:
            return
        except wire.WireError as exc:
            self._replace(worker, "protocol", f"worker {worker.wid} sent a malformed message ({exc})")
        except OSError:
            self._lose(worker)
        except Exception as exc:  # a message that breaks its handler: the worker is not trusted further
            logger.exception("worker %d: cannot handle its message", worker.wid)
            self._replace(worker, "protocol", f"worker {worker.wid} sent an unusable message ({exc!r:.200})")

    def _lose(self, worker: _Worker) -> None:
        """The channel closed: the worker died (or is dying). The reaper will name the cause."""
        worker.lost = True
        worker.last_seen = 0.0
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(worker.fd)

    def _handle(self, worker: _Worker, message: list[Any]) -> None:
        """One well-framed message. A wrong shape or value type is a ``WireError`` (broken worker)."""
        worker.last_seen = time.monotonic()
        kind = message[0]
        if kind == "heartbeat":
            in_flight, busy = message[1], message[2]
            if not (_is_int(in_flight) and _is_int(busy)):
                raise wire.WireError(f"bad heartbeat {message!r:.200}")
            worker.reported_in_flight, worker.busy_threads = in_flight, busy
            leaking = in_flight == 0 and busy >= self._leak_limit
            worker.leak_strikes = worker.leak_strikes + 1 if leaking else 0
        elif kind == "done":
            episode_id, data = message[1], message[2]
            if not isinstance(episode_id, str) or not isinstance(data, dict):
                raise wire.WireError(f"bad done message for {episode_id!r:.100}")
            entry = worker.inflight.pop(episode_id, None)
            if entry is None:
                return  # already failed by the pool (deadline) and replaced
            worker.episodes_done += 1
            try:
                episode = wire.unpack_episode(data)
                if episode.id != entry.spec.episode_id:
                    raise ValueError(f"episode id {episode.id!r} in the record of {episode_id!r}")
            except Exception as exc:
                detail = f"unreadable episode from worker {worker.wid}: {type(exc).__name__}: {exc}"
                episode = failed_episode(entry.spec, Termination.INFRA_ERROR, detail[:_MAX_DETAIL])
            self._complete(entry, episode)
        elif kind == "ready":
            if message[1] != worker.pid:  # never trust a pid from the channel: it is only checked
                raise wire.WireError(f"ready from pid {message[1]!r:.50}, expected {worker.pid}")
            worker.ready = True
            self._start_failures = 0
        elif kind == "fatal":
            worker.fatal = str(message[1])[-8000:]

    def _complete(self, entry: _InFlight, episode: Episode) -> None:
        self._resolve(entry.future, episode)

    def _resolve(self, future: concurrent.futures.Future[Episode], episode: Episode) -> None:
        if future.done():
            return
        try:
            future.set_result(episode)
        except concurrent.futures.InvalidStateError:  # resolved by close() from another thread
            return
        self.stats_counters["completed"] += 1
        self.stats_counters["terminations"][episode.termination.value] += 1
        self._completion_times.append(time.monotonic())

    # -- failure handling -------------------------------------------------------------------
    def _reap_dead(self) -> None:
        for worker in list(self._workers.values()):
            code = worker.process.exitcode
            if code is None and not worker.lost:
                continue
            if not worker.lost:  # read what it sent before dying (results, its fatal error)
                self._read(worker)
                if self._workers.get(worker.wid) is not worker:
                    continue
            if code is None:
                worker.process.join(0.5)
                code = worker.process.exitcode
            if code is None:  # closed its channel but lives on: broken all the same
                self._replace(worker, "crash", f"worker {worker.wid} closed its connection")
                continue
            if not worker.ready:
                self._replace(worker, "start_failure", self._start_failure_detail(worker, _describe_exit(code)))
            else:
                self._replace(worker, "crash", f"worker {worker.wid} died ({_describe_exit(code)})")

    def _start_failure_detail(self, worker: _Worker, how: str) -> str:
        if worker.fatal:
            return f"worker {worker.wid} failed to start ({how}):\n{worker.fatal}"
        return f"worker {worker.wid} died before it was ready ({how}); its traceback, if any, is on stderr"

    def _police(self) -> None:
        now = time.monotonic()
        limit = self.config.memory_limit_mb
        for worker in list(self._workers.values()):
            if not worker.ready:
                if now - worker.started > self.config.start_timeout_s:
                    self._replace(
                        worker, "start_failure", f"worker {worker.wid} did not start in {self.config.start_timeout_s}s"
                    )
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
        if self._workers.get(worker.wid) is not worker:
            return
        logger.warning("%s; replacing it (%d episode(s) in flight come back as failures)", detail, len(worker.inflight))
        self._kill(worker)
        self.stats_counters["restarts"][reason] += 1
        now = time.monotonic()
        for entry in worker.inflight.values():
            # Past its deadline too: the worker, not the policy, failed to end it (the episode's own
            # clock ends it inside the worker), so it is an infrastructure failure like the rest.
            text = f"episode exceeded its deadline; {detail}" if now > entry.deadline else detail
            episode = failed_episode(
                entry.spec, Termination.INFRA_ERROR, text[:_MAX_DETAIL], wall_s=now - entry.started
            )
            self._complete(entry, episode)
        worker.inflight.clear()
        if reason == "start_failure" or not worker.ready:  # whatever kills it, it never served
            self._start_failures += 1
            if self._start_failures >= self.config.max_start_failures:
                self._failure = (
                    f"{self._start_failures} workers in a row died before they were ready; the last: {detail}"
                )
                logger.error("the worker pool failed: %s", self._failure)
                return
        if not self._stopping.is_set() and self._failure is None:
            self._spawn()

    def _kill(self, worker: _Worker, *, scan: bool = True) -> None:
        """Kill the worker and everything it started: its tree, and (``scan``) its marked leftovers
        anywhere (at close, one scan for all workers follows instead)."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(worker.fd)
        pid = worker.pid or worker.process.pid
        alive = worker.process.exitcode is None
        # The tree first, while the (subreaper) worker still holds every orphan below it; the
        # process group after, as a backstop (the dead leader is not reaped yet: no pid reuse).
        procs.kill_worker_processes([pid] if alive else [], [worker.marker] if scan else [])
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        worker.process.join(5)
        with contextlib.suppress(OSError):
            worker.conn.close()
        self._workers.pop(worker.wid, None)
        with self._processes_lock:
            self._processes.pop(worker.wid, None)

    def _shutdown(self, *, drain: bool) -> None:
        self._stopping.set()
        detail = f"the worker pool failed: {self._failure}" if self._failure else "the pool was closed"
        deadline = time.monotonic() + self._close_timeout_s
        if self._failure is None:
            for worker in list(self._workers.values()):
                worker.outbox += wire.encode(["stop", drain])
                self._flush(worker)
            while self._workers and time.monotonic() < deadline:
                self._poll(0.1)
                for worker in list(self._workers.values()):
                    if worker.process.exitcode is not None or worker.lost:
                        self._finish_worker(worker, detail)
        for worker in list(self._workers.values()):
            self._finish_worker(worker, detail)
        self._fail_pending(detail)

    def _fail_pending(self, detail: str) -> None:
        with self._submit_lock:
            pending = list(self._pending)
            self._pending.clear()
        for spec, future in pending:
            if future.set_running_or_notify_cancel():
                self._resolve(future, failed_episode(spec, Termination.INFRA_ERROR, detail[:_MAX_DETAIL]))

    def _finish_worker(self, worker: _Worker, detail: str) -> None:
        self._kill(worker, scan=False)  # _kill_everything scans for every worker's leftovers at once
        for entry in worker.inflight.values():
            self._complete(entry, failed_episode(entry.spec, Termination.INFRA_ERROR, detail[:_MAX_DETAIL]))
        worker.inflight.clear()

    def _kill_everything(self) -> None:
        """Last resort (close, a failed driver thread): kill every worker this pool ever started that
        may still run, everything they started, and fail whatever is still waiting."""
        with self._processes_lock:
            processes = list(self._processes.values())
            self._processes.clear()
            swept, self._swept = self._swept, True
        if not swept and self._next_wid:
            pids = [p.pid for p, _ in processes if p.pid and p.exitcode is None]
            procs.kill_worker_processes(pids, [f"{self._token}-"], prefix=True)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        for process, _ in processes:
            process.join(5)
        detail = f"the worker pool failed: {self._failure}" if self._failure else "the pool was closed"
        for worker in list(self._workers.values()):
            for entry in list(worker.inflight.values()):
                if not entry.future.done():
                    with contextlib.suppress(concurrent.futures.InvalidStateError):
                        entry.future.set_result(failed_episode(entry.spec, Termination.INFRA_ERROR, detail))
        self._fail_pending(detail)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    known = {EXIT_START_FAILED: ": it could not start", EXIT_PROTOCOL: ": its channel from the pool was corrupted"}
    return f"exit code {code}{known.get(code, '')}"


_LIVE_POOLS: weakref.WeakSet[StrandsProcessPool] = weakref.WeakSet()


@atexit.register
def _close_all_pools() -> None:  # no orphan workers when the interpreter exits
    for pool in list(_LIVE_POOLS):
        with contextlib.suppress(Exception):
            pool.close(timeout_s=5)
