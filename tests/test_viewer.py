"""``agentboost view`` without a browser: what the page embeds (escaped, capped), reading episode files
and eval directories, token pieces, the CLI, episodes of several trajectories (each one's tokens and
conversation). The page as a person sees it: tests/test_viewer_browser.py."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from pathlib import Path

import pytest

from agentboost.cli.main import main as cli
from agentboost.episode import Episode, MultiTrajectoryError
from agentboost.viewer.page import Caps, page_data, render, script_json
from agentboost.viewer.source import Source, load, tokenizer_ref
from agentboost.viewer.tokens import PieceDecoder, token_view
from agentboost.viewer.transcript import conversation, ends
from tests.viewer_episodes import HOSTILE, MULTIBYTE, make_episodes, make_multi_trajectory_episodes, write_jsonl


@pytest.fixture(scope="module")
def episodes(qwen25_template) -> list[Episode]:
    return make_episodes(qwen25_template)


@pytest.fixture(scope="module")
def multi(qwen25_template) -> list[Episode]:
    """``window:0`` (6 trajectories), ``pair:0`` (main, helper), ``summary:0`` (an untrained aux trajectory)."""
    return make_multi_trajectory_episodes(qwen25_template)


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
    assert data["caps"] == {"episodes": 1, "tokens": 50, "prompt_tokens": 1024, "chars": 100, "trajectories": 32}


def load_one(*episodes: Episode) -> Source:
    return Source(path=Path("x.jsonl"), episodes=list(episodes), total=len(episodes))


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
    assert cli(["view", str(eval_dir), "--max-trajectories", "0"]) == 2


def test_pieces_of_a_long_multilingual_text(decoder, qwen25_tokenizer) -> None:
    ids = qwen25_tokenizer.encode("naïve café 你好 🎉 Ελληνικά\n" * 200)
    pieces = decoder.pieces(ids, 0, len(ids))
    assert len(pieces) == len(ids) and "".join(pieces) == qwen25_tokenizer.decode(ids)
    whole = "".join(decoder.pieces(ids, 0, 40))
    for start in range(1, 30):  # a region starting anywhere, even inside a character, shows clean text
        part = "".join(decoder.pieces(ids, start, 40))
        assert whole.endswith(part) and "\ufffd" not in part and len(part) >= len(whole) - len(whole[: start * 4])


# -- episodes of several trajectories -------------------------------------------------------------------
def test_each_trajectory_shows_its_own_tokens_mask_and_logprobs(multi, decoder, qwen25_tokenizer) -> None:
    window = multi[0]
    assert window.num_trajectories == 6
    with pytest.raises(MultiTrajectoryError, match="6 trajectories"):
        token_view(window, decoder)  # the flat segments interleave trajectories: never shown as one
    for trajectory in window.trajectories:
        view = token_view(trajectory, decoder)
        prompt, response = trajectory.prompt_ids, trajectory.response_ids
        assert view.ids == prompt + response and (view.prompt_total, view.response_total) == (
            len(prompt),
            len(response),
        )
        assert view.mask == "0" * len(prompt) + "".join(map(str, trajectory.response_mask))
        assert [lp for lp, bit in zip(view.logprobs, view.mask, strict=True) if bit == "1"] == [
            lp for lp, bit in zip(trajectory.response_logprobs, trajectory.response_mask, strict=True) if bit
        ]
        assert "".join(view.pieces) == qwen25_tokenizer.decode(prompt + response)
        kinds = [kind for kind, *_ in view.segments]
        assert kinds[0] == "prompt" and kinds[1:] == ["model"] + ["env", "model"] * (len(trajectory.calls) - 1)
        assert [call for kind, call, *_ in view.segments if kind == "model"] == [c.index for c in trajectory.calls]
    # under the page's caps, trajectory by trajectory
    last = window.trajectories[-1]
    view = token_view(last, decoder, max_tokens=20, max_prompt_tokens=8)
    assert view.ids == last.prompt_ids[-8:] + last.response_ids[:12] and len(view.pieces) == 20


def test_an_untrained_trajectory_shows_no_loss_token(multi, decoder) -> None:
    summary = multi[2]
    aux = next(t for t in summary.trajectories if t.info.agent == "aux")
    assert not aux.trained and aux.num_model_tokens > 0
    assert set(token_view(aux, decoder).mask) == {"0"}  # the trainer never sees it (train_aux_calls=False)
    data = page_data(load_one(summary), decoder, tokenizer_status="t", caps=Caps(), title="t")["episodes"][0]
    assert data["trained"] == summary.num_model_tokens - aux.num_model_tokens
    row = data["trajs"][aux.index]
    assert (row["agent"], row["trained"], row["loss"]) == ("aux", False, 0)
    assert set(row["view"]["tok"]["mask"]) == {"0"}


def test_each_trajectory_shows_its_own_conversation(multi) -> None:
    pair = multi[1]
    main, helper = (conversation(pair, trajectory=t)[0] for t in (0, 1))
    assert [(i.role, i.kind, i.name, i.text, i.call) for i in helper] == [
        ("user", "text", "", "add 0 and 1", None),
        ("assistant", "tool_call", "add", '{"a": 0, "b": 1}', 1),
        ("tool", "tool_result", "add", "1", None),
        ("assistant", "text", "", "1", 2),
    ]  # the helper's own history, its calls numbered as in the episode
    assert [(i.kind, i.name, i.call) for i in main if i.role == "assistant"] == [
        ("tool_call", "helper", 0),
        ("text", "", 3),
    ]
    window = multi[0]
    for trajectory in window.trajectories:
        items = conversation(window, trajectory=trajectory.index)[0]
        calls = [i.call for i in items if i.call is not None]
        assert calls == [c.index for c in trajectory.calls]  # each call's message found in its trajectory's
        first = trajectory.calls[0].message_index
        assert all(i.call is None for i in items if i.message < first)  # the history it opened with


def test_page_lists_trajectories_and_embeds_each_ones_view(multi, episodes, decoder) -> None:
    window, pair, summary = multi
    data = page_data(load_one(episodes[0], *multi), decoder, tokenizer_status="t", caps=Caps(), title="t")
    single, w, p, s = data["episodes"]
    assert (single["n_traj"], single["trajs"]) == (1, []) and single["tok"]["ids"]  # shown as before
    assert [ep["n_traj"] for ep in (w, p, s)] == [6, 2, 3]
    assert w["tok"] is None and w["items"] == []  # an episode of several is shown trajectory by trajectory
    assert (w["prompt_tokens"], w["response_tokens"]) == (window.num_prompt_tokens, window.num_response_tokens)
    assert w["rerendered"] == window.rerendered_tokens > 0
    assert [c[3] for c in w["calls"]] == [c.trajectory for c in window.calls]
    for row, trajectory in zip(w["trajs"], window.trajectories, strict=True):
        info = trajectory.info
        assert (row["index"], row["agent"], row["opened_by"], row["detail"], row["rerendered"], row["trained"]) == (
            trajectory.index,
            info.agent,
            info.opened_by,
            info.detail,
            info.rerendered_tokens,
            True,
        )
        assert row["calls"] == [c.index for c in trajectory.calls] and row["n_calls"] == len(trajectory.calls)
        assert (row["prompt"], row["response"], row["model"]) == (
            len(trajectory.prompt_ids),
            len(trajectory.response_ids),
            trajectory.num_model_tokens,
        )
        assert row["view"]["tok"]["ids"] == trajectory.prompt_ids + trajectory.response_ids
        assert row["view"]["first_message"] == trajectory.calls[0].message_index
    assert w["trajs"][0]["opened_by"] == "start" and {r["opened_by"] for r in w["trajs"][1:]} == {"history_rewritten"}
    assert [(r["agent"], r["opened_by"], r["reward"]) for r in p["trajs"]] == [
        ("main", "start", 1.0),
        ("helper", "new_agent", 0.5),
    ]  # the helper's role reward
    assert p["trajs"][1]["view"]["items"][0]["text"] == "add 0 and 1"
    assert s["trained"] == sum(t.num_model_tokens for t in summary.trajectories if t.trained)


def test_caps_apply_per_trajectory_and_to_the_trajectories_shown(multi, decoder) -> None:
    assert ends(6, 2) == [0, 5] and ends(6, 3) == [0, 1, 5] and ends(3, 5) == [0, 1, 2] and ends(0, 4) == []
    window = multi[0]
    caps = Caps(tokens=30, prompt_tokens=10, chars=5, items=3, trajectories=3)
    rows = page_data(load_one(window), decoder, tokenizer_status="t", caps=caps, title="t")["episodes"][0]["trajs"]
    assert len(rows) == 6  # every trajectory is listed
    assert [r["index"] for r in rows if r["view"] is not None] == [0, 1, 5]  # the first and the last are shown
    for row in rows:
        if row["view"] is None:
            continue
        tok = row["view"]["tok"]
        assert len(tok["ids"]) == len(tok["pieces"]) == 30 and tok["prompt_shown"] == 10
        assert len(row["view"]["items"]) <= 3 and all(len(i["text"]) <= 5 for i in row["view"]["items"])
    assert any(item["clipped"] for row in rows if row["view"] for item in row["view"]["items"])


def test_trajectory_fields_are_embedded_inertly(multi, decoder, tmp_path) -> None:
    window = Episode.from_dict(multi[0].to_dict())
    window.trajectory_info[1].detail = f"edited {HOSTILE}"
    window.trajectory_info[2].opened_by = HOSTILE
    page = render(page_data(load_one(window), decoder, tokenizer_status="t", caps=Caps(), title="t"))
    blob, _ = _embedded(page)
    assert not set(blob) & set("<>&") and "<img" not in page and page.count("<script") == 2
    rows = json.loads(blob)["episodes"][0]["trajs"]
    assert rows[0]["agent"] == f"adder{HOSTILE}"  # the agent's name, kept as text
    assert (rows[1]["detail"], rows[2]["opened_by"]) == (f"edited {HOSTILE}", HOSTILE)
    answer = [i["text"] for i in rows[-1]["view"]["items"] if i["role"] == "assistant" and i["kind"] == "text"]
    assert answer == [f"6 {HOSTILE}"]


def test_multi_trajectory_episodes_round_trip_through_the_file(multi, decoder, tmp_path) -> None:
    source = load(write_jsonl(tmp_path / "episodes.jsonl", multi))
    assert [e.num_trajectories for e in source.episodes] == [6, 2, 3]
    for read, made in zip(source.episodes, multi, strict=True):
        read.check_invariants()
        assert [t.prompt_ids + t.response_ids for t in read.trajectories] == [
            t.prompt_ids + t.response_ids for t in made.trajectories
        ]
        assert [read.messages_of(t) for t in range(read.num_trajectories)] == [
            made.messages_of(t) for t in range(made.num_trajectories)
        ]
