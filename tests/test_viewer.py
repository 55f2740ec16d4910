"""``agentboost view`` without a browser: what the page embeds (escaped, capped), reading episode files
and eval directories, token pieces, the CLI. The page as a person sees it: tests/test_viewer_browser.py."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from pathlib import Path

import pytest

from agentboost.cli.main import main as cli
from agentboost.episode import Episode
from agentboost.viewer.page import Caps, page_data, render, script_json
from agentboost.viewer.source import load, tokenizer_ref
from agentboost.viewer.tokens import PieceDecoder, token_view
from agentboost.viewer.transcript import conversation
from tests.viewer_episodes import HOSTILE, MULTIBYTE, make_episodes, write_jsonl


@pytest.fixture(scope="module")
def episodes(qwen25_template) -> list[Episode]:
    return make_episodes(qwen25_template)


@pytest.fixture(scope="module")
def decoder(qwen25_tokenizer) -> PieceDecoder:
    return PieceDecoder(qwen25_tokenizer)


def _embedded(page: str) -> tuple[str, str]:
    """The JSON data block and the script of a page."""
    data = re.search(r'<script type="application/json" id="episode-data">(.*?)</script>', page, re.S)
    script = re.search(r"<script>(.*?)</script>", page, re.S)
    assert data and script
    return data.group(1), script.group(1)


def test_page_embeds_hostile_text_inertly(episodes, decoder, tmp_path) -> None:
    source = load(write_jsonl(tmp_path / "episodes.jsonl", episodes))
    page = render(page_data(source, decoder, tokenizer_status="offline:qwen2.5", caps=Caps(), title=HOSTILE))
    blob, script = _embedded(page)
    # nothing in the data block can end it or open markup: every <, > and & is a \u escape
    assert not set(blob) & set("<>&")
    assert page.count("<script") == 2 and page.count("</script>") == 2  # ours only
    assert "<img" not in page and "<!--" not in page  # no markup from the data
    assert HOSTILE not in page and html.escape(HOSTILE) in page  # the title is escaped
    data = json.loads(blob)
    texts = [item["text"] for ep in data["episodes"] for item in ep["items"]]
    assert any(HOSTILE in text for text in texts if "page http" in text)  # the tool result, intact as text
    assert any(ep["id"].startswith("t2<script>") for ep in data["episodes"])
    # the Content-Security-Policy admits exactly the inlined script, and no network
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy and "default-src 'none'" in policy
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "eval(" not in script


def test_script_json_survives_non_ascii_and_separators() -> None:
    value = {"s": "</script>\u2028\u2029 🎉 \ud800 & <!-- -->"}
    text = script_json(value)
    assert json.loads(text) == value and not set(text) & set("<>&\u2028\u2029")


def test_token_view_mask_logprobs_and_pieces(episodes, decoder, qwen25_tokenizer) -> None:
    episode = episodes[0]
    view = token_view(episode, decoder)
    n = len(episode.prompt_ids) + len(episode.response_ids)
    assert view.prompt_shown == len(episode.prompt_ids) and view.response_shown == len(episode.response_ids)
    assert len(view.ids) == len(view.mask) == len(view.logprobs) == len(view.pieces) == n
    assert view.mask == "0" * len(episode.prompt_ids) + "".join(map(str, episode.response_mask))
    model = [i for i, bit in enumerate(view.mask) if bit == "1"]
    assert model and all(view.logprobs[i] == -0.25 for i in model)  # the scripted backend's log-prob
    assert all(view.logprobs[i] is None for i, bit in enumerate(view.mask) if bit == "0")
    assert [s[0] for s in view.segments] == ["prompt", "model", "env", "model", "env", "model"]
    # pieces put back together are the decoded episode
    assert "".join(view.pieces) == qwen25_tokenizer.decode(episode.prompt_ids + episode.response_ids)


def test_multibyte_characters_split_over_tokens_decode_whole(episodes, decoder, qwen25_tokenizer) -> None:
    episode = episodes[2]
    view = token_view(episode, decoder)
    response = "".join(view.pieces[view.prompt_shown :])
    assert response == qwen25_tokenizer.decode(episode.response_ids) and MULTIBYTE in response
    assert "\ufffd" not in response
    assert any(piece == "" for piece in view.pieces)  # a byte of 🎉 alone shows nothing; its text is on the last


def test_caps_cut_tokens_and_text_and_say_so(episodes, decoder) -> None:
    episode = Episode.from_dict(episodes[0].to_dict())
    episode.messages[2]["content"][0]["toolResult"]["content"][0]["text"] = "x" * 5000
    view = token_view(episode, decoder, max_tokens=50, max_prompt_tokens=10)
    assert (view.prompt_shown, view.response_shown) == (10, 40)
    assert len(view.ids) == len(view.mask) == len(view.logprobs) == len(view.pieces) == 50
    assert view.ids == episode.prompt_ids[-10:] + episode.response_ids[:40]
    assert sum(s[3] for s in view.segments) == 50
    items, left_out = conversation(episode, max_chars=100, max_items=3)
    assert left_out == len(conversation(episode)[0]) - 3
    result = next(i for i in conversation(episode, max_chars=100)[0] if i.kind == "tool_result")
    assert (len(result.text), result.clipped) == (100, 4900)
    data = page_data(load_one(episode), decoder, tokenizer_status="t", caps=Caps(episodes=1, tokens=50, chars=100),
                     title="t")  # fmt: skip
    assert data["caps"] == {"episodes": 1, "tokens": 50, "prompt_tokens": 1024, "chars": 100}


def load_one(episode: Episode):
    from agentboost.viewer.source import Source

    return Source(path=Path("x.jsonl"), episodes=[episode], total=1)


def test_wrong_tokenizer_and_bad_numbers_fall_back_to_ids(episodes, decoder) -> None:
    episode = Episode.from_dict(episodes[0].to_dict())
    episode.segments[1].token_ids[0] = 10**7  # not an id of this tokenizer
    episode.segments[1].logprobs[1] = float("-inf")
    episode.reward = float("nan")
    view = token_view(episode, decoder)
    assert view.pieces is None and "outside the tokenizer" in view.note
    assert view.logprobs[view.prompt_shown + 1] is None
    data = page_data(load_one(episode), decoder, tokenizer_status="t", caps=Caps(), title="t")
    assert data["episodes"][0]["reward"] is None
    json.loads(script_json(data))  # strict JSON: no NaN / Infinity
    assert token_view(Episode.failed("x", episode.termination, "d"), decoder).note == "no tokens recorded"


def test_load_eval_directory(episodes, tmp_path) -> None:
    rerun = Episode.from_dict(episodes[1].to_dict())
    rerun.reward = 0.5  # a re-run of the same id: the last record wins
    write_jsonl(tmp_path / "episodes.jsonl", episodes, extra_lines=[
        "not json\n", "\n", '{"no_id": 1}\n', rerun.to_json() + "\n", '{"id": "torn", "term',
    ])  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps({"model": {"backend": "tiny", "tokenizer": None}}))
    source = load(tmp_path, max_episodes=3)
    assert source.total == 6 and source.replaced == 1 and len(source.episodes) == 3
    assert [e.id for e in source.episodes] == [e.id for e in episodes[:3]]
    assert source.episodes[1].reward == 0.5
    assert source.terminations == {"completed": 4, "max_turns": 1, "infra_error": 1}
    assert [s.line for s in source.skipped] == [7, 9, 11]
    assert "partial last line" in source.skipped[-1].reason and "not an episode record" in source.skipped[0].reason
    assert tokenizer_ref(source) == "offline:qwen2.5"
    source.manifest = {"model": {"backend": "hf:/models/x", "tokenizer": None}}
    assert tokenizer_ref(source) == "/models/x"
    source.manifest = {"model": {"tokenizer": "Qwen/Qwen3-4B"}}
    assert tokenizer_ref(source) == "Qwen/Qwen3-4B"
    assert load(tmp_path, max_episodes=2, skip_records=4).episodes[0].id == episodes[4].id


def test_overlong_line_is_skipped_without_reading_it_whole(episodes, tmp_path) -> None:
    limit = max(len(e.to_json().encode()) for e in episodes[:2]) + 10
    lines = ["x" * (3 * limit) + "\n", episodes[1].to_json() + "\n"]
    source = load(write_jsonl(tmp_path / "e.jsonl", episodes[:1], extra_lines=lines), max_line_bytes=limit)
    assert [e.id for e in source.episodes] == [episodes[0].id, episodes[1].id]
    assert [(s.line, s.reason) for s in source.skipped] == [(2, f"longer than {limit} bytes")]


def test_cli_writes_one_self_contained_page(episodes, tmp_path, capsys) -> None:
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    write_jsonl(eval_dir / "episodes.jsonl", episodes)
    (eval_dir / "manifest.json").write_text(json.dumps({"model": {"backend": "tiny", "tokenizer": None}}))
    assert cli(["view", str(eval_dir)]) == 0
    page = (eval_dir / "view.html").read_text()
    assert f"wrote {eval_dir / 'view.html'} (6 of 6 episodes)" in capsys.readouterr().out
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # loads nothing from anywhere
    data = json.loads(_embedded(page)[0])
    assert data["tokenizer"] == {"ok": True, "status": "offline:qwen2.5 (from the evaluation's settings)"}
    assert data["episodes"][0]["tok"]["pieces"] is not None

    out = tmp_path / "ids.html"
    assert (
        cli(["view", str(eval_dir / "episodes.jsonl"), "--no-tokenizer", "--out", str(out), "--max-episodes", "2"]) == 0
    )
    data = json.loads(_embedded(out.read_text())[0])
    assert data["embedded"] == 2 and data["total"] == 6
    assert data["episodes"][0]["tok"]["pieces"] is None and "token ids shown" in data["tokenizer"]["status"]

    assert cli(["view", str(eval_dir), "--tokenizer", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "cannot load tokenizer" in capsys.readouterr().err
    assert cli(["view", str(tmp_path / "nothing")]) == 2
    assert cli(["view", str(eval_dir), "--max-tokens", "0"]) == 2


def test_pieces_of_a_long_multilingual_text(decoder, qwen25_tokenizer) -> None:
    ids = qwen25_tokenizer.encode("naïve café 你好 🎉 Ελληνικά\n" * 200)
    pieces = decoder.pieces(ids, 0, len(ids))
    assert len(pieces) == len(ids) and "".join(pieces) == qwen25_tokenizer.decode(ids)
    whole = "".join(decoder.pieces(ids, 0, 40))
    for start in range(1, 30):  # a region starting anywhere, even inside a character, shows clean text
        part = "".join(decoder.pieces(ids, start, 40))
        assert whole.endswith(part) and "\ufffd" not in part and len(part) >= len(whole) - len(whole[: start * 4])
