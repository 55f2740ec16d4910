"""τ²-bench reward: tau2's official criteria, by tau2's own evaluator or by a port of its rules.

The official rules (tau2 ``evaluator.evaluate_simulation`` with evaluation type ``all``):

* an episode that did not end by the agent or the user stopping (max steps, errors, our turn
  limits) scores 0; a task without evaluation criteria scores 1;
* **DB**: replay the task's expected actions on a fresh environment from the task's initial
  state; the agent's final database hash (and the user database's) must equal that one. A task
  whose ``actions`` and ``env_assertions`` are both null passes; ``actions: []`` means the agent
  must leave the database unchanged;
* **ENV_ASSERTION**: every environment assertion holds on the agent's final environment;
* **ACTION**: every expected action matches some tool call of the agent: same name and equal
  arguments, compared over ``compare_args`` when the action names them, else over the arguments
  the agent's call has (so an extra argument fails, an omitted one does not);
* **COMMUNICATE**: every ``communicate_info`` string occurs, case-insensitively, in some assistant
  message with text, with commas removed from the message;
* the reward is the product of the components in the task's ``reward_basis`` (default
  ``[DB, COMMUNICATE]``, what every airline/retail task uses); the other components are metrics.

NL assertions: tau2 judges them with an LLM only in the ``all_with_nl_assertions`` evaluation
(marked work in progress upstream); its default ``all`` evaluation skips them and refuses a task
whose ``reward_basis`` contains ``NL_ASSERTION``. We do the same: they are counted
(``nl_assertions_skipped``), never judged, and never part of the reward.

:func:`official_reward` runs tau2's evaluator on the episode turned into tau2 messages: the
predicted environment is rebuilt by tau2 replaying the agent's calls in order (tau2 checks that each
replayed response equals the recorded one). It calls ``evaluate_simulation`` when that imports (it
needs LiteLLM through ``tau2.registry`` and the NL-assertion judge); without LiteLLM it calls
tau2's three evaluator components (``EnvironmentEvaluator``, ``ActionEvaluator``,
``CommunicateEvaluator``, none of which imports LiteLLM) and combines them as above
(``official_full`` metric: 1 or 0). :func:`port_reward` applies the rules directly to the recorded
calls and the agent's live environment, without tau2's evaluator code; the tests check that both
agree. Episodes use the official evaluator unless the row says ``evaluator: port``
(:meth:`agentboost.environments.tau2_env.Tau2Env.compute_reward`, which hands this module the conversation,
how it ended and the environment: this module does not import the environment).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..environments.tau2_domain import ToolRecord, environment_constructor, new_domain_environment
from ..episode import Episode

logger = logging.getLogger(__name__)

DEFAULT_BASIS = ("DB", "COMMUNICATE")
AGENT_STOP, USER_STOP, PREMATURE = "agent_stop", "user_stop", "premature"


@dataclass
class Turn:
    """One message of the conversation as tau2 sees it."""

    role: str  # "assistant" | "user"
    text: str
    calls: list[ToolRecord]


def conversation(episode: Episode, records: list[ToolRecord], *, greeting: str | None = None) -> list[Turn]:
    """The episode's messages with each tool call bound to the domain's recorded response.

    Within one assistant message the calls are put in execution order (the order the database saw
    them), which is the order tau2 replays them in. ``greeting``: the agent's first message in the
    simulated-user protocol (tau2's trajectory starts with it).
    """
    order = {r.call_id: i for i, r in enumerate(records)}
    turns: list[Turn] = [Turn("assistant", greeting, [])] if greeting else []
    for message in episode.transcript():  # the whole conversation, also where a window trimmed it
        role = message.get("role")
        blocks = [b for b in message.get("content", []) if isinstance(b, dict)]
        text = "".join(b["text"] for b in blocks if isinstance(b.get("text"), str))
        ids = [str(b["toolUse"].get("toolUseId")) for b in blocks if isinstance(b.get("toolUse"), dict)]
        calls = [records[order[i]] for i in sorted((i for i in ids if i in order), key=order.__getitem__)]
        if role == "assistant" and (text.strip() or calls):
            turns.append(Turn("assistant", text, calls))
        elif role == "user" and text.strip():
            turns.append(Turn("user", text, []))
    return turns


def _basis(criteria: dict[str, Any]) -> list[str]:
    basis = criteria.get("reward_basis")
    return [str(b).upper() for b in (basis if basis is not None else DEFAULT_BASIS)]


# -- the port ---------------------------------------------------------------------------------
def action_matches(action: dict[str, Any], name: str, arguments: dict[str, Any]) -> bool:
    """tau2's action rule: same tool, equal arguments over ``compare_args`` (default: the call's own)."""
    if action["name"] != name:
        return False
    compare = action.get("compare_args")
    keys = set(arguments if compare is None else compare)
    if not keys:
        return True
    expected = action.get("arguments") or {}
    return {k: v for k, v in arguments.items() if k in keys} == {k: v for k, v in expected.items() if k in keys}


def communicated(info: str, turns: list[Turn]) -> bool:
    needle = info.lower()
    return any(t.role == "assistant" and t.text.strip() and needle in t.text.lower().replace(",", "") for t in turns)


def port_reward(domain: str, task: dict[str, Any], turns: list[Turn], environment: Any, *,
                ending: str = AGENT_STOP) -> dict[str, Any]:  # fmt: skip
    """The official rules applied directly (see module doc). ``environment``: the agent's live one."""
    if ending not in (AGENT_STOP, USER_STOP):
        return {"reward": 0.0, "premature": 1.0}
    criteria = task.get("evaluation_criteria")
    if criteria is None:
        return {"reward": 1.0, "no_criteria": 1.0}
    basis = _basis(criteria)
    if "NL_ASSERTION" in basis:
        raise ValueError("NL_ASSERTION is in the task's reward_basis: tau2 judges it with an LLM (not evaluated)")
    actions = criteria.get("actions")
    assertions = criteria.get("env_assertions")
    db = assertion_reward = 1.0
    if actions is not None or assertions is not None:
        gold = new_domain_environment(domain, task)
        for action in actions or []:
            try:
                gold.make_tool_call(tool_name=action["name"], requestor=action.get("requestor", "assistant"),
                                    **(action.get("arguments") or {}))  # fmt: skip
            except Exception as exc:  # a golden action may fail; tau2 logs it and goes on
                logger.debug("golden action %s failed: %s", action["name"], exc)
        same_db = gold.get_db_hash() == environment.get_db_hash()
        db = float(same_db and gold.get_user_db_hash() == environment.get_user_db_hash())
        if assertions:
            from tau2.data_model.tasks import EnvAssertion

            for assertion in assertions:
                ok = environment.run_env_assertion(EnvAssertion.model_validate(assertion), raise_assertion_error=False)
                assertion_reward *= float(bool(ok))
    calls = [(c.name, c.arguments) for t in turns if t.role == "assistant" for c in t.calls]
    action = float(all(any(action_matches(a, n, args) for n, args in calls) for a in actions or []))
    communicate = float(all(communicated(i, turns) for i in criteria.get("communicate_info") or []))
    components = {"DB": db, "ENV_ASSERTION": assertion_reward, "ACTION": action, "COMMUNICATE": communicate}
    reward = 1.0
    for name in set(basis):
        reward *= components[name]
    skipped = float(len(criteria.get("nl_assertions") or []))
    return {"reward": reward, "db": db, "env_assertions": assertion_reward, "action": action,
            "communicate": communicate, "nl_assertions_skipped": skipped}  # fmt: skip


