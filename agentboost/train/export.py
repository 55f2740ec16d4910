"""``agentboost export RUN_DIR OUT``: a training run as a Hugging Face model directory that transformers and
vLLM load (``vllm serve OUT``, then ``agentboost eval --backend http://...``).

The weights come from the run's ``final_model/`` (a finished run) or its latest ``checkpoint/`` (any run
that saved one); the model is rebuilt from what the run recorded (``run.json``: the base directory, the
LoRA settings and the dtype; ``model_init/``: its config, generation config and tokenizer). LoRA adapters
are merged into the base weights (in float32, then cast), so the directory is a plain model:
``config.json``, safetensors weights, ``generation_config.json`` (the base model's: its end tokens and
sampling defaults) and the tokenizer with its chat template (the one the episodes were rendered with).
``agentboost_export.json`` says where it came from.

``verify`` checks the export against the model as it was trained (base plus unmerged adapters, float32),
on a probe prompt: the merged model before it is cast (a wrong merge fails), then the written directory
loaded back against what was written (a lost weight fails); the gap between the export and the trained
model is recorded and printed (cast to bfloat16 or float16, it includes the rounding).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .. import __version__
from .run import FINAL_MODEL, MODEL_INIT, RUN_RECORD, read_json

logger = logging.getLogger(__name__)

SOURCES = ("auto", "final", "checkpoint")
CHECKPOINT_WEIGHTS = Path("checkpoint") / "model_state.pt"
PROBE = [{"role": "user", "content": "What is 7*8?"}]
LOGIT_TOLERANCE = 1e-4
"""Largest logit difference :func:`export_run` accepts between two float32 models that must be equal, relative
to the largest logit (at least 1)."""


class ExportError(ValueError):
    """The run directory cannot be exported (nothing to export, a missing base model, ...)."""


def _has_model(directory: Path) -> bool:
    return (directory / "config.json").is_file() or (directory / "adapter_config.json").is_file()


def pick_source(run_dir: Path, source: str = "auto") -> str:
    """``final`` (``final_model/``) when the run finished, else ``checkpoint``; what was asked when it exists."""
    if source not in SOURCES:
        raise ExportError(f"--from must be one of {', '.join(SOURCES)}, got {source!r}")
    has_final = _has_model(run_dir / FINAL_MODEL)
    has_checkpoint = (run_dir / CHECKPOINT_WEIGHTS).is_file()
    if source == "auto":
        if has_final:
            return "final"
        if has_checkpoint:
            return "checkpoint"
        raise ExportError(f"{run_dir} holds no trained model: no {FINAL_MODEL}/ and no {CHECKPOINT_WEIGHTS}")
    if source == "final" and not has_final:
        raise ExportError(f"{run_dir} has no {FINAL_MODEL}/ (the run has not finished): use --from checkpoint")
    if source == "checkpoint" and not has_checkpoint:
        raise ExportError(f"{run_dir} has no {CHECKPOINT_WEIGHTS}")
    return source


def check_export(run_dir: str | Path, out: str | Path, *, source: str = "auto", overwrite: bool = False) -> str:
    """What :func:`export_run` checks before loading anything; returns the source it will use."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ExportError(f"{run_dir}: no such run directory")
    chosen = pick_source(run, source)
    record = read_json(run / RUN_RECORD).get("model") or {}
    lora = record.get("lora") or _adapter_config(run / FINAL_MODEL)
    if lora:
        base = record.get("base") or _adapter_config(run / FINAL_MODEL).get("base_model_name_or_path")
        if not base or not (Path(base) / "config.json").is_file():
            raise ExportError(f"{run_dir} trained LoRA adapters on {base!r}, which is not a model directory here")
    if chosen == "checkpoint" and not lora and not (run / MODEL_INIT / "config.json").is_file():
        raise ExportError(f"{run_dir} has no {MODEL_INIT}/ to rebuild its checkpoint on: use --from final")
    target = Path(out)
    if target.exists() and not target.is_dir():
        raise ExportError(f"{out} is a file")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ExportError(f"{out} exists and is not empty (--overwrite replaces it)")
    own = {run.resolve(), *(run.resolve() / name for name in (FINAL_MODEL, MODEL_INIT, "checkpoint", "warm_start"))}
    if target.resolve() in own:
        raise ExportError(f"{out} is the run's own directory: export to another one")
    return chosen


def _adapter_config(directory: Path) -> dict[str, Any]:
    return read_json(directory / "adapter_config.json")


