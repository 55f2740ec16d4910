"""``agentboost train``, ``export``: an environment that is none of the examples trained from the command line
(a frontier model's episodes distilled, then GRPO on LoRA adapters), exported as a Hugging Face directory
whose logits match the trained model's, and the export evaluated; options from a YAML file; resuming and
refusing to resume; bad input refused up front (exit 2, one line, nothing written).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from agentboost.cli.main import main  # noqa: E402
from agentboost.testing.fake_openai_chat import FakeOpenAIChatServer  # noqa: E402

from . import letter_env  # noqa: E402
from .tiny_model_dir import save_tiny_model  # noqa: E402

ENV = "tests.letter_env:LetterCountEnv"
SMALL = ["--prompts-per-step", "2", "--group-size", "2", "--max-tokens-per-call", "64", "--max-turns", "3",
         "--max-total-tokens", "1024", "--eval-every", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def rows_file(tmp_path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in letter_env.rows()))
    return path


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


@pytest.mark.slow
def test_a_custom_env_is_distilled_trained_exported_reloaded_and_evaluated(tmp_path, model_dir, rows_file, capsys):
    """The done-when test of issue 23: two commands for "distil a strong model's traces, then RL", then
    ``export`` (LoRA merged) and ``eval`` of the export."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with FakeOpenAIChatServer(letter_env.teacher, model="frontier") as server:
        teacher = tmp_path / "teacher"
        code = main(["rollout", "--data", str(rows_file), "--env", ENV, "--n", "2", "--out", str(teacher),
                     "--strands-model", f"openai:frontier@{server.base_url}"])  # fmt: skip
        assert code == 0, capsys.readouterr().err[-2000:]
    run_dir = tmp_path / "run"
    argv = ["train", "--data", str(rows_file), "--env", ENV, "--model", str(model_dir), "--sft-data", str(teacher),
            "--sft-lr", "0.02", "--lora-rank", "4", "--lr", "0.01", "--steps", "2", "--eval-n", "2", *SMALL,
            "--run-dir", str(run_dir)]  # fmt: skip
    if os.environ.get("AGENTBOOST_TEST_DEVICE"):  # e.g. cuda on a GPU machine: trained there, checked on the CPU
        argv += ["--device", os.environ["AGENTBOOST_TEST_DEVICE"]]
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    printed = capsys.readouterr().out
    assert "pass@2" in printed and "held-out report (after)" in printed
    summary = json.loads((run_dir / "summary.json").read_text())
    sources = summary["warm_start"]["sources"]
    assert sources["read"] == 20 and sources["distilled"] == 18 and sources["token_exact"] == 0
    assert sources["dropped"] == {"held-out task": 2}  # one of the ten rows is held out: never trained on
    assert summary["warm_start"]["final_loss"] < summary["warm_start"]["first_loss"]
    assert "eval/pass@2" in summary["after"] and (run_dir / "eval" / "after" / "report.json").is_file()
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    warm = [row["warm_start/step"] for row in logged if "warm_start/step" in row]  # the SFT loss per step first
    assert warm == list(range(1, summary["warm_start"]["steps"] + 1))
    assert [row["step"] for row in logged if "step" in row] == [1, 2]
    assert len((run_dir / "metrics.csv").read_text().splitlines()) == 1 + len(logged)
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*")), "TensorBoard beside W&B"
    if importlib.util.find_spec("wandb") is not None:
        assert list(run_dir.glob("wandb/offline-run-*")), "W&B offline unless configured"
    assert (run_dir / "final_model" / "adapter_config.json").is_file()

    out = tmp_path / "export"
    assert main(["export", str(run_dir), str(out)]) == 0, capsys.readouterr().err[-2000:]
    assert "LoRA merged" in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    assert not any("lora" in name for name, _ in exported.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    trained = PeftModel.from_pretrained(base, str(run_dir / "final_model")).eval()  # unmerged, as trained
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(str(model_dir)).chat_template
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "How many letters are in kiwi?"}],
                                        add_generation_prompt=True, tokenize=True)  # fmt: skip
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    got, want = _logits(exported, ids), _logits(trained, ids)
    assert torch.allclose(got, want, atol=1e-5), float((got - want).abs().max())
    untrained = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    assert float((got - _logits(untrained, ids)).abs().max()) > 1e-4, "the warm start moved the adapters"

    evaluation = tmp_path / "eval"
    code = main(["eval", "--data", str(rows_file), "--env", ENV, "--backend", f"hf:{out}", "--n", "2",
                 "--workers", "0", "--max-tokens-per-call", "64", "--max-turns", "3", "--out", str(evaluation),
                 "--no-plots"])  # fmt: skip
    assert code == 0, capsys.readouterr().err[-2000:]
    report = json.loads((evaluation / "report.json").read_text())
    assert report["tasks"] == 10 and report["samples_per_task"] == 2 and report["infra_errors"] == 0


