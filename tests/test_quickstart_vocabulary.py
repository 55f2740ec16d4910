"""The quickstart's own vocabulary: writing the tool's number into either answer style is a copy.

The check of the warm start counts a task only when both answer styles are reproduced. With " -" one token
(the BPE merges a space with the punctuation after it), "The answer is -42." wrote the sign as a token the
tool's "-42" never shows, so the sentence answer to a negative result was a translation, not a copy. In the
seed table made with it merged (benchmarks/results/quickstart_seeds_merged_sign.md) it was wrong on every
check task that needed it at nearly every check, and a run whose 32 check tasks held more than six negative
answers could not reach the 0.8 target before it learnt that one token (seed 120: 0.75 for 500 steps, every
miss that token).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentboost.offline.tokenizer_builder import build_domain_tokenizer
from agentboost.quickstart import (
    QuickstartConfig,
    build_quickstart_model,
    check_resumable,
    quickstart_tasks,
    verbose_answer,
)


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_a_sentence_answer_writes_the_number_with_the_tool_s_own_tokens() -> None:
    cfg = QuickstartConfig(seed=120, hidden_size=32, num_layers=1, num_heads=2)
    rows, eval_rows = quickstart_tasks(cfg)
    _, tokenizer = build_quickstart_model(cfg, rows)
    answers = {row["answer"] for row in rows + eval_rows}
    assert any(a.startswith("-") for a in answers)  # the tasks themselves have negative results
    answers |= {"-123", "-7", "0", "999"}
    for answer in sorted(answers):
        alone = tokenizer.encode(answer, add_special_tokens=False)  # as the tool's result shows it
        sentence = tokenizer.encode(verbose_answer(answer), add_special_tokens=False)
        assert _contains(sentence, alone), (answer, tokenizer.convert_ids_to_tokens(sentence))


def test_kept_apart_drops_only_that_merge() -> None:
    corpus = ["The answer is -42. The answer is -7. a - b - c"] * 20 + ["The answer is 42."] * 20
    merged = build_domain_tokenizer(corpus, vocab_size=300)
    apart = build_domain_tokenizer(corpus, vocab_size=300, kept_apart=(" -",))
    assert merged != apart  # cached under another key

    from transformers import AutoTokenizer

    before = AutoTokenizer.from_pretrained(str(merged), local_files_only=True)
    after = AutoTokenizer.from_pretrained(str(apart), local_files_only=True)
    assert "Ġ-" in before.tokenize("is -42")
    assert after.tokenize("is -42") == ["is", "Ġ", "-", "4", "2"]
    assert after.tokenize("The answer") == before.tokenize("The answer")  # other merges untouched
    assert after.get_vocab() == before.get_vocab()  # ids unchanged: the dropped token is never produced
    with pytest.raises(ValueError, match="two-character"):
        build_domain_tokenizer(corpus, vocab_size=300, kept_apart=(" --",))


def test_kept_apart_also_drops_a_merge_that_joins_the_pair_through_a_longer_token() -> None:
    """The pre-token " ->" merges as " " + "->", never " " + "-": the pair must stay apart there too."""
    from transformers import AutoTokenizer

    corpus = ["x ->y a ->b f ->g"] * 40
    merged = AutoTokenizer.from_pretrained(str(build_domain_tokenizer(corpus, vocab_size=280)), local_files_only=True)
    assert "Ġ->" in merged.tokenize("x ->y")  # the chain exists without kept_apart
    directory = build_domain_tokenizer(corpus, vocab_size=280, kept_apart=(" -",))
    apart = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    tokens = apart.tokenize("x ->y")
    assert not any("Ġ-" in token for token in tokens), tokens
    assert apart.convert_tokens_to_string(tokens) == "x ->y"


def test_a_given_directory_is_rebuilt_when_it_holds_another_build(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    corpus = ["The answer is -42. a - b"] * 20
    out = tmp_path / "tok"
    build_domain_tokenizer(corpus, vocab_size=280, out_dir=out)
    assert "Ġ-" in AutoTokenizer.from_pretrained(str(out), local_files_only=True).tokenize("is -42")
    build_domain_tokenizer(corpus, vocab_size=280, out_dir=out, kept_apart=(" -",))  # not the merged one
    assert "Ġ-" not in AutoTokenizer.from_pretrained(str(out), local_files_only=True).tokenize("is -42")


def test_the_merged_sign_is_an_option_and_a_run_made_with_it_resumes_only_with_it(tmp_path: Path) -> None:
    """``--negative-sign-apart false`` builds the vocabulary of the merged-sign seed table's runs; a run directory
    written before the option existed had the sign merged, and resuming it with the sign apart is refused
    (its weights were trained on the other tokens)."""
    cfg = QuickstartConfig(seed=120, hidden_size=32, num_layers=1, num_heads=2, negative_sign_apart=False)
    rows, _ = quickstart_tasks(cfg)
    _, tokenizer = build_quickstart_model(cfg, rows)
    assert "Ġ-" in tokenizer.tokenize(verbose_answer("-42"))

    run_dir = tmp_path / "run"
    (run_dir / "warm_start").mkdir(parents=True)
    (run_dir / "warm_start" / "state.json").write_text("{}")
    before = {k: v for k, v in asdict(QuickstartConfig()).items() if k != "negative_sign_apart"}
    (run_dir / "summary.json").write_text(json.dumps({"config": before}))
    check_resumable(QuickstartConfig(negative_sign_apart=False), run_dir)
    with pytest.raises(ValueError, match=r"--negative-sign-apart False \(saved\) vs True \(now\)"):
        check_resumable(QuickstartConfig(), run_dir)
