"""The worker pool: crashes, hangs, memory blow-ups and timeouts come back as typed episodes, the
pool replaces the worker and keeps serving; tools may print; sync and async APIs; no orphans."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from agentboost.backends.factory import ModelSpec
from agentboost.pool import PoolConfig, StrandsProcessPool
from agentboost.rollout import RolloutSettings
from agentboost.runs import AgentSpec, EpisodeSpec
from agentboost.types import Budget, Termination

MODEL = ModelSpec(backend="py:tests.pool_tools:directed_backend", tokenizer="offline:qwen2.5")
AGENT = AgentSpec(env_args={"tools": "tests.pool_tools:tools_for", "reward_fn": "tests.pool_tools:reward"})


def spec(call: str = "", args: dict | None = None, *, wall_s: float = 60.0, tag: str = "") -> EpisodeSpec:
    prompt = f"CALL {call} {json.dumps(args or {})}" if call else "just answer"
    settings = RolloutSettings(budget=Budget(wall_clock_s=wall_s, tool_timeout_s=None)).to_dict()
    return EpisodeSpec(row={"prompt": prompt}, agent=AGENT, model=MODEL, settings=settings,
                       episode_id=f"{call or 'plain'}-{tag}-{time.monotonic_ns()}")  # fmt: skip


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().split()[2] != "Z":
                alive.append(pid)
    return alive


@pytest.fixture(scope="module")
def pool():
    config = PoolConfig(workers=2, max_in_flight=32, heartbeat_timeout_s=8.0, memory_limit_mb=900,
                        env={"AGENTBOOST_TEST_SECRET": "s3cr3t-token"})  # fmt: skip
    with StrandsProcessPool(config) as p:
        yield p


def test_runs_episodes_and_reports_stats(pool) -> None:
    episodes = pool.run_all([spec(tag=str(i)) for i in range(12)])
    failed = [(e.id, e.termination.value, e.termination_detail) for e in episodes if e.termination.value != "completed"]
    assert not failed, failed
    assert all(e.reward == 1.0 for e in episodes)
    stats = pool.stats()
    assert stats["completed"] >= 12 and stats["ready_workers"] == 2 and stats["in_flight"] == 0


def test_worker_crash_mid_episode(pool) -> None:
    before = pool.stats()["restarts"].get("crash", 0)
    specs = [spec("crash_worker", tag="x")] + [spec(tag=str(i)) for i in range(6)]
    episodes = pool.run_all(specs)
    assert len(episodes) == len(specs)  # nothing lost
    crashed = episodes[0]
    assert crashed.termination is Termination.INFRA_ERROR and "died (killed by SIGKILL)" in crashed.termination_detail
    assert crashed.masked and crashed.reward == 0.0 and sum(crashed.response_mask) == 0
    for e in episodes[1:]:  # collateral on the same worker is typed too, never dropped
        assert e.termination in (Termination.COMPLETED, Termination.INFRA_ERROR)
        assert e.masked == (e.termination is Termination.INFRA_ERROR)
    assert pool.stats()["restarts"]["crash"] == before + 1
    after = pool.run_all([spec(tag=f"after{i}") for i in range(6)])
    assert all(e.termination is Termination.COMPLETED for e in after)


def test_worker_hang_is_detected(pool) -> None:
    started = time.monotonic()
    [episode] = pool.run_all([spec("block_loop", {"seconds": 60}, tag="hang")])
    assert time.monotonic() - started < 30
    assert episode.termination is Termination.INFRA_ERROR and "stopped responding" in episode.termination_detail
    assert pool.stats()["restarts"].get("hang", 0) >= 1
    assert pool.run_all([spec(tag="post-hang")])[0].termination is Termination.COMPLETED


def test_memory_blowup_is_contained(pool) -> None:
    [episode] = pool.run_all([spec("eat_memory", {"mb": 1500}, tag="mem")])
    assert episode.termination is Termination.INFRA_ERROR and "MB > limit" in episode.termination_detail
    assert episode.masked
    assert pool.run_all([spec(tag="post-mem")])[0].termination is Termination.COMPLETED


def test_episode_timeout_inside_a_healthy_worker(pool) -> None:
    restarts = dict(pool.stats()["restarts"])
    [episode] = pool.run_all([spec("slow", {"seconds": 8}, wall_s=1.0, tag="slow")])
    assert episode.termination is Termination.TIMEOUT
    assert not episode.masked  # its own tool used the time up: the policy's ending, rewarded (0 here)
    assert pool.stats()["restarts"] == restarts  # the worker handled it; nothing was killed


def test_stray_prints_do_not_corrupt_ipc(pool) -> None:
    episodes = pool.run_all([spec("noisy", {"text": "hello " * 1000}, tag=str(i)) for i in range(4)])
    assert all(e.termination is Termination.COMPLETED and e.reward == 1.0 for e in episodes)
    assert all(e.tools["noisy"].calls == 1 for e in episodes)


HOSTILE = {
    "read_secret": ("import os\nprint('ok' if 'AGENTBOOST_TEST_SECRET' not in os.environ else 'LEAK')", "s3cr3t"),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", None),
    "memory_bomb": ("x = bytearray(8 * 1024**3)\nprint('ok')", None),
    "infinite_loop": ("while True:\n    pass", None),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('ok')", None),
}


def test_hostile_code_in_the_code_tool_does_not_hurt_the_pool(pool) -> None:
    specs = [spec("run_tests", {"code": code}, tag=name) for name, (code, _) in HOSTILE.items()]
    episodes = pool.run_all(specs)
    for (name, (_, secret)), episode in zip(HOSTILE.items(), episodes, strict=True):
        assert episode.termination is Termination.COMPLETED, (name, episode.termination_detail)
        results = [
            item["text"]
            for m in episode.messages
            for block in m["content"]
            if "toolResult" in block
            for item in block["toolResult"]["content"]
        ]
        assert len(results) == 1 and results[0].startswith("Public tests:"), (name, results)
        if secret:
            assert secret not in results[0] and "LEAK" not in results[0]
            assert "Public tests: 1/1 passed." in results[0]
    assert pool.stats()["restarts"].get("crash", 0) <= 1  # only the deliberate crash test's restart
    assert all(e.termination is Termination.COMPLETED for e in pool.run_all([spec(tag=f"post{i}") for i in range(4)]))


def test_async_api_across_event_loops(pool) -> None:
    async def step(k: int):
        done = []
        episodes = await pool.map([spec(tag=f"loop{k}-{i}") for i in range(3)], on_done=done.append)
        return episodes, done

    for k in range(3):  # a fresh event loop per step, as rLLM's trainer does
        episodes, done = asyncio.run(step(k))
        assert len(episodes) == len(done) == 3
        assert all(e.termination is Termination.COMPLETED for e in episodes)


def test_close_leaves_no_orphans() -> None:
    with StrandsProcessPool(PoolConfig(workers=2)) as pool:
        pool.run_all([spec(tag="orphan-check")])
        pids = [w["pid"] for w in pool.stats()["per_worker"].values()]
        assert len(_pids_alive(pids)) == 2
        pending = [pool.submit(spec("slow", {"seconds": 30}, tag=str(i))) for i in range(3)]
    assert _pids_alive(pids) == []
    for future in pending:  # in flight at close: typed, not lost
        assert future.result(timeout=5).termination is Termination.INFRA_ERROR
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(spec())