def test_options_come_from_a_yaml_file_whose_keys_are_the_flags(tmp_path, capsys) -> None:
    config = tmp_path / "train.yaml"
    config.write_text("lora-rank: 4\nsteps: 3\nenv_args:\n  reward_fn: mytools:reward\neval_k: [1, 2]\neval-n: 2\n")
    assert main(["train", "--config", str(config), "--steps", "5", "--print-config"]) == 0
    printed = capsys.readouterr().out
    import yaml

    resolved = yaml.safe_load(printed)
    assert resolved["steps"] == 5 and resolved["lora_rank"] == 4  # the flag wins over the file
    assert resolved["env_args"] == {"reward_fn": "mytools:reward"} and resolved["eval_k"] == [1, 2]
    again = tmp_path / "again.yaml"
    again.write_text(printed)
    assert main(["train", "--config", str(again), "--print-config"]) == 0
    assert capsys.readouterr().out == printed  # --print-config writes what --config reads


def test_help_shows_every_options_documentation_and_its_real_default(capsys) -> None:
    from agentboost.quickstart import QuickstartConfig
    from agentboost.train.configfile import field_docs
    from agentboost.train.recipe import TrainOptions

    for command, cls in (("train", TrainOptions), ("quickstart", QuickstartConfig)):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = "".join(capsys.readouterr().out.split())  # argparse wraps lines (at hyphens too)
        docs = field_docs(cls)
        assert set(docs) == {f for f in cls.__dataclass_fields__}, "every option is documented"
        for name, doc in docs.items():
            assert "".join(doc.split()) in text, (command, name)
    ceiling = (
        "Ceiling of the warm start, a restart included (0: no warm start). (default: 2400 (built-in model), 0 "
        "with --model)"
    )
    assert _squeezed(ceiling) in _squeezed(_help("quickstart", capsys))
    assert _squeezed("(default: cuda when there is one, else cpu)") in _squeezed(_help("train", capsys))


def _squeezed(text: str) -> str:
    return "".join(text.split())


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


def test_a_rerun_resumes_and_a_changed_model_option_is_refused(tmp_path, model_dir, rows_file, capsys) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "--data", str(rows_file), "--env", ENV, "--model", str(model_dir), "--steps", "1", *SMALL,
            "--save-every", "1", "--no-wandb", "--run-dir", str(run_dir)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    assert main([*argv[:-2], "--steps", "2", "--run-dir", str(run_dir)]) == 0
    history = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert history == [1, 2]  # step 1 was not run again
    capsys.readouterr()
    assert main([*argv, "--lora-rank", "2"]) == 2
    err = capsys.readouterr().err
    assert "holds a checkpoint made with other options: --lora-rank 0 (saved) vs 2 (now)" in err