# -- tau2's own evaluator -----------------------------------------------------------------------
def tau2_messages(turns: list[Turn]) -> list[Any]:
    """Our turns as tau2 messages: assistant messages with their tool calls, each followed by its result."""
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


def _tau2_evaluate(run: Any, task: Any, domain: str) -> tuple[Any, bool]:
    """``evaluate_simulation(run, task, ALL)``; tau2's components combined the same way without LiteLLM."""
    try:
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    except ImportError:  # tau2.registry and the NL-assertion judge import LiteLLM
        pass
    else:
        return evaluate_simulation(run, task, EvaluationType.ALL, solo_mode=False, domain=domain), True

    from tau2.data_model.simulation import RewardInfo, TerminationReason
    from tau2.data_model.tasks import RewardType
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    if run.termination_reason not in (TerminationReason.AGENT_STOP, TerminationReason.USER_STOP):
        return RewardInfo(reward=0.0, reward_basis=None), False
    if task.evaluation_criteria is None:
        return RewardInfo(reward=1.0, reward_basis=None), False
    basis = set(task.evaluation_criteria.reward_basis)
    if RewardType.NL_ASSERTION in basis:
        raise ValueError("NL_ASSERTION is in the task's reward_basis: tau2 judges it with an LLM (not evaluated)")
    env_info = EnvironmentEvaluator.calculate_reward(
        environment_constructor=environment_constructor(domain),
        task=task,
        full_trajectory=run.messages,
        solo_mode=False,
    )
    action_info = ActionEvaluator.calculate_reward(task=task, full_trajectory=run.messages)
    communicate_info = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=run.messages)
    reward, breakdown = 1.0, {}
    for bases, info in (({RewardType.DB, RewardType.ENV_ASSERTION}, env_info), ({RewardType.ACTION}, action_info),
                        ({RewardType.COMMUNICATE}, communicate_info)):  # fmt: skip
        if basis & bases:
            breakdown.update(info.reward_breakdown or {})
            reward *= info.reward
    info = RewardInfo(reward=reward, db_check=env_info.db_check, env_assertions=env_info.env_assertions,
                      action_checks=action_info.action_checks, communicate_checks=communicate_info.communicate_checks,
                      reward_basis=task.evaluation_criteria.reward_basis, reward_breakdown=breakdown)  # fmt: skip
    return info, False


def official_reward(
    domain: str, task: dict[str, Any], turns: list[Turn], *, ending: str = AGENT_STOP
) -> dict[str, Any]:
    """tau2's evaluator (``evaluate_simulation(..., EvaluationType.ALL)``) on the episode."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import Task

    reason = {AGENT_STOP: TerminationReason.AGENT_STOP, USER_STOP: TerminationReason.USER_STOP}.get(
        ending, TerminationReason.MAX_STEPS
    )
    run = SimulationRun(id="agentboost", task_id=str(task.get("id")), start_time="", end_time="", duration=0.0,
                        termination_reason=reason, messages=tau2_messages(turns))  # fmt: skip
    tau2_task = Task.model_validate(task)
    info, full = _tau2_evaluate(run, tau2_task, domain)
    out: dict[str, Any] = {"reward": float(info.reward), "official_full": float(full)}
    if info.reward_basis is None:  # premature termination or no criteria: nothing was checked
        if reason is TerminationReason.MAX_STEPS:
            out["premature"] = 1.0
        else:
            out["no_criteria"] = 1.0
        return out
    out["db"] = float(info.db_check.db_reward) if info.db_check is not None else 1.0
    out["env_assertions"] = float(all(c.met for c in info.env_assertions or []))
    out["action"] = float(all(c.action_match for c in info.action_checks or []))
    out["communicate"] = float(all(c.met for c in info.communicate_checks or []))
    nl = tau2_task.evaluation_criteria.nl_assertions if tau2_task.evaluation_criteria is not None else None
    out["nl_assertions_skipped"] = float(len(nl or []))
    return out
