"""The evaluator: unbiased pass@k / pass^k, the resumable store, and ``agentboost eval`` end to end."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentboost.episode import Episode
from agentboost.evaluation import EpisodeStore, ResumeMismatch, build_report, pass_at_k, pass_hat_k
from agentboost.evaluation.store import StoreLocked
from agentboost.types import Termination
from tests.eval_tools import rows, succeeds

ROOT = Path(__file__).resolve().parents[1]


# -- estimators ---------------------------------------------------------------------------------
def _brute(n: int, c: int, k: int) -> tuple[float, float]:
    """Average over every k-subset of n samples of which the first c are correct."""
    subsets = list(itertools.combinations(range(n), k))
    any_ok = sum(any(i < c for i in s) for s in subsets) / len(subsets)
    all_ok = sum(all(i < c for i in s) for s in subsets) / len(subsets)
    return any_ok, all_ok


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_estimators_equal_the_subset_average(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    any_ok, all_ok = _brute(n, c, k)
    assert pass_at_k(n, c, k) == pytest.approx(any_ok, abs=1e-12)
    assert pass_hat_k(n, c, k) == pytest.approx(all_ok, abs=1e-12)


def test_estimators_at_scale_and_bad_input() -> None:
    assert pass_at_k(200, 13, 100) == pytest.approx(1 - math.comb(187, 100) / math.comb(200, 100), rel=1e-9)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3) and pass_hat_k(10, 3, 1) == pytest.approx(0.3)
    for bad in [(4, 1, 5), (4, 5, 1), (0, 0, 1), (4, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


# -- store --------------------------------------------------------------------------------------
def _episode(eid: str, ok: bool) -> Episode:
    e = Episode(id=eid, task_id=eid.split(":", maxsplit=1)[0], termination=Termination.COMPLETED)
    e.reward, e.is_correct = float(ok), ok
    return e


def test_store_resumes_discards_a_torn_line_and_refuses_corruption_and_other_settings(tmp_path) -> None:
    fp = {"data": "abc", "n": 2}
    with EpisodeStore(tmp_path, fp) as store:
        store.add(_episode("a:0", True))
        store.add(_episode("a:1", False))
        with pytest.raises(StoreLocked):
            EpisodeStore(tmp_path, fp).open()
    path = tmp_path / "episodes.jsonl"
    with open(path, "a") as fh:
        fh.write(_episode("b:0", True).to_json()[:40])  # killed mid-write
    with EpisodeStore(tmp_path, fp) as store:
        assert sorted(store.episodes) == ["a:0", "a:1"] and store.discarded_partial_line
        store.add(_episode("a:1", True))  # a retried episode: the last record wins
    with EpisodeStore(tmp_path, fp) as store:
        assert store.episodes["a:1"].is_correct is True and len(path.read_text().splitlines()) == 3
    with pytest.raises(ResumeMismatch, match="n: stored 2, now 3"):
        EpisodeStore(tmp_path, {"data": "abc", "n": 3}).open()
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    with pytest.raises(ValueError, match="corrupt record"):
        EpisodeStore(tmp_path, fp).open()
    with EpisodeStore(tmp_path, {"other": 1}, overwrite=True) as store:
        assert store.episodes == {} and not path.read_text()


def test_store_names_each_changed_setting_and_lets_where_change(tmp_path, caplog) -> None:
    fp = {"settings": {"sampling": {"temperature": 1.0, "top_p": 1.0}}, "where": {"backend": "http://a:8000"}}
    with EpisodeStore(tmp_path, fp) as store:
        store.add(_episode("a:0", True))
    moved = {**fp, "where": {"backend": "http://b:9000"}}
    with EpisodeStore(tmp_path, moved) as store:  # the server moved: resumed, with a warning
        assert list(store.episodes) == ["a:0"]
    assert "where.backend" in caplog.text
    hotter = {**moved, "settings": {"sampling": {"temperature": 0.7, "top_p": 1.0}}}
    with pytest.raises(ResumeMismatch, match=r"settings\.sampling\.temperature: stored 1\.0, now 0\.7"):
        EpisodeStore(tmp_path, hotter).open()
    EpisodeStore(tmp_path, moved).open().close()  # the refusal released the lock
    (tmp_path / "report.png").write_bytes(b"stale")
    with EpisodeStore(tmp_path, hotter, overwrite=True) as store:
        assert store.episodes == {} and not (tmp_path / "report.png").exists()


def test_report_counts_invalid_tool_calls_and_infra_errors() -> None:
    bad = _episode("t0:0", False)
    bad.unknown_tool_calls, bad.parse_errors = 1, 2
    broken = _episode("t0:1", False)
    broken.termination = Termination.INFRA_ERROR
    data = build_report([bad, broken, _episode("t0:2", True)], ks=[1]).data
    unknown = {"calls": 1, "ok": 0, "errors": 1, "timeouts": 0, "truncated": 0, "total_time_s": 0.0, "mean_time_s": 0.0}
    assert data["tool_outcomes"]["(unknown tool)"] == unknown
    assert data["tool_outcomes"]["(unparseable call)"]["errors"] == 2
    assert data["tool_calls_per_episode_histogram"]["3"] == 1 and data["tool_calls_per_episode_histogram"]["0"] == 2
    assert data["infra_errors"] == 1
    from agentboost.evaluation.report import EvalReport

    assert "1 episodes ended in `infra_error`" in EvalReport(data).to_markdown()


def test_report_counts_successes_per_task() -> None:
    episodes = [_episode(f"t{i}:{k}", succeeds(f"t{i}:{k}")) for i in range(6) for k in range(3)]
    data = build_report(episodes, ks=[1, 2, 3]).data
    # each task has exactly one success among its 3 samples
    assert data["pass_at_k"] == {"1": pytest.approx(1 / 3), "2": pytest.approx(2 / 3), "3": pytest.approx(1.0)}
    assert data["pass_hat_k"]["1"] == pytest.approx(1 / 3) and data["pass_hat_k"]["2"] == 0.0
    assert data["tasks"] == 6 and data["samples_per_task"] == 3


def test_summaries_count_trajectories_of_episodes_that_split(qwen25_template, tmp_path) -> None:
    from agentboost.evaluation.compare import compare_runs
    from agentboost.evaluation.report import EvalReport
    from agentboost.report import markdown, summarize
    from tests.viewer_episodes import make_episodes, make_multi_trajectory_episodes, write_jsonl

    single = make_episodes(qwen25_template)[:3]  # one trajectory each
    multi = make_multi_trajectory_episodes(qwen25_template)  # 6, 2 and 3 trajectories
    summary = summarize(single + multi)  # counts every trajectory's tokens; reads no single-trajectory view
    assert summary["trajectories_mean"] == pytest.approx((3 + 6 + 2 + 3) / 6)
    assert summary["multi_trajectory_episodes"] == 3
    assert summary["rerendered_tokens_mean"] == pytest.approx(sum(e.rerendered_tokens for e in multi) / 6)
    assert summary["rerendered_tokens_mean"] > 0
    assert summary["prompt_tokens_mean"] == pytest.approx(sum(e.num_prompt_tokens for e in single + multi) / 6)
    text = markdown(summary)
    assert "| trajectories / episode | 2.33 (3 episodes of several) |" in text
    assert "| re-rendered prompt tokens / episode |" in text
    assert "trajectories" not in markdown(summarize(single))  # runs that never split read as before
    report = build_report(single + multi, ks=[1]).data
    assert report["summary"]["multi_trajectory_episodes"] == 3
    assert "| trajectories / episode |" in EvalReport(report).to_markdown()

    for name, episodes in (("a", single + multi[:1]), ("b", single + multi[:1]), ("c", single)):
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "episodes.jsonl", episodes)
    plain = compare_runs(tmp_path / "c", tmp_path / "c").data["metrics"]
    assert not [row for row in plain if "trajector" in row["metric"] or "re-rendered" in row["metric"]]
    metrics = {row["metric"]: row for row in compare_runs(tmp_path / "a", tmp_path / "b").data["metrics"]}
    row = metrics["trajectories / episode"]
    assert row["a"] == pytest.approx(9 / 4) and row["delta"] == 0 and "re-rendered prompt tokens / episode" in metrics


# -- end to end: kill and resume ----------------------------------------------------------------
def _eval_cmd(data: Path, out: Path, n: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "agentboost.cli.main", "eval", "--env", "tests.eval_tools:LoggedEnv",
            "--data", str(data), "--n", str(n), "--k", "1", "--k", str(n), "--out", str(out),
            "--backend", "py:tests.pool_tools:directed_backend", "--tokenizer", "offline:qwen2.5",
            "--workers", str(workers), "--concurrency", "2", "--no-plots"]  # fmt: skip


def _records(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.endswith("}")]


def test_eval_resumes_after_a_kill_without_recomputing(tmp_path) -> None:
    data, out, log = tmp_path / "data.jsonl", tmp_path / "out", tmp_path / "ran.log"
    n, tasks = 3, 8
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(tasks, seconds=0.3)))
    env = {**os.environ, "AGENTBOOST_TEST_EVAL_LOG": str(log), "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(_eval_cmd(data, out, n, workers=1), cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while len(_records(out / "episodes.jsonl")) < 6:
        assert first.poll() is None, first.communicate()[1].decode()[-3000:]
        assert time.monotonic() < deadline, "the first run stored too few episodes in time"
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)  # the whole group: driver and pool workers
    first.wait()
    stored_before = set(_records(out / "episodes.jsonl"))
    assert 6 <= len(stored_before) < n * tasks
    ran_before = log.read_text().splitlines()

    second = subprocess.run(_eval_cmd(data, out, n, workers=1), cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{len(stored_before)} of {n * tasks} episodes already stored" in second.stderr
    ran_after = log.read_text().splitlines()[len(ran_before) :]
    assert not set(ran_after) & stored_before  # nothing finished was recomputed
    final = _records(out / "episodes.jsonl")
    assert sorted(set(final)) == sorted(f"t{i}:{k}" for i in range(tasks) for k in range(n))  # nothing lost
    assert len(final) == len(set(final))
    report = json.loads((out / "report.json").read_text())
    expected = [sum(succeeds(f"t{i}:{k}") for k in range(n)) for i in range(tasks)]
    assert report["pass_at_k"]["1"] == pytest.approx(sum(expected) / (n * tasks))
    assert report["pass_at_k"][str(n)] == pytest.approx(sum(c > 0 for c in expected) / tasks)
    assert report["tool_outcomes"]["slow"]["calls"] == n * tasks and "| slow |" in (out / "report.md").read_text()

    # Same command once more: everything is stored, nothing runs. Other settings: refused.
    third = subprocess.run(_eval_cmd(data, out, n, workers=0), cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert third.returncode == 0 and len(log.read_text().splitlines()) == len(ran_before) + len(ran_after)
    other = subprocess.run(_eval_cmd(data, out, n + 1, workers=0), cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert other.returncode == 2 and "different settings" in other.stderr and "n: stored 3, now 4" in other.stderr
    assert "Traceback" not in other.stderr


def _run_eval(args: list[str], env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentboost.cli.main", "eval", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_eval_stops_at_once_when_every_episode_fails_and_clears_the_directory(tmp_path) -> None:
    data, out = tmp_path / "data.jsonl", tmp_path / "out"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(6, seconds=0.0)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = ["--env", "tests.eval_tools:FlakyEnv", "--data", str(data), "--n", "3", "--out", str(out),
              "--backend", "py:tests.pool_tools:directed_backend", "--workers", "0", "--no-plots"]  # fmt: skip
    # a wrong tokenizer path is bad input, found before anything runs or is written
    missing = _run_eval([*common, "--tokenizer", str(tmp_path / "no-such-tokenizer")], env)
    assert missing.returncode == 2, missing.stderr[-2000:]
    assert "tokenizer directory" in missing.stderr and "no-such-tokenizer" in missing.stderr
    assert not out.exists()
    # a failure that shows only while episodes run (the reward service is down for every task): stop, clear
    broken = _run_eval([*common, "--tokenizer", "offline:qwen2.5"],
                       {**env, "AGENTBOOST_TEST_FLAKY": ",".join(f"t{i}" for i in range(6))})  # fmt: skip
    assert broken.returncode == 3, broken.stderr[-2000:]
    assert "the first 8 episodes ended in infra_error" in broken.stderr and "cleared" in broken.stderr
    assert "reward service unreachable" in broken.stderr and "Traceback" not in broken.stderr
    assert not (out / "episodes.jsonl").exists() and not (out / "manifest.json").exists()  # only failures: cleared
    fixed = _run_eval([*common, "--tokenizer", "offline:qwen2.5"], env)  # other settings: not refused
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert len(_records(out / "episodes.jsonl")) == 18


def test_eval_reports_infra_errors_exits_3_and_retries_them(tmp_path) -> None:
    data, out = tmp_path / "data.jsonl", tmp_path / "out"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(4, seconds=0.0)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTBOOST_TEST_FLAKY": "t1"}
    common = ["--env", "tests.eval_tools:FlakyEnv", "--data", str(data), "--n", "2", "--out", str(out),
              "--backend", "py:tests.pool_tools:directed_backend", "--tokenizer", "offline:qwen2.5",
              "--workers", "0", "--no-plots"]  # fmt: skip
    first = _run_eval(common, env)
    assert first.returncode == 3, first.stderr[-2000:]
    assert "2 of 8 episodes ended in infra_error" in first.stderr and "reward service unreachable" in first.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["infra_errors"] == 2 and "Warning: 2 episodes" in (out / "report.md").read_text()
    env.pop("AGENTBOOST_TEST_FLAKY")
    second = _run_eval([*common, "--retry-failed"], env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert json.loads((out / "report.json").read_text())["infra_errors"] == 0


def test_eval_input_errors_are_one_line(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    missing = _run_eval(
        ["--example", "math", "--data", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")], env
    )
    assert missing.returncode == 2 and "nope.jsonl" in missing.stderr and "Traceback" not in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n{not json\n')
    malformed = _run_eval(["--example", "math", "--data", str(bad), "--out", str(tmp_path / "o")], env)
    assert malformed.returncode == 2 and "Traceback" not in malformed.stderr, malformed.stderr[-2000:]
