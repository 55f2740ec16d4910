"""tau2 airline/retail: shared per-episode DB, native tool schemas, official evaluator vs the port."""

from __future__ import annotations

import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tau2") is None,
                                reason="tau2-bench is not installed (pip install 'agentboost[tau2]')")  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]


def _tasks(domain: str, split: str = "train") -> list[dict]:
    from agentboost.environments.tau2_env import tau2_modules

    tau2_modules()
    data = Path(importlib.util.find_spec("tau2").origin).parent / "data/tau2/domains" / domain
    wanted = set(json.loads((data / "split_tasks.json").read_text())[split])
    return [t for t in json.loads((data / "tasks.json").read_text()) if t["id"] in wanted]


def _env(domain: str, task: dict, **extra):
    from agentboost.environments.tau2_env import Tau2Env

    env = Tau2Env.from_dict({"domain": domain, "task": json.dumps(task), **extra})
    env.reset()
    return env


def test_tools_share_one_database_per_episode_and_have_native_schemas() -> None:
    task = _tasks("airline")[0]
    env, other = _env("airline", task), _env("airline", task)
    specs = {t.tool_name: t.tool_spec for t in env.tools}
    assert len(specs) == 14 and "book_reservation" in specs
    book = json.dumps(specs["book_reservation"]["inputSchema"]["json"])
    assert '"type": "array"' in book and '"type": "object"' in book  # lists and objects, not strings
    user = json.loads(env.call_tool("c0", "get_user_details", {"user_id": "mia_li_3668"})["content"][0]["text"])
    reservation = user["reservations"][0]
    result = env.call_tool("c1", "cancel_reservation", {"reservation_id": reservation})
    assert result["status"] == "success"
    after = json.loads(env.call_tool("c2", "get_reservation_details", {"reservation_id": reservation})
                       ["content"][0]["text"])  # fmt: skip
    assert after["status"] == "cancelled"  # the read sees the other tool's write
    fresh = json.loads(other.call_tool("c3", "get_reservation_details", {"reservation_id": reservation})
                       ["content"][0]["text"])  # fmt: skip
    assert fresh["status"] != "cancelled"  # another episode's database is untouched
    bad = env.call_tool("c4", "get_user_details", {"user_id": "nobody"})
    assert bad["status"] == "error" and "Error" in bad["content"][0]["text"]
    assert [r.error for r in env.records] == [False, False, False, True]
    assert {t.tool_name for t in _env("retail", _tasks("retail")[0]).tools} >= {"exchange_delivered_order_items"}


def _play(domain: str, task: dict, actions: list[dict], final: str):
    """Run the calls on a fresh episode env; return (env, turns) as an episode would produce them."""
    from agentboost.rewards.tau2 import Turn

    env = _env(domain, task)
    turns = [Turn("user", env.initial_prompt(), [])]
    for i, action in enumerate(actions):
        env.call_tool(f"call-{i}", action["name"], action.get("arguments") or {})
        turns.append(Turn("assistant", "", [env.records[-1]]))
    turns.append(Turn("assistant", final, []))
    return env, turns


def _writes(domain: str, task: dict, actions: list[dict]) -> list[int]:
    """Indices of the actions that change the database."""
    env = _env(domain, task)
    writes, before = [], env.environment.get_db_hash()
    for i, action in enumerate(actions):
        env.call_tool(f"w{i}", action["name"], action.get("arguments") or {})
        after = env.environment.get_db_hash()
        if after != before:
            writes.append(i)
        before = after
    return writes


def _variants(domain: str, task: dict) -> dict[str, tuple[list[dict], str]]:
    criteria = task["evaluation_criteria"]
    gold = list(criteria.get("actions") or [])
    info = " ".join(str(i) for i in criteria.get("communicate_info") or [])
    final = f"All done. {info}".strip()
    out = {"golden": (gold, final)}
    writes = _writes(domain, task, gold)
    if writes:
        out["missing_write"] = ([a for i, a in enumerate(gold) if i != writes[-1]], final)
    if gold:
        out["missing_last_action"] = (gold[:-1], final)
        wrong = json.loads(json.dumps(gold))
        args = wrong[-1].get("arguments") or {}
        for key, value in args.items():
            if isinstance(value, str):
                args[key] = value + "X"
                break
        out["wrong_argument"] = (wrong, final)
        out["extra_write"] = ([*gold, *gold[-1:]], final)
    if info:
        out["not_communicated"] = (gold, "All done.")
    return out


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_port_equals_the_official_evaluator_on_sample_tasks(domain: str) -> None:
    from agentboost.rewards.tau2 import official_reward, port_reward

    cases = golden_ok = 0
    for task in _tasks(domain)[:6]:
        for name, (actions, final) in _variants(domain, task).items():
            env, turns = _play(domain, task, actions, final)
            official = official_reward(domain, task, turns, stopped=True)
            port = port_reward(domain, task, turns, env.environment, stopped=True)
            for key in ("reward", "db", "action", "communicate"):
                assert port[key] == official[key], (domain, task["id"], name, key, port, official)
            cases += 1
            if name == "golden":
                golden_ok += official["reward"] == 1.0
            if name in ("missing_write", "not_communicated"):
                assert official["reward"] == 0.0, (task["id"], name, official)
        stopped_early = official_reward(domain, task, [], stopped=False)
        assert stopped_early["reward"] == port_reward(domain, task, [], None, stopped=False)["reward"] == 0.0
    assert golden_ok == 6 and cases >= 20


