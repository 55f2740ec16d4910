"""verl 0.9.1's own trainer, end to end on CPU, from the project's launch command (skipped without verl 0.9).

``python -m verl.trainer.main_ppo`` with the overrides ``DRY_RUN=1 examples/math/train_math_verl.sh`` prints
(the Strands arithmetic env, a tiny random Qwen2 built offline) plus agentboost's CPU layer
(:mod:`agentboost.integration.verl_cpu`), through the reusable harness
:mod:`agentboost.integration.verl_cpu_run`. Each mode runs 2 GRPO steps and checks: exit code 0; a
checkpoint per step, resumable (a 3rd step after a restart); the weights moved; the rollout server's
log-probs match the actor's in step 2 (the updated weights reached the server); the ``strands/*``
metrics at every training step and the Strands validation metrics in the trainer's logged metrics
(file logger and console); validation ran; verl's model merger exports the checkpoint to a HF model.

CI runs this file in its second venv (verl 0.9.1, ``.ci/run``); ~2.5 min per run on 2 cores.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def _verl_version() -> str | None:
    if importlib.util.find_spec("verl") is None:
        return None
    import verl

    return str(verl.__version__)


pytestmark = [
    pytest.mark.verl09,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (_verl_version() or "").startswith("0.9."),
        reason=f"needs verl 0.9.x (its own environment, constraints/verl09.txt); installed: {_verl_version()}",
    ),
]

STRANDS_STEP_KEYS = (
    "strands/masked_fraction", "strands/batch_cut_fraction", "strands/episodes",
    *(f"strands/termination/{t}" for t in ("completed", "max_turns", "max_tokens", "context_overflow", "timeout",
                                           "tool_error", "infra_error")),
    "strands/tool_calls_per_episode", "strands/tool_errors_per_episode", "strands/tool_error_rate",
    "strands/parse_errors_per_episode", "strands/model_calls_per_episode",
    "strands/latency_s/mean", "strands/latency_s/max", "strands/model_s/mean", "strands/tool_s/mean",
)  # fmt: skip
STRANDS_VAL_KEYS = ("strands_masked", "strands_termination_completed", "strands_tool_calls", "strands_tool_errors",
                    "strands_parse_errors", "strands_latency_s", "strands_model_s")  # fmt: skip


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Any:
    from agentboost.integration.verl_cpu_run import prepare_assets

    return prepare_assets(tmp_path_factory.mktemp("verl-cpu-assets"))


def run(assets: Any, workdir: Path, mode: str, steps: int = 2, **kwargs: Any) -> Any:
    from agentboost.integration.verl_cpu_run import CpuRunSpec, run_main_ppo

    result = run_main_ppo(CpuRunSpec(workdir=workdir, assets=assets, steps=steps, mode=mode, **kwargs))
    assert result.returncode == 0, result.log_tail()
    return result


@pytest.fixture(scope="module")
def sync_run(assets, tmp_path_factory) -> Any:
    return run(assets, tmp_path_factory.mktemp("verl-cpu-sync"), "sync")


def check_steps(result: Any, n: int = 2, *, on_policy: bool = True) -> None:
    steps = result.steps
    assert [s["training/global_step"] for s in steps] == list(range(1, n + 1)), result.log_tail()
    assert result.checkpoints() == list(range(1, n + 1))
    # Step 1 moved the weights (a non-zero gradient: the token-hash reward splits every GRPO group) ...
    assert steps[0]["actor/grad_norm"] > 0
    # ... and step 2's rollouts came from them: the server's log-probs are the ones the actor recomputes
    # (verl's rollout_corr/*: per-sequence mean log-prob gaps and their KL; rollout_probs_diff_*: probabilities).
    second = steps[1]
    assert second["training/rollout_probs_diff_valid"] == 1.0 and second["training/rollout_probs_diff_max"] < 1e-3
    gaps = [second["rollout_corr/log_ppl_diff_max"], second["rollout_corr/log_ppl_diff_min"], second["rollout_corr/kl"]]
    if on_policy:
        assert max(abs(g) for g in gaps) < 1e-3, gaps
    else:
        # The async modes train on rollouts one weight version old (warm-up batch): step 2's were sampled with
        # the initial weights while step 1 trained, so the actor's log-probs differ by step 1's update. The server
        # tags every output with the version it holds: step 3's rollouts at most one version behind means the
        # servers did hold step 1's weights (a server never synced would be 2 behind).
        assert all(s["training/off_policy/trajectory_staleness_worst/max"] <= 1 for s in steps), steps
        assert steps[-1]["training/off_policy/trajectory_staleness/max"] <= 1
    for step in steps:  # Strands metrics at every training step, in the trainer's own logger
        missing = [k for k in STRANDS_STEP_KEYS if k not in step]
        assert not missing, missing
        assert step["strands/episodes"] == 8  # TRAIN_BATCH_SIZE 2 x ROLLOUT_N 4
        assert sum(v for k, v in step.items() if k.startswith("strands/termination/")) == pytest.approx(1.0)
        assert step["strands/latency_s/mean"] > 0 and step["strands/model_s/mean"] > 0
    # validation ran (TEST_FREQ) and carries the Strands metrics of its episodes
    [validation] = result.validations
    for key in STRANDS_VAL_KEYS:
        assert f"val-aux/strands/{key}/mean@1" in validation, sorted(validation)
    assert "val-core/strands/reward/mean@1" in validation
    console = result.log_path.read_text(errors="replace")
    assert "strands/masked_fraction:" in console and "val-aux/strands/strands_masked/mean@1:" in console


def test_sync_trains_two_steps_with_strands_metrics_from_the_launch_command(sync_run) -> None:
    check_steps(sync_run)
    command = sync_run.command
    assert command[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=strands_agent" in command  # the launch script's
    assert "trainer.v1.sampler.custom_sampler.name=StrandsReplayBuffer" in command
    assert "data.val_batch_size=2" in command


def test_checkpoint_resumes_for_a_third_step_and_exports_to_hf(sync_run, assets) -> None:
    from safetensors.torch import load_file

    third = run(assets, sync_run.spec.workdir, "sync", steps=3, resume=True)
    assert [s["training/global_step"] for s in third.steps] == [3], third.log_tail()
    assert third.checkpoints() == [1, 2, 3]
    # verl's model merger turns the FSDP checkpoint into a HF model (docs/gpu-verl.md: export)
    exported = {}
    for step in (1, 3):
        target = sync_run.spec.workdir / f"hf-{step}"
        actor = sync_run.checkpoint_dir / f"global_step_{step}" / "actor"
        done = subprocess.run(
            [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
             "--local_dir", str(actor), "--target_dir", str(target)],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        exported[step] = load_file(str(target / "model.safetensors"))
    initial = load_file(str(assets.model_dir / "model.safetensors"))
    assert set(exported[1]) >= set(initial) - {"lm_head.weight"}
    moved = [name for name, tensor in initial.items() if name in exported[1] and not tensor.equal(exported[1][name])]
    assert len(moved) >= len(initial) // 2, moved  # the update moved the weights ...
    assert any(not exported[1][n].equal(exported[3][n]) for n in moved)  # ... and the resumed run kept training
    # Step 1's update moves log-probs far more than the 1e-3 gap allowed in step 2: a server left on the
    # initial weights would have failed check_two_steps.
    assert logprob_shift(assets.model_dir, sync_run.spec.workdir / "hf-1") > 1e-2


def logprob_shift(before: Path, after: Path) -> float:
    """Largest change of a token's log-prob between two HF models on a fixed sequence."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.arange(100, 164).unsqueeze(0)
    logprobs = []
    for path in (before, after):
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        logprobs.append(torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1))
    return float((logprobs[0] - logprobs[1]).abs().max())


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_async_modes_train_with_strands_metrics(assets, tmp_path, mode: str) -> None:
    result = run(assets, tmp_path, mode, steps=3, test_freq=3)
    check_steps(result, 3, on_policy=False)