def _bad_inputs(tmp_path: Path, model_dir: Path, rows_file: Path) -> list[tuple[list[str], str]]:
    no_prompt = tmp_path / "no_prompt.jsonl"
    no_prompt.write_text(json.dumps({"task_id": "a", "word": "x", "answer": "1"}) + "\n")
    bad_reward = tmp_path / "bad_reward.jsonl"
    bad_reward.write_text(json.dumps({"prompt": "hi", "reward_fn": "tests.letter_env:nope"}) + "\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("lora_rnak: 4\n")
    not_yaml = tmp_path / "bad.yaml"
    not_yaml.write_text("steps: [1,\n")
    empty_dir = tmp_path / "not_a_model"
    empty_dir.mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    base = ["train", "--data", str(rows_file), "--env", ENV, "--model", str(model_dir)]
    cases = [
        (["train", "--data", str(rows_file), "--model", str(model_dir)], "no environment given"),
        (["train", "--data", str(tmp_path / "missing.jsonl"), "--env", ENV, "--model", str(model_dir)],
         "missing.jsonl"),
        (["train", "--data", str(rows_file), "--env", "no_such_module:Env", "--model", str(model_dir)],
         "no_such_module"),
        (["train", "--data", str(no_prompt), "--env", ENV, "--model", str(model_dir), "--eval-fraction", "0"],
         "the environment (tests.letter_env:LetterCountEnv) of the first row (task 'a')"),
        (["train", "--data", str(bad_reward), "--env", "agentboost.environments.strands_env:StrandsEnv", "--model",
          str(model_dir), "--eval-fraction", "0"], "has no attribute 'nope'"),
        ([*base[:-1], "Qwen/Qwen2.5-0.5B-Instruct"], "huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct"),
        ([*base[:-1], str(tmp_path / "nowhere")], "no such directory"),
        ([*base[:-1], str(empty_dir)], "no config.json"),
        ([*base, "--sft-data", str(tmp_path / "none.jsonl")], "--sft-data"),
        ([*base, "--config", str(unknown)], "unknown option 'lora_rnak' (did you mean lora_rank?)"),
        ([*base, "--config", str(not_yaml)], "not valid YAML"),
        ([*base, "--eval-n", "2", "--eval-temperature", "0"], "identical samples"),
        ([*base, "--steps", "0"], "--steps must be >= 1"),
        ([*base, "--lora-alpha", "8"], "--lora-alpha needs --lora-rank"),
        ([*base, "--dtype", "int4"], "--dtype must be one of"),
        (["export", str(tmp_path / "no_run"), str(tmp_path / "out")], "no such run directory"),
        (["export", str(empty_dir), str(tmp_path / "out")], "holds no trained model"),
        (["quickstart", "--model", "Qwen/Qwen2.5-0.5B-Instruct"], "huggingface-cli download"),
        (["prepare", "--data", str(no_prompt), "--env", ENV, "--out", str(tmp_path / "prepared")],
         "the environment (tests.letter_env:LetterCountEnv) of the first row"),
        (["prepare", "--data", str(rows_file), "--env", ENV, "--out", str(a_file)], "exists and is not a directory"),
        (["prepare", "--data", str(rows_file), "--out", str(tmp_path / "prepared")], "no environment given"),
    ]  # fmt: skip
    if not torch.cuda.is_available():
        cases.append(([*base, "--device", "cuda"], "--device cuda: this machine has no CUDA device"))
        cases.append((["quickstart", "--device", "cuda"], "no CUDA device"))
    return cases


def test_bad_input_is_refused_up_front_in_one_line_and_nothing_is_written(tmp_path, model_dir, rows_file, capsys):
    for argv, message in _bad_inputs(tmp_path, model_dir, rows_file):
        run_dir = tmp_path / "runs" / str(abs(hash(tuple(argv))))
        extra = ["--run-dir", str(run_dir)] if argv[0] in ("train", "quickstart") else []
        code = main([*argv, *extra])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2, (argv, err)
        assert len(lines) == 1 and message in lines[0], (argv, err)
        assert "Traceback" not in err
        assert not run_dir.exists(), f"{argv}: wrote {run_dir}"
    assert not (tmp_path / "out").exists() and not (tmp_path / "prepared").exists()
    assert os.listdir(tmp_path / "not_a_model") == []


def test_the_quickstart_script_example_imports_only_public_names() -> None:
    """examples/quickstart/train_quickstart.py ("swap in your own environment") used the private _build_model."""
    import ast

    source = (Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "train_quickstart.py").read_text()
    imported = [alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)
                for alias in node.names]  # fmt: skip
    assert imported and not [name for name in imported if name.startswith("_")]
    import runpy

    runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "train_quickstart.py"))


