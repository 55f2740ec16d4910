"""τ²-bench reward: tau2's official criteria, by tau2's own evaluator or by a port of its rules.

The official rules (tau2 ``evaluator.evaluate_simulation`` with evaluation type ``all``):

* an episode that did not end by the agent or the user stopping (max steps, errors) scores 0;
  a task without evaluation criteria scores 1;
* **DB**: replay the task's expected actions on a fresh environment from the task's initial
  state; the agent's final database hash (and the user database's) must equal that one;
* **ENV_ASSERTION**: every environment assertion holds on the agent's final environment;
* **ACTION**: every expected action matches some tool call of the agent: same name and equal
  arguments, compared over ``compare_args`` when the action names them, else over the arguments
  the agent's call has;
* **COMMUNICATE**: every ``communicate_info`` string occurs, case-insensitively, in some assistant
  text message with commas removed;
* the reward is the product of the components in the task's ``reward_basis`` (default
  ``[DB, COMMUNICATE]``); the others are reported as metrics. NL assertions are judged by an LLM
  upstream and only when requested (``all_with_nl_assertions``); they are not evaluated here
  (reported as ``nl_assertions_not_evaluated``), as in tau2's default ``all`` evaluation.

:func:`official_reward` calls tau2's evaluator on the episode turned into tau2 messages (the
predicted environment is rebuilt by replaying the agent's calls, and tau2 checks that every replayed
response equals the recorded one). :func:`port_reward` applies the rules above directly to the
recorded calls and the live environment, without tau2's evaluator code; tests check that both
agree. Episodes use the official evaluator when tau2 is importable (it always is: the domain needs
it), the port with ``evaluator="port"`` in the row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..episode import Episode
from ..types import RewardOutput, Termination

if TYPE_CHECKING:
    from ..environments.tau2_env import Tau2Env, ToolRecord

logger = logging.getLogger(__name__)

DEFAULT_BASIS = ("DB", "COMMUNICATE")
ENV_BASES = {"DB", "ENV_ASSERTION"}


@dataclass
class Turn:
    """One message of the conversation as tau2 sees it."""

    role: str  # "assistant" | "user"
    text: str
    calls: list[ToolRecord]


def conversation(episode: Episode, records: list[ToolRecord]) -> list[Turn]:
    """The episode's messages with each tool call bound to the domain's recorded response."""
    by_id = {r.call_id: r for r in records}
    turns: list[Turn] = []
    for message in episode.messages:
        role = message.get("role")
        blocks = [b for b in message.get("content", []) if isinstance(b, dict)]
        text = "".join(b["text"] for b in blocks if "text" in b)
        calls = [by_id[str(b["toolUse"].get("toolUseId"))] for b in blocks
                 if "toolUse" in b and str(b["toolUse"].get("toolUseId")) in by_id]  # fmt: skip
        if role == "assistant" and (text.strip() or calls):
            turns.append(Turn("assistant", text, calls))
        elif role == "user" and text.strip():
            turns.append(Turn("user", text, []))
    return turns


def _criteria(task: dict[str, Any]) -> dict[str, Any] | None:
    return task.get("evaluation_criteria")


def _basis(criteria: dict[str, Any]) -> list[str]:
    basis = criteria.get("reward_basis")
    return [str(b).upper() for b in (basis if basis is not None else DEFAULT_BASIS)]


# -- the port ---------------------------------------------------------------------------------
def action_matches(action: dict[str, Any], name: str, arguments: dict[str, Any]) -> bool:
    if action["name"] != name:
        return False
    compare = action.get("compare_args")
    keys = list(arguments) if compare is None else list(compare)
    if not keys:
        return True
    expected = action.get("arguments") or {}
    return {k: v for k, v in arguments.items() if k in keys} == {k: v for k, v in expected.items() if k in keys}


def communicated(info: str, turns: list[Turn]) -> bool:
    needle = info.lower()
    return any(t.role == "assistant" and t.text.strip() and needle in t.text.lower().replace(",", "") for t in turns)


def port_reward(domain: str, task: dict[str, Any], turns: list[Turn], environment: Any, *,
                stopped: bool) -> dict[str, Any]:  # fmt: skip
    """The official rules applied directly (see module doc). ``environment``: the agent's live one."""
    from ..environments.tau2_env import new_domain_environment

    if not stopped:
        return {"reward": 0.0, "note": "premature termination"}
    criteria = _criteria(task)
    if criteria is None:
        return {"reward": 1.0, "note": "no evaluation criteria"}
    basis = _basis(criteria)
    actions = criteria.get("actions")
    assertions = criteria.get("env_assertions")
    if actions is None and assertions is None:
        env_reward, db = 1.0, 1.0
        assertion_reward = 1.0
    else:
        gold = new_domain_environment(domain, task)
        for action in actions or []:
            try:
                gold.make_tool_call(tool_name=action["name"], requestor=action.get("requestor", "assistant"),
                                    **(action.get("arguments") or {}))  # fmt: skip
            except Exception as exc:  # a golden action may legitimately fail; tau2 logs and goes on
                logger.debug("golden action %s failed: %s", action["name"], exc)
        db = float(gold.get_db_hash() == environment.get_db_hash()
                   and gold.get_user_db_hash() == environment.get_user_db_hash())  # fmt: skip
        assertion_reward = 1.0
        for assertion in assertions or []:
            from tau2.data_model.tasks import EnvAssertion

            ok = environment.run_env_assertion(EnvAssertion.model_validate(assertion), raise_assertion_error=False)
            assertion_reward *= float(bool(ok))
        env_reward = (db if "DB" in basis else 1.0) * (assertion_reward if "ENV_ASSERTION" in basis else 1.0)
    calls = [(c.name, c.arguments) for t in turns for c in t.calls]
    action = float(all(any(action_matches(a, n, args) for n, args in calls) for a in (actions or [])))
    communicate = float(all(communicated(i, turns) for i in (criteria.get("communicate_info") or [])))
    reward = 1.0
    if set(basis) & ENV_BASES:
        reward *= env_reward
    if "ACTION" in basis:
        reward *= action
    if "COMMUNICATE" in basis:
        reward *= communicate
    return {"reward": reward, "db": db, "env_assertions": assertion_reward, "action": action,
            "communicate": communicate, "nl_assertions_not_evaluated": "NL_ASSERTION" in basis}  # fmt: skip