def load_run_model(run_dir: str | Path, *, source: str = "auto") -> tuple[Any, Any, dict[str, Any]]:
    """The run's model as it was trained (float32; a LoRA run's base with its adapters, unmerged: a PEFT
    model), its tokenizer and what it was built from."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    run = Path(run_dir)
    chosen = pick_source(run, source)
    record = dict(read_json(run / RUN_RECORD).get("model") or {})
    final = run / FINAL_MODEL
    adapter = _adapter_config(final)
    lora = record.get("lora") or (adapter or None)
    tokenizer_dir = final if (final / "tokenizer_config.json").is_file() else run / MODEL_INIT
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    if lora:
        from peft import LoraConfig, PeftModel, get_peft_model

        base_dir = record.get("base") or adapter.get("base_model_name_or_path")
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), local_files_only=True, dtype=torch.float32)
        if chosen == "final":
            model = PeftModel.from_pretrained(base, str(final))
        else:
            model = get_peft_model(base, LoraConfig(**record["lora"]))
            _load_state(model, run / CHECKPOINT_WEIGHTS, strict=False)
    elif chosen == "final":
        model = AutoModelForCausalLM.from_pretrained(str(final), local_files_only=True, dtype=torch.float32)
    else:
        config = AutoConfig.from_pretrained(str(run / MODEL_INIT), local_files_only=True)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _load_state(model, run / CHECKPOINT_WEIGHTS, strict=True)
        # built from config.json, its generation config would be derived from it (one end token, no sampling
        # defaults): the base model's, recorded in model_init/ (runs before that: the base directory)
        for directory in (run / MODEL_INIT, Path(record.get("base") or run / MODEL_INIT)):
            if (directory / "generation_config.json").is_file():
                model.generation_config = GenerationConfig.from_pretrained(str(directory), local_files_only=True)
                break
    model.eval()
    info = {"run_dir": str(run.resolve()), "source": chosen, "base": record.get("base"), "lora": lora,
            "trained_dtype": record.get("dtype")}  # fmt: skip
    state = read_json(run / "checkpoint" / "trainer_state.json")
    if "step" in state:
        info["checkpoint_step"] = state["step"]
    return model, tokenizer, info


def _load_state(model: Any, path: Path, *, strict: bool) -> None:
    import torch

    state = {k: v.float() if v.is_floating_point() else v for k, v in torch.load(path, map_location="cpu").items()}
    result = model.load_state_dict(state, strict=strict)
    if not strict and result.unexpected_keys:
        raise ExportError(f"{path} holds weights the model does not have: {result.unexpected_keys[:3]}")


def probe_logits(model: Any, tokenizer: Any) -> Any:
    """The model's logits on a short chat prompt rendered by its own template (float32, CPU)."""
    import torch

    ids = tokenizer.apply_chat_template(PROBE, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    device = next(model.parameters()).device
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)], device=device)).logits.float().cpu()


def _gap(got: Any, expected: Any) -> float:
    """The largest logit difference (infinite when the shapes differ)."""
    return float((got - expected).abs().max()) if got.shape == expected.shape else float("inf")


def _tolerance(logits: Any) -> float:
    return LOGIT_TOLERANCE * max(1.0, float(logits.abs().max()))


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    source: str = "auto",
    dtype: str | None = None,
    overwrite: bool = False,
    verify: bool = True,
) -> dict[str, Any]:
    """Export the run (see module doc); returns what ``agentboost_export.json`` records."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = check_export(run_dir, out, source=source, overwrite=overwrite)
    model, tokenizer, info = load_run_model(run_dir, source=source)
    target_dtype = dtype or info.get("trained_dtype") or "float32"
    if target_dtype not in ("float32", "bfloat16", "float16"):
        raise ExportError(f"--dtype must be float32, bfloat16 or float16, got {target_dtype!r}")
    if not tokenizer.chat_template:
        raise ExportError(f"{run_dir}: the run's tokenizer has no chat template")
    trained = probe_logits(model, tokenizer) if verify else None  # the model as trained: adapters unmerged
    merge_gap = None
    if info.get("lora"):
        model = model.merge_and_unload()
        if trained is not None:
            merge_gap = _gap(probe_logits(model, tokenizer), trained)
            if merge_gap > _tolerance(trained):
                raise ExportError(f"merging the LoRA adapters changed the logits by {merge_gap:.3g}: a wrong merge")
    written = None
    if trained is not None:  # what will be written, as float32 (weights rounded to the dtype, buffers as loaded)
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(getattr(torch, target_dtype)))
        written = probe_logits(model, tokenizer)
    model = model.to(getattr(torch, target_dtype))
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        record = {**info, "dtype": target_dtype, "agentboost": __version__}
        if trained is not None and written is not None:
            reloaded = AutoModelForCausalLM.from_pretrained(str(staging), local_files_only=True, dtype=torch.float32)
            reloaded_tokenizer = AutoTokenizer.from_pretrained(str(staging), local_files_only=True)
            if reloaded_tokenizer.chat_template != tokenizer.chat_template:
                raise ExportError("the exported tokenizer lost its chat template")
            got = probe_logits(reloaded.eval(), reloaded_tokenizer)
            reload_gap = _gap(got, written)
            if reload_gap > _tolerance(written):
                raise ExportError(f"the exported model's logits differ from the model written by {reload_gap:.3g}")
            record["verified_max_logit_gap"] = _gap(got, trained)
            if merge_gap is not None:
                record["merge_max_logit_gap"] = merge_gap
        (staging / "agentboost_export.json").write_text(json.dumps(record, indent=2))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("exported %s (%s) to %s", run_dir, source, target)
    return record
