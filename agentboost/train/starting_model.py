"""A model to start from with no download: the quickstart's small Qwen2 (random weights) with a tokenizer
trained on the user's own rows.

``agentboost train --model tiny`` builds it in the run; ``agentboost init-model DIR`` writes it as a Hugging
Face directory (``--model DIR`` for ``train``, ``hf:DIR`` for ``rollout``/``eval``), its sizes given as
options. The tokenizer keeps the real chat template, special tokens and tool-call format of its family
(``offline:qwen2.5``), with a byte-level BPE vocabulary of about ``vocab_size`` tokens trained on what the
model will read and write on these rows: each row's first turn as the agent sees it (system prompt, the row's
prompt, its tools' specs), a call of each of its tools and the row's ``answer`` when it has one. Any text still
encodes (byte fallback). A model this small learns a task only after a warm start (``--sft-data``: a teacher's
episodes, replayed through its chat template); on its own it is a way to see the whole loop run on a CPU.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..offline.tiny_model import SmallModel, build_small_qwen2, save_model

logger = logging.getLogger(__name__)

TINY = "tiny"
"""The ``--model`` that names this model."""
CORPUS_ROWS = 5000
"""Rows whose conversations the vocabulary is trained on, at most (the first ones)."""


def rows_corpus(
    rows: list[dict[str, Any]],
    env: str,
    env_args: dict[str, Any] | None = None,
    *,
    system_prompt: str | None = None,
    family: str = "qwen2.5",
) -> list[str]:
    """The texts a tokenizer for ``rows`` is trained on (see module doc), rendered with ``family``'s real chat
    template. ValueError naming a row whose environment does not build."""
    from ..chat.messages import tool_specs_to_openai
    from ..data import task_id_of
    from ..offline.tokenizer_builder import load_tokenizer
    from ..utils.refs import resolve

    real = load_tokenizer(family)
    env_cls = resolve(env)
    corpus = []
    for index, row in enumerate(rows[:CORPUS_ROWS]):
        try:
            environment = env_cls.from_dict({**row, **(env_args or {})})
            tools = environment.make_tools()
            prompt = environment.initial_prompt()
        except Exception as exc:
            raise ValueError(f"row {task_id_of(row, index)!r}: its environment does not build: {exc}") from exc
        specs = [spec for spec in (getattr(t, "tool_spec", None) or getattr(t, "TOOL_SPEC", None) for t in tools)
                 if isinstance(spec, dict)]  # fmt: skip
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": prompt})
        for spec in specs:
            schema = spec.get("inputSchema", {})
            properties = (schema.get("json", schema) if isinstance(schema, dict) else {}).get("properties") or {}
            call = json.dumps({"name": spec.get("name", ""), "arguments": dict.fromkeys(properties, "")})
            messages += [{"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                         {"role": "tool", "content": ""}]  # fmt: skip
        answer = row.get("answer")
        messages.append({"role": "assistant", "content": "" if answer is None else str(answer)})
        corpus.append(real.apply_chat_template(messages, tools=tool_specs_to_openai(specs), tokenize=False))
    return corpus


def tiny_tokenizer(
    rows: list[dict[str, Any]],
    env: str,
    env_args: dict[str, Any] | None = None,
    *,
    system_prompt: str | None = None,
    vocab_size: int = SmallModel.vocab_size,
    family: str = "qwen2.5",
) -> Any:
    """The tokenizer of the tiny model for ``rows`` (built once per corpus and cached; see module doc)."""
    from transformers import AutoTokenizer

    from ..offline.tokenizer_builder import build_domain_tokenizer

    corpus = rows_corpus(rows, env, env_args, system_prompt=system_prompt, family=family)
    path = build_domain_tokenizer(corpus, family=family, vocab_size=vocab_size)
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def tiny_model(tokenizer: Any, sizes: SmallModel | None = None, *, seed: int = 0) -> Any:
    """The quickstart's small Qwen2 (random weights drawn with ``seed``) for ``tokenizer``."""
    sizes = sizes or SmallModel()
    model, _ = build_small_qwen2(tokenizer, sizes, seed=seed)
    return model


def init_model_dir(
    out: Path,
    rows: list[dict[str, Any]],
    env: str,
    env_args: dict[str, Any] | None = None,
    *,
    system_prompt: str | None = None,
    sizes: SmallModel | None = None,
    seed: int = 0,
) -> tuple[Path, Any]:
    """Write the tiny model for ``rows`` to ``out`` as a Hugging Face directory; returns it and the model."""
    sizes = sizes or SmallModel()
    tokenizer = tiny_tokenizer(rows, env, env_args, system_prompt=system_prompt, vocab_size=sizes.vocab_size)
    model = tiny_model(tokenizer, sizes, seed=seed)
    return save_model(model, tokenizer, out), model