def test_episodes_of_one_and_three_trajectories_train_in_one_optimizer_step(assets, tmp_path) -> None:
    """README, "Agents that rewrite their history, and multi-agent runs": every other episode is three trajectories
    (two helper agents on the same model answer first: agentboost.testing.agents.one_or_three_trajectories), so
    a batch of 2 prompts x 4 samples is more rows than verl's mini-batch of MINI_BATCH_SIZE (2) x ROLLOUT_N rows.
    The loop returns one output per trajectory, verl's V1 trainer stores and trains them all, agentboost_grpo
    counts each episode once in its group, and the update is the one optimizer step MINI_BATCH_SIZE =
    TRAIN_BATCH_SIZE asks for, over every row (verl alone takes a second one over the rows past the first 8,
    whose tokens then weigh more): every loss token of the batch weighs the same. Strands metrics per episode."""
    mixed = {"agent_args": {"agent_factory": "agentboost.testing.agents:one_or_three_trajectories"}}
    result = run(assets, tmp_path, "sync", strands=mixed, knobs={"MAX_TURNS": "3"})
    steps = result.steps
    assert [s["training/global_step"] for s in steps] == [1, 2], result.log_tail()
    for step in steps:
        assert step["strands/episodes"] == pytest.approx(8)  # TRAIN_BATCH_SIZE 2 x ROLLOUT_N 4 episodes ...
        assert 1 < step["strands/trajectories_per_episode"] < 3 and step["strands/rows"] > 8  # ... of 1 and 3 rows
        assert step["strands/optimizer_steps_total"] == 1  # one mini-batch: every row, no no-op row (1 rank)
        assert step["strands/update_rows_total"] == step["strands/rows"] and step["strands/padding_rows_total"] == 0
    # verl's own optimizer took one step per training step (Adam's step count, saved with each checkpoint)
    assert [adam_steps(result.checkpoint_dir / f"global_step_{n}" / "actor") for n in (1, 2)] == [1, 2]
    assert steps[0]["actor/grad_norm"] > 0
    second = steps[1]  # step 2's rollouts (every agent's calls) came from step 1's weights
    assert second["training/rollout_probs_diff_max"] < 1e-3
    log = result.log_path.read_text(errors="replace")
    assert "agentboost_grpo: one advantage per episode" in log  # the trainer used the per-episode wrapper


def adam_steps(actor_dir: Path) -> int:
    """The optimizer steps taken so far, as the actor checkpoint's optimizer state records them."""
    import torch

    [path] = actor_dir.glob("optim_world_size_1_rank_0.pt")
    state = torch.load(path, map_location="cpu", weights_only=False)["state"]
    counts = {int(param["step"]) for param in state.values()}
    assert len(counts) == 1, counts
    return counts.pop()