# -- tau2's own evaluator -----------------------------------------------------------------------
def tau2_messages(turns: list[Turn]) -> list[Any]:
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    messages: list[Any] = []
    for turn in turns:
        if turn.role == "user":
            messages.append(UserMessage(role="user", content=turn.text))
            continue
        calls = [ToolCall(id=c.call_id, name=c.name, arguments=c.arguments, requestor="assistant") for c in turn.calls]
        messages.append(AssistantMessage(role="assistant", content=turn.text or None, tool_calls=calls or None))
        for c in turn.calls:
            messages.append(ToolMessage(id=c.call_id, role="tool", content=c.content, requestor="assistant",
                                        error=c.error))  # fmt: skip
    return messages


def official_reward(domain: str, task: dict[str, Any], turns: list[Turn], *, stopped: bool,
                    user_stop: bool = False) -> dict[str, Any]:  # fmt: skip
    """tau2's ``evaluate_simulation(..., EvaluationType.ALL)`` on the episode."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import Task
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    if stopped:
        reason = TerminationReason.USER_STOP if user_stop else TerminationReason.AGENT_STOP
    else:
        reason = TerminationReason.MAX_STEPS
    run = SimulationRun(id="agentboost", task_id=str(task.get("id")), start_time="", end_time="", duration=0.0,
                        termination_reason=reason, messages=tau2_messages(turns))  # fmt: skip
    info = evaluate_simulation(run, Task.model_validate(task), EvaluationType.ALL, solo_mode=False, domain=domain)
    out: dict[str, Any] = {"reward": float(info.reward)}
    for key, value in (info.reward_breakdown or {}).items():
        out[str(getattr(key, "value", key)).lower()] = float(value)
    if info.reward_basis is None:  # premature termination or no criteria: nothing was checked
        return out
    out["db"] = float(info.db_check.db_reward) if info.db_check is not None else 1.0
    out["action"] = float(all(c.action_match for c in info.action_checks or []))
    out["communicate"] = float(all(c.met for c in info.communicate_checks or []))
    return out


def evaluate_episode(env: Tau2Env, episode: Episode) -> RewardOutput:
    """The reward of a finished Tau2Env episode (official evaluator unless the row asks for the port)."""
    turns = conversation(episode, env.records)
    stopped = episode.termination is Termination.COMPLETED
    if env.task.get("evaluator", "official") == "port":
        result = port_reward(env.domain, env.tau2_task, turns, env.environment, stopped=stopped)
    else:
        user_stop = env.user is not None and env.user.stopped_by is not None
        result = official_reward(env.domain, env.tau2_task, turns, stopped=stopped, user_stop=user_stop)
    reward = float(result["reward"])
    metrics = {k: float(v) for k, v in result.items() if isinstance(v, int | float) and k != "reward"}
    return RewardOutput(reward, metrics=metrics, is_correct=reward >= 1.0)
