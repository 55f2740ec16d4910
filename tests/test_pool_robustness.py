"""The worker pool against hostile tools and broken workers (issue 14, items 13-16), with real
worker processes: a tool scribbling on the IPC channel, a tool result nothing can serialise,
processes that try to outlive their episode, workers that cannot start."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agentboost.episode import Episode, _jsonable
from agentboost.pool import PoolConfig, StrandsProcessPool
from agentboost.pool.wire import TO_POOL, FrameDecoder, unpack_episode
from agentboost.pool.worker import done_frame
from agentboost.runs import AgentSpec, EpisodeSpec, failed_episode
from agentboost.types import Termination
from tests.pool_tools import FAIL_FLAG_VAR
from tests.test_pool import _pids_alive, spec


def _tool_texts(episode: Episode) -> list[str]:
    return [
        item.get("text", "")
        for m in episode.messages
        for block in m["content"]
        if "toolResult" in block
        for item in block["toolResult"]["content"]
    ]


def _worker_pids(pool: StrandsProcessPool) -> list[int]:
    return [w["pid"] for w in pool.stats()["per_worker"].values()]


@pytest.fixture(scope="module")
def one_worker():
    """One worker, so that concurrent episodes share it."""
    with StrandsProcessPool(PoolConfig(workers=1, max_in_flight=4, heartbeat_timeout_s=8.0)) as pool:
        yield pool


def _wait_for_file(path: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.read_text()


def _wait_dead(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while _pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _pids_alive(pids)


# -- 13: bytes a tool writes into the channel ---------------------------------------------------
@pytest.mark.parametrize("mode", ["junk", "pickle"])
def test_a_tool_scribbling_on_the_channel_costs_only_its_worker(tmp_path, mode) -> None:
    evidence = tmp_path / "unpickled"
    with StrandsProcessPool(PoolConfig(workers=2, max_in_flight=8, heartbeat_timeout_s=8.0)) as pool:
        first_pids = _worker_pids(pool)
        scribbler = pool.submit(spec("scribble_ipc", {"mode": mode, "path": str(evidence)}, tag=mode))
        others = [pool.submit(spec(tag=f"{mode}{i}")) for i in range(4)]
        episode = scribbler.result(timeout=30)
        assert episode.termination is Termination.INFRA_ERROR and episode.masked and episode.reward == 0.0
        assert "malformed message" in episode.termination_detail
        for future in others:  # the other worker is untouched; collateral on the scribbler's is typed
            assert future.result(timeout=30).termination in (Termination.COMPLETED, Termination.INFRA_ERROR)
        assert pool.stats()["restarts"] == {"protocol": 1}
        after = pool.run_all([spec(tag=f"after-{mode}{i}") for i in range(4)])
        assert all(e.termination is Termination.COMPLETED for e in after)
        all_pids = first_pids + _worker_pids(pool)
    assert not evidence.exists()  # the forged pickle was never unpickled
    assert _wait_dead(all_pids) == []


def test_close_terminates_workers_when_the_driver_thread_died() -> None:
    pool = StrandsProcessPool(PoolConfig(workers=2, heartbeat_timeout_s=8.0)).start()
    pids = _worker_pids(pool)
    assert len(_pids_alive(pids)) == 2

    def broken_dispatch() -> None:  # stands in for any bug in the driver thread
        raise RuntimeError("driver bug")

    pool._dispatch = broken_dispatch  # type: ignore[method-assign]
    future = pool.submit(spec(tag="driver"))
    episode = future.result(timeout=20)  # not a hang: typed, naming the cause
    assert episode.termination is Termination.INFRA_ERROR and "driver bug" in episode.termination_detail
    with pytest.raises(RuntimeError, match="driver bug"):
        pool.submit(spec(tag="refused"))
    pool.close(timeout_s=5)
    assert _wait_dead(pids) == []


# -- 14: a result nothing can serialise -----------------------------------------------------------
def test_unserialisable_tool_result_is_that_episodes_failure_at_once(one_worker) -> None:
    pool = one_worker
    neighbour = pool.submit(spec("slow", {"seconds": 2}, tag="neighbour"))
    started = time.monotonic()
    episode = pool.submit(spec("unrepresentable", tag="unrepr")).result(timeout=30)
    assert time.monotonic() - started < 20  # not the episode deadline (60 s + grace)
    assert episode.termination is Termination.INFRA_ERROR and episode.masked
    assert neighbour.result(timeout=30).termination is Termination.COMPLETED  # same worker, unharmed
    assert pool.stats()["restarts"] == {}


def test_jsonable_never_raises() -> None:
    from tests.pool_tools import Unrepresentable

    cyclic: list = []
    cyclic.append(cyclic)
    value = _jsonable({"a": Unrepresentable(), Unrepresentable(): 1, "c": cyclic})
    json.dumps(value)
    assert value["a"] == "<unrepresentable Unrepresentable>"
    assert "<unrepresentable key Unrepresentable>" in value


def test_an_episode_json_cannot_hold_is_sent_as_infra_error() -> None:
    s = spec(tag="frame")
    episode = failed_episode(s, Termination.COMPLETED, "")
    episode.reward_metrics = {"bad": {1, 2}}  # a set: not JSON
    [message] = FrameDecoder(TO_POOL).feed(done_frame(s, episode))
    back = unpack_episode(message[2])
    assert message[1] == s.episode_id and back.termination is Termination.INFRA_ERROR
    assert "could not be serialised" in back.termination_detail


# -- issue 39, finding 4: a verdict no output can stall -------------------------------------------
CODE = AgentSpec(env_args={"tools": "tests.pool_tools:tools_for", "reward_fn": "agentboost.rewards.code:code_reward"})


def _code_spec(program: str, expected: str, *, call: str = "", tag: str) -> EpisodeSpec:
    answer = "ANSWER " + json.dumps(f"Here it is.\n```python\n{program}\n```")
    prompt = f"{answer} CALL {call}" if call else answer
    row = {"prompt": prompt, "tests": [{"input": "", "output": expected}]}
    return replace(spec(tag=tag), row=row, agent=CODE, episode_id=f"code-{tag}-{time.monotonic_ns()}")


def test_no_output_stalls_the_workers_loop_for_a_correct_neighbour(one_worker) -> None:
    """65,000 digits then ``x`` against a real took minutes on the worker's event loop (a quadratic
    pattern): its heartbeat stopped, the worker was killed and a correct neighbour ended infra_error. Now:
    the hostile answer scores 0 (trained on), the neighbour 1."""
    pool = one_worker
    neighbour = pool.submit(_code_spec("print(0.5)", "0.5\n", call='slow {"seconds": 3}', tag="neighbour"))
    hostile = pool.submit(_code_spec("print('1' * 65000 + 'x')", "0.5\n", tag="hostile")).result(timeout=120)
    assert hostile.termination is Termination.COMPLETED and not hostile.masked, hostile.termination_detail
    assert hostile.reward == 0.0 and hostile.reward_metrics["verdict_wrong_answer"] == 1.0, hostile.reward_metrics
    correct = neighbour.result(timeout=120)
    assert correct.termination is Termination.COMPLETED and correct.reward == 1.0, correct.termination_detail
    assert pool.stats()["restarts"] == {}


# -- 15: processes that try to outlive their episode --------------------------------------------
def _pids_in(episode: Episode) -> tuple[list[int], str]:
    [text] = _tool_texts(episode)
    match = re.fullmatch(r"pids ([\d ]+) (alive|dead)", text)
    assert match, text
    return [int(p) for p in match.group(1).split()], match.group(2)


@pytest.mark.parametrize("how", ["session", "double", "fork"])
def test_processes_die_with_their_episode_not_with_a_neighbours(one_worker, tmp_path, how) -> None:
    pool, pidfile = one_worker, tmp_path / "holder"
    holder = pool.submit(spec("spawn", {"how": how, "hold": 3, "pidfile": str(pidfile)}, tag=f"holder-{how}"))
    _wait_for_file(pidfile)  # the holder's process runs before the quick episode starts and ends
    quick = pool.submit(spec("spawn", {"how": how}, tag=f"quick-{how}")).result(timeout=30)
    quick_pids, quick_state = _pids_in(quick)
    assert quick_state == "alive"
    assert _pids_alive(quick_pids) == []  # gone by the time its episode came back
    held = holder.result(timeout=30)
    assert held.termination is Termination.COMPLETED
    held_pids, held_state = _pids_in(held)
    assert held_state == "alive", "the neighbour's end killed this episode's process"
    assert _pids_alive(held_pids) == []
    assert pool.stats()["restarts"] == {}


def test_processes_die_when_their_worker_crashes(tmp_path) -> None:
    pidfile = tmp_path / "pids"
    with StrandsProcessPool(PoolConfig(workers=1, heartbeat_timeout_s=8.0)) as pool:
        [episode] = pool.run_all([spec("spawn_then_crash", {"pidfile": str(pidfile)}, tag="crash")])
        assert episode.termination is Termination.INFRA_ERROR and "died" in episode.termination_detail
        pids = [int(p) for p in pidfile.read_text().split()]
        assert len(pids) == 2 and _pids_alive(pids) == []


def test_close_kills_processes_of_episodes_in_flight(tmp_path) -> None:
    pidfiles = [tmp_path / f"pids{i}" for i in range(2)]
    with StrandsProcessPool(PoolConfig(workers=1, heartbeat_timeout_s=8.0)) as pool:
        futures = [
            pool.submit(spec("spawn", {"how": how, "hold": 60, "pidfile": str(f)}, tag=how))
            for how, f in zip(["double", "fork"], pidfiles, strict=True)
        ]
        pids = [int(p) for f in pidfiles for p in _wait_for_file(f).split()]
        assert len(_pids_alive(pids)) == 2
    assert _wait_dead(pids) == []
    assert all(f.result(timeout=5).termination is Termination.INFRA_ERROR for f in futures)


# -- 16: workers that cannot start ----------------------------------------------------------------
def test_a_worker_that_cannot_start_fails_the_pool_with_its_error() -> None:
    config = PoolConfig(workers=2, preload=("tests.no_such_module_for_the_pool",), start_timeout_s=60.0)
    pool = StrandsProcessPool(config)
    started = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        pool.start()
    assert time.monotonic() - started < 45  # not the start timeout, not forever
    text = str(caught.value)
    assert "ModuleNotFoundError" in text and "tests.no_such_module_for_the_pool" in text
    assert sum(pool.stats_counters["restarts"].values()) <= config.max_start_failures
    with pytest.raises(RuntimeError):
        pool.submit(spec(tag="refused"))
    pool.close()


def test_a_crash_loop_after_start_fails_pending_episodes_and_submit(tmp_path) -> None:
    flag = tmp_path / "fail"
    config = PoolConfig(
        workers=1, max_in_flight=1, heartbeat_timeout_s=8.0, preload=("agentboost.runs", "tests.pool_tools"),
        env={FAIL_FLAG_VAR: str(flag)},
    )  # fmt: skip
    with StrandsProcessPool(config) as pool:
        assert pool.run_all([spec(tag="ok")])[0].termination is Termination.COMPLETED
        flag.write_text("broken")  # replacements now die on start
        crash = pool.submit(spec("crash_worker", tag="loop"))
        pending = pool.submit(spec(tag="pending"))  # waits: one episode in flight at most
        assert crash.result(timeout=60).termination is Termination.INFRA_ERROR
        episode = pending.result(timeout=60)
        assert episode.termination is Termination.INFRA_ERROR and episode.masked
        assert "refusing to start" in episode.termination_detail
        assert "in a row died before they were ready" in episode.termination_detail
        assert pool.failure and "refusing to start" in pool.failure
        with pytest.raises(RuntimeError, match="refusing to start"):
            pool.submit(spec(tag="refused"))
        assert pool.stats_counters["restarts"]["start_failure"] == config.max_start_failures
    assert not os.environ.get(FAIL_FLAG_VAR)
    assert Path(flag).exists()


def test_parquet_rows_are_json_values_so_they_reach_workers(tmp_path) -> None:
    """Specs travel as JSON: rows read from parquet are JSON values (timestamps as ISO strings), so a
    dataset that pickled fine before still reaches the workers."""
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentboost.data import load_rows

    table = pa.table({
        "prompt": ["What is 2 + 3?"],
        "created": [datetime.datetime(2026, 11, 23, 12, 0)],
        "price": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
        "blob": [b"\xff\x00"],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "rows.parquet")
    [row] = load_rows(tmp_path / "rows.parquet")
    assert row == {"prompt": "What is 2 + 3?", "created": "2026-11-23T12:00:00", "price": "1.50", "blob": "/wA="}
    json.dumps(row)