def _call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


async def test_strands_episode_with_golden_actions_scores_one_both_ways() -> None:
    from agentboost import StrandsAgent
    from agentboost.backends.scripted import ScriptedBackend, text_script
    from agentboost.environments.tau2_env import Tau2Env
    from agentboost.rollout import RolloutSettings, run_episode
    from agentboost.types import Budget
    from tests.conftest import template_for

    task = _tasks("retail")[0]
    gold = task["evaluation_criteria"]["actions"]
    template = template_for("qwen2.5")
    rewards = {}
    for evaluator in ("official", "port"):
        turns = [_call(a["name"], a["arguments"]) for a in gold] + ["Your exchange is done."]
        env = Tau2Env.from_dict({"domain": "retail", "task": task, "evaluator": evaluator})
        settings = RolloutSettings(budget=Budget(max_turns=20, max_total_tokens=32768))
        episode = await run_episode(env, StrandsAgent(agent_factory="agentboost.environments.tau2_env:tau2_agent"),
                                    ScriptedBackend(text_script(template, turns)), template, settings)  # fmt: skip
        assert episode.termination.value == "completed", episode.termination_detail
        assert episode.tool_calls == len(gold) and episode.tool_errors == 0
        rewards[evaluator] = (episode.reward, episode.reward_metrics)
    assert rewards["official"][0] == rewards["port"][0] == 1.0
    assert rewards["official"][1]["db"] == rewards["port"][1]["db"] == 1.0
    # the same episode without the exchange: the database differs, reward 0
    env = Tau2Env.from_dict({"domain": "retail", "task": task})
    short = [_call(a["name"], a["arguments"]) for a in gold[:-1]] + ["Done."]
    episode = await run_episode(env, StrandsAgent(), ScriptedBackend(text_script(template, short)), template,
                                RolloutSettings(budget=Budget(max_turns=20, max_total_tokens=32768)))  # fmt: skip
    assert episode.reward == 0.0 and episode.reward_metrics["db"] == 0.0


class _FakeUser(BaseHTTPRequestHandler):
    replies = ["Hi, I want to know my membership level. My user id is mia_li_3668.", "Thanks! ###STOP###"]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeUser.seen.append(body)
        text = _FakeUser.replies[min(len(_FakeUser.seen) - 1, len(_FakeUser.replies) - 1)]
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


async def test_simulated_user_drives_the_conversation_until_its_stop_token() -> None:
    from agentboost import StrandsAgent
    from agentboost.backends.scripted import ScriptedBackend, text_script
    from agentboost.environments.tau2_env import Tau2Env
    from agentboost.rollout import RolloutSettings, run_episode
    from tests.conftest import template_for

    _FakeUser.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeUser)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        task = _tasks("airline")[0]
        env = Tau2Env.from_dict({"domain": "airline", "task": task, "user": {"base_url": url, "model": "sim"}})
        template = template_for("qwen2.5")
        turns = [_call("get_user_details", {"user_id": "mia_li_3668"}), "You are a gold member."]
        episode = await run_episode(env, StrandsAgent(), ScriptedBackend(text_script(template, turns)), template,
                                    RolloutSettings())  # fmt: skip
    finally:
        server.shutdown()
    assert episode.termination.value == "completed" and env.user.stopped_by == "###STOP###"
    first_user = episode.messages[0]["content"][0]["text"]
    assert first_user.startswith("Hi, I want to know my membership level")
    assert len(_FakeUser.seen) == 2
    sim_view = _FakeUser.seen[1]["messages"]
    assert "<scenario>" in sim_view[0]["content"]
    assert sim_view[-1] == {"role": "user", "content": "You are a gold member."}
    assert episode.reward in (0.0, 1.0) and "db" in episode.reward_metrics


def test_prepare_script_keeps_tau2_splits_and_every_task_field(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("prep", ROOT / "examples/tau2/prepare_tau2_data.py")
    prep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prep)
    assert prep.main(["--domain", "both", "--limit", "3", "--out-dir", str(tmp_path), "--register", "no"]) == 0
    from agentboost.data import load_rows

    train, test = load_rows(tmp_path / "train.jsonl"), load_rows(tmp_path / "test.jsonl")
    assert [r["domain"] for r in train] == ["airline"] * 3 + ["retail"] * 3 and len(test) == 6
    train_ids = {r["task_id"] for r in train}
    assert not train_ids & {r["task_id"] for r in test}
    original = {t["id"]: t for t in _tasks("airline")}
    row = train[0]
    assert json.loads(row["task"]) == original[row["task_id"].rsplit("-", 1)[1]]  # every field, unchanged
    assert row["prompt"] and _env(row["domain"], json.loads(row["task"])).initial_prompt() == row["prompt"]
