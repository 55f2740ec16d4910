"""The model a run trains: a local Hugging Face directory (optionally with LoRA adapters) on a device.

What is checked up front, before minutes of work: the directory exists and holds a model (a hub id
is refused with the command that downloads it: runs never reach the network), the device exists,
the dtype is known. :func:`model_record` is what ``run.json`` keeps, so that ``agentboost export``
can rebuild the model (base directory, LoRA settings, dtype).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DTYPES = ("auto", "float32", "bfloat16", "float16")
LORA_TARGETS = "all-linear"


def resolve_device(device: str | None) -> str:
    """``device``, or cuda when there is one, else cpu; a CUDA device this machine lacks is refused."""
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    assert device is not None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this machine has no CUDA device (torch sees none); use --device cpu")
    if not device.startswith(("cuda", "cpu", "mps", "xpu")):
        raise ValueError(f"--device {device}: expected cpu, cuda or cuda:N")
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto``: bfloat16 on a GPU, float32 elsewhere."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    return dtype


def check_model_dir(path: str, *, flag: str = "--model") -> Path:
    """The local model directory ``path`` names (config.json inside), or a ValueError saying what it is."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        hub_like = path.count("/") == 1 and not path.startswith((".", "/", "~")) and not directory.exists()
        name = path.rsplit("/", maxsplit=1)[-1]
        hint = (
            f" (a Hugging Face hub id? runs never download: `huggingface-cli download {path} --local-dir "
            f"models/{name}`, then {flag} models/{name})"
            if hub_like
            else ""
        )
        what = "is a file, not a model directory" if directory.exists() else "does not exist"
        raise ValueError(f"{flag} {path}: {what}{hint}")
    if not (directory / "config.json").is_file():
        raise ValueError(f"{flag} {path}: no config.json there, not a Hugging Face model directory")
    check_weights(directory, flag=flag)
    return directory


WEIGHTS = ("model.safetensors", "pytorch_model.bin")
SAFETENSORS_HEADER_MAX = 100 << 20


def check_weights(directory: Path, *, flag: str = "--model") -> None:
    """The model's weight files are there and whole, read without loading them: a safetensors file's header
    must parse and its tensors end where the file ends (a truncated download or copy is found here, not as a
    deserialisation error minutes later); a ``.bin`` file must open as the zip archive torch writes. Shards
    named by an ``*.index.json`` are each checked. ValueError naming the file."""
    import json
    import zipfile

    files: list[Path] = []
    for name in WEIGHTS:
        index = directory / f"{name}.index.json"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{flag} {directory}: {index.name} is not a weights index ({exc})") from None
            files += [directory / shard for shard in shards]
        elif (directory / name).is_file():
            files.append(directory / name)
    if not files:
        raise ValueError(f"{flag} {directory}: no weights in it ({' or '.join(WEIGHTS)}, or a sharded index)")
    for file in files:
        if not file.is_file():
            raise ValueError(f"{flag} {directory}: {file.name} is missing (named by its weights index)")
        size = file.stat().st_size
        if file.suffix == ".safetensors":
            why = _safetensors_problem(file, size)
        else:
            try:
                with zipfile.ZipFile(file):
                    why = None
            except zipfile.BadZipFile as exc:
                why = f"not a whole torch archive ({exc})"
            except OSError as exc:
                why = f"unreadable ({exc})"
        if why is not None:
            raise ValueError(f"{flag} {directory}: {file.name} is {why}: copy or download it again")


def _safetensors_problem(file: Path, size: int) -> str | None:
    import json
    import struct

    try:
        with open(file, "rb") as fh:
            head = fh.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if length is None or length > min(SAFETENSORS_HEADER_MAX, size - 8):
                return f"truncated or not a safetensors file ({size} bytes)"
            header = json.loads(fh.read(length))
    except OSError as exc:
        return f"unreadable ({exc})"
    except ValueError:
        return "corrupt (its header is not JSON)"
    if not isinstance(header, dict):
        return "corrupt (its header is not a mapping)"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)
            and isinstance(t.get("data_offsets"), list) and len(t["data_offsets"]) == 2]  # fmt: skip
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        return f"truncated or corrupt (its header describes {expected} bytes, the file has {size})"
    return None


def lora_settings(rank: int, alpha: int | None = None) -> dict[str, Any] | None:
    """peft's ``LoraConfig`` keywords for ``rank`` (None: no LoRA, the whole model is trained)."""
    if not rank:
        return None
    return {"r": rank, "lora_alpha": alpha or 2 * rank, "target_modules": LORA_TARGETS, "task_type": "CAUSAL_LM"}


def model_record(base: str | None, *, lora: dict[str, Any] | None, dtype: str) -> dict[str, Any]:
    return {"base": str(Path(base).expanduser().resolve()) if base else None, "lora": lora, "dtype": dtype}


def load_model(
    path: str | Path, *, tokenizer: Any = None, lora: dict[str, Any] | None, device: str, dtype: str
) -> tuple[Any, Any]:
    """The model of ``path`` (local files only) in ``dtype`` on ``device``, with fresh LoRA adapters when
    ``lora`` is given, and its tokenizer (``tokenizer``: another directory, or one already loaded)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if tokenizer is None or isinstance(tokenizer, str | Path):
        loaded_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or path), local_files_only=True)
    else:
        loaded_tokenizer = tokenizer
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=getattr(torch, dtype))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**lora))
    model.to(device)
    return model, loaded_tokenizer
