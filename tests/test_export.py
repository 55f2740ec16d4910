"""``agentboost export`` checks what it writes against the model as trained: LoRA adapters unmerged (a wrong
merge is caught, the measured gap is printed), and a whole model exported from a checkpoint keeps the base
model's generation settings (issue 38 item 7). A tiny model directory."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from agentboost.cli.main import main  # noqa: E402
from agentboost.train.export import ExportError, export_run  # noqa: E402
from agentboost.train.models import lora_settings, model_record  # noqa: E402
from agentboost.train.run import record_model  # noqa: E402

from .tiny_model_dir import save_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """The tiny model with the generation settings a real base model ships (Qwen2.5's: two end tokens)."""
    from transformers import AutoTokenizer

    directory = save_tiny_model(tmp_path_factory.mktemp("base") / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    ends = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    settings = {"eos_token_id": ends, "pad_token_id": ends[1], "do_sample": True, "temperature": 0.7, "top_p": 0.8,
                "top_k": 20, "repetition_penalty": 1.05}  # fmt: skip
    (directory / "generation_config.json").write_text(json.dumps(settings))
    return directory


def _base(base_dir: Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), local_files_only=True, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(str(base_dir), local_files_only=True)


def _plan(run_dir: Path, record: dict) -> types.SimpleNamespace:
    run_dir.mkdir(parents=True)
    return types.SimpleNamespace(run_dir=run_dir, title="export test", config={}, model_record=record)


@pytest.fixture
def lora_run(tmp_path, base_dir) -> Path:
    """A finished LoRA run whose adapters move the logits (peft starts B at zero: a merge would not show)."""
    from peft import LoraConfig, get_peft_model

    base, tokenizer = _base(base_dir)
    lora = lora_settings(4)
    run_dir = tmp_path / "run"
    model = get_peft_model(base, LoraConfig(**lora))
    record_model(_plan(run_dir, model_record(str(base_dir), lora=lora, dtype="float32")), model, tokenizer)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.save_pretrained(str(run_dir / "final_model"))
    tokenizer.save_pretrained(str(run_dir / "final_model"))
    return run_dir


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_export_is_checked_against_the_unmerged_adapters_and_prints_the_measured_gap(lora_run, tmp_path, capsys,
                                                                                          dtype) -> None:  # fmt: skip
    out = tmp_path / "out"
    assert main(["export", str(lora_run), str(out), "--dtype", dtype]) == 0, capsys.readouterr().err[-2000:]
    record = json.loads((out / "agentboost_export.json").read_text())
    gap, merge_gap = record["verified_max_logit_gap"], record["merge_max_logit_gap"]
    # merged weights are not the adapters' arithmetic: the gap is small but real (it printed 0.0 when the
    # export was compared with the merged model itself)
    assert 0 < merge_gap < 1e-4, record
    if dtype == "float32":
        assert gap == merge_gap
    else:  # the rounding to bfloat16 too (a bfloat16 export failed its check: rotary buffers were compared cast)
        assert merge_gap < gap < 0.5, record
    assert f"logits within {gap:.2g} of the trained model's" in capsys.readouterr().out


def test_a_wrong_merge_is_caught(lora_run, tmp_path, monkeypatch) -> None:
    from peft.tuners.tuners_utils import BaseTuner

    monkeypatch.setattr(BaseTuner, "merge_and_unload", lambda self, *args, **kwargs: self.unload())  # no merge
    with pytest.raises(ExportError, match="merg"):
        export_run(lora_run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("recorded", [True, False], ids=["model_init", "base-dir"])
def test_a_whole_model_from_a_checkpoint_keeps_the_base_generation_config(base_dir, tmp_path, recorded) -> None:
    # rebuilt from config.json, the model's generation config was derived from it: one end token, no sampling
    # settings. Runs record it in model_init/ now; older runs have it in their base directory.
    model, tokenizer = _base(base_dir)
    run_dir = tmp_path / "run"
    record_model(_plan(run_dir, model_record(str(base_dir), lora=None, dtype="float32")), model, tokenizer)
    (run_dir / "checkpoint").mkdir()
    torch.save(model.state_dict(), run_dir / "checkpoint" / "model_state.pt")
    if not recorded:
        (run_dir / "model_init" / "generation_config.json").unlink()
    export_run(run_dir, tmp_path / "out", source="checkpoint")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    expected = json.loads((base_dir / "generation_config.json").read_text())
    assert {k: written.get(k) for k in expected} == expected