def test_steps_logged_after_the_last_checkpoint_are_not_logged_twice(tmp_path, model_dir, rows_file, capsys) -> None:
    """A run interrupted between checkpoints runs those steps again: metrics.csv keeps each step once."""
    run_dir = tmp_path / "run"
    argv = ["train", "--data", str(rows_file), "--env", ENV, "--model", str(model_dir), "--steps", "2", *SMALL,
            "--save-every", "0", "--no-wandb", "--run-dir", str(run_dir)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    assert main(argv) == 0  # no checkpoint was saved: GRPO starts again from step 0
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and len((run_dir / "metrics.csv").read_text().splitlines()) == 3


def test_none_in_a_config_file_means_what_the_flag_s_none_means(tmp_path, capsys) -> None:
    """Issue 40: ``wandb_project: none`` created a W&B project named "none" (the flag's none disables W&B) and
    ``sft_steps: none`` was refused though --help documents N|none."""
    config = tmp_path / "train.yaml"
    config.write_text("wandb_project: none\nsft_steps: None\neval_k: none\n")
    assert main(["train", "--config", str(config), "--print-config"]) == 0
    import yaml

    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["wandb_project"] is None and resolved["sft_steps"] is None and resolved["eval_k"] == []
    config.write_text("steps: none\n")  # not optional: still refused, in one line
    assert main(["train", "--config", str(config), "--print-config"]) == 2
    assert "steps must be an integer, got 'none'" in capsys.readouterr().err


def test_an_offline_tokenizer_trains_a_model_directory_without_one(tmp_path, rows_file, capsys) -> None:
    """Issue 40: ``train --tokenizer offline:qwen2.5`` was refused ("not a local directory") though rollout, eval
    and view take it. A model with the Qwen2.5 vocabulary and no tokenizer files trains with it."""
    from agentboost.offline.tiny_model import build_tiny_qwen2

    model, _ = build_tiny_qwen2(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32)
    model.save_pretrained(str(tmp_path / "bare"))  # weights and config only
    run_dir = tmp_path / "run"
    argv = ["train", "--data", str(rows_file), "--env", ENV, "--model", str(tmp_path / "bare"), "--tokenizer",
            "offline:qwen2.5", "--steps", "1", "--prompts-per-step", "1", "--group-size", "2",
            "--max-tokens-per-call", "4", "--max-turns", "2", "--eval-fraction", "0", "--save-every", "0",
            "--no-wandb", "--tensorboard", "false", "--run-dir", str(run_dir)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    assert (run_dir / "final_model" / "tokenizer.json").is_file()


def test_init_model_writes_a_model_of_the_rows_that_train_takes(tmp_path, rows_file, capsys) -> None:
    """Issue 40: no offline way to a starting model (the tiny stand-in lived under tests/). init-model writes the
    quickstart's small model with a tokenizer trained on the rows, and prints the train command that takes it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "models" / "tiny"
    argv = ["init-model", str(out), "--data", str(rows_file), "--env", ENV, "--hidden-size", "32", "--num-layers",
            "1", "--num-heads", "2"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    printed = capsys.readouterr().out
    assert f"--model {out} " in printed.splitlines()[-1] and printed.splitlines()[-1].startswith("train it: ")
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert model.config.hidden_size == 32 and len(tokenizer) <= model.config.vocab_size
    prompt = letter_env.rows()[0]["prompt"]
    assert len(tokenizer(prompt)["input_ids"]) < len(prompt.encode()) / 2, "a vocabulary of the rows' own text"
    assert "<tool_call>" in tokenizer.chat_template


def test_a_disk_full_at_the_final_model_keeps_the_checkpoint_and_no_half_written_model(
    tmp_path, model_dir, rows_file, capsys, monkeypatch
) -> None:
    """Issue 40: a full disk during train said "unexpected pos ...; rerun the same command to resume", glued to
    the progress bar, and left checkpoint.tmp/ and an empty error.log. Here the disk fills while the final model
    is written: exit 3 naming ENOSPC, the checkpoint kept (the rerun resumes it), no final_model/ at all."""
    import errno

    from transformers import PreTrainedModel

    real_save = PreTrainedModel.save_pretrained

    def save(self, directory, *args, **kwargs):
        if Path(directory).name.startswith("final_model"):
            Path(directory).mkdir(parents=True, exist_ok=True)
            (Path(directory) / "model.safetensors").write_bytes(b"\0" * 64)  # the part that fitted
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self, directory, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save)
    run_dir = tmp_path / "run"
    argv = ["train", "--data", str(rows_file), "--env", ENV, "--model", str(model_dir), "--steps", "1", *SMALL,
            "--save-every", "1", "--no-wandb", "--run-dir", str(run_dir)]  # fmt: skip
    assert main(argv) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"no space left on the device holding {run_dir} (ENOSPC" in err and "to resume" in err, err
    left = sorted(p.name for p in run_dir.iterdir())
    assert "checkpoint" in left and not {"final_model", "final_model.tmp", "checkpoint.tmp"} & set(left), left
    assert (run_dir / "error.log").read_text().strip(), "the traceback, not an empty file"
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", real_save)
    assert main(argv) == 0, capsys.readouterr().err[-2000:]  # space again: the rerun resumes and finishes
    assert (run_dir / "final_model" / "model.safetensors").is_file()
