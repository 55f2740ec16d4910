"""The demonstration warm start: supervised fine-tuning on scripted demonstrations of a tool-using skill,
with a check of that skill, until GRPO has something to reinforce (the quickstart's warm start).

The task is arithmetic through the calculator tool (:mod:`agentboost.environments.arithmetic`). A randomly
initialised model cannot emit a tool call, so it is first fine-tuned on
demonstrations generated from the tasks (real episodes played by a scripted policy: same
token/mask machinery as RL). The demonstrations call the calculator correctly but answer in two
styles, weighted per prompt: the bare number (30%) or a sentence, "The answer is 56." (70%). Only the
bare number earns the exact-match reward, so the warm-started agent uses the tool, prefers the
unrewarded sentence (greedy decoding picks it) and earns reward in ~30% of its samples; GRPO has to
discover and reinforce the rewarded behaviour. The demonstrations are not the task's own expressions:
they are ``demos`` (2048) different expressions with operands up to ``demo_max_value`` (999), far more
than could be answered from memory, so the only way to fit them is the skill the task needs (copy the
expression into the call, the tool's number into the answer). Demonstrating the task's own ~190
training expressions let some seeds memorise them and never copy a new one (seed 12 checked 0.00 for
1500 steps). The warm start runs until the skill is there: every ``warm_start_check_every`` steps the
check tasks (training tasks the demonstrations leave out) are fed to the model as demonstrations in
both styles, and one forward pass reads off exactly what greedy decoding and sampling would do
(:mod:`agentboost.train.forced`); the warm start ends once ``warm_start_target`` (0.8) of the check
tasks are reproduced greedily in *both* styles (whichever style a greedy answer picks) and a sample
earns reward with probability at least half the rewarded style's demonstrated share (``sft_steps`` is
the ceiling: when the copying skill forms differs from seed to seed). A warm start still short of its target
``warm_start_focus_at`` steps in weighs its loss by what the check gets wrong (a seed can copy all but one
token, the operator or a bare answer's first digit, for a thousand steps). At the end the check tasks are also
played for real, greedily and sampled. What the check measured is in summary.json (``warm_start``).
What the warm start reads of the run's options is :class:`DemonstrationOptions` (``agentboost quickstart
--help`` documents each one).

:func:`warm_start_line` is its line of the run's summary.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from ..agents.strands_agent import StrandsAgent
from ..chat.template import ChatTemplate
from ..environments.arithmetic import make_distinct_tasks
from ..episode import Episode
from ..rewards.answer import final_answer_text
from .metrics import MetricsLogger
from .progress import phase_bar
from .sft import SFTRun, demonstration_episodes
from .trainer import GRPOTrainer
from .warm_start import SFTCheckpoint, StepRows, load_trained_state, trained_state

logger = logging.getLogger(__name__)

ENV = "agentboost.environments.arithmetic:ArithmeticEnv"
"""The environment the demonstrations are played in."""
CHECKED = ("greedy", "greedy_bare", "greedy_sentence", "greedy_rewarded", "reproduced", "rewarded")
"""What a check measured (:meth:`DemonstrationWarmStart.measure`) that goes to the run's metrics, as
``warm_start/check_<name>`` in the row of the step it checked."""


class DemonstrationOptions(Protocol):
    """The options the demonstration warm start reads (the quickstart's options: ``agentboost quickstart
    --help`` documents each)."""

    seed: int
    model: str | None
    spaced_expressions: bool
    demos: int
    demo_max_value: int
    verbose_fraction: float
    sft_lr: float
    sft_batch: int
    sft_weight_decay: float
    sft_schedule: str
    warm_start_target: float | None
    warm_start_low: float
    warm_start_restart_at: int
    warm_start_focus_at: int
    warm_start_focus: float
    warm_start_check_every: int
    warm_start_check_tasks: int

    @property
    def demo_ops(self) -> int: ...


def verbose_answer(answer: str) -> str:
    """The unrewarded answer style of the demonstrations."""
    return f"The answer is {answer}."


def demo_turns(*, verbose: bool) -> Callable[[dict[str, Any]], list[str]]:
    """Assistant turns of a demonstration: call the calculator, then answer with the bare number or
    (``verbose``) with a sentence."""

    def turns(row: dict[str, Any]) -> list[str]:
        call = {"name": "calculator", "arguments": {"expression": row["expression"]}}
        first = "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        return [first, verbose_answer(row["answer"]) if verbose else str(row["answer"])]

    return turns


def warm_start_demos(
    rows: list[dict[str, Any]], template: ChatTemplate, agent: StrandsAgent, verbose_fraction: float
) -> tuple[list[Episode], list[float]]:
    """Both answer styles for every row, weighted ``1 - verbose_fraction`` (bare) and
    ``verbose_fraction`` (sentence): SFT on them gives a policy that uses the tool and answers bare
    with probability ~``1 - verbose_fraction`` on *every* prompt (a style drawn once per prompt would
    be memorised per prompt instead, leaving some prompts with no reward to discover)."""
    bare = demonstration_episodes(rows, demo_turns(verbose=False), template, env=ENV, agent=agent)
    sentence = demonstration_episodes(rows, demo_turns(verbose=True), template, env=ENV, agent=agent)
    weights = [1.0 - verbose_fraction] * len(bare) + [verbose_fraction] * len(sentence)
    return bare + sentence, weights


def demonstration_rows(cfg: DemonstrationOptions, check_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tasks the warm start demonstrates: ``cfg.demos`` different expressions of operands up to
    ``cfg.demo_max_value`` (none held out, none a check task; :func:`make_distinct_tasks`)."""
    return make_distinct_tasks(
        cfg.demos, seed=cfg.seed, max_ops=cfg.demo_ops, max_value=cfg.demo_max_value, spaced=cfg.spaced_expressions,
        exclude=[row["expression"] for row in check_rows],
    )  # fmt: skip


def reproduces_demonstration(row: dict[str, Any], episode: Episode) -> bool:
    """Whether a sampled episode does what every demonstration does: one calculator call with the
    task's expression, then the tool's number as the answer (in either style)."""
    calls = [
        block["toolUse"]
        for message in episode.messages
        if message.get("role") == "assistant"
        for block in message.get("content", [])
        if isinstance(block, dict) and "toolUse" in block
    ]
    if len(calls) != 1 or calls[0].get("name") != "calculator":
        return False
    expression = str((calls[0].get("input") or {}).get("expression", ""))
    if expression.split() != str(row["expression"]).split():
        return False
    answer = (final_answer_text(episode) or "").strip()
    return answer in (str(row["answer"]), verbose_answer(row["answer"]))


def warm_start_check_rows(cfg: DemonstrationOptions, train_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first ``cfg.warm_start_check_tasks`` different expressions of the training tasks (GRPO's
    tasks, never held-out ones): the demonstrations leave them out, so the check measures copying on
    expressions the warm start never showed."""
    rows: dict[str, dict[str, Any]] = {}
    for row in train_rows:
        if len(rows) == cfg.warm_start_check_tasks:
            break
        rows.setdefault(row["expression"], row)
    return [{**row, "task_id": f"warm-start-check-{cfg.seed}-{i}"} for i, row in enumerate(rows.values())]


def fresh_weights(model: Any, *, seed: int) -> None:
    """Put freshly initialised weights (drawn with ``seed``, as the model was built) into ``model``."""
    import torch

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        fresh = type(model)(model.config)
    finally:
        torch.random.set_rng_state(state)
    model.load_state_dict(fresh.state_dict())


class DemonstrationWarmStart:
    """Supervised warm start on the demonstrations, with a check of the skill it teaches.

    GRPO can only reinforce what the policy already does sometimes: a warm start that ended before
    the copying skills formed (which happens at a seed-dependent step) leaves groups without reward
    and nothing to learn from. So every ``warm_start_check_every`` steps (with ``warm_start_target``)
    the check tasks, training tasks outside the demonstrations, are fed to the model as demonstrations
    in both answer styles (:meth:`measure`): exact, cheap, and per style. The warm start ends once
    ``target`` of them are reproduced greedily in both styles, a sample earns reward with probability at
    least half the rewarded style's demonstrated share of ``target`` (a model learns the copying before it
    learns the 30% style: stopping on the skills alone left GRPO with no rewarded sample) and greedy
    answers follow the demonstrations' majority style (:meth:`imitates`: at most the rewarded
    style's demonstrated share of check tasks rewarded greedily). ``steps`` is the ceiling. At the
    end the check tasks are also played (greedy and sampled; ``rollout_check``). When no check reached the
    target, GRPO gets the best-checked weights (:meth:`score`), not the last: the last check of a run at its
    ceiling can catch a low. A warning is given when the check of the weights GRPO gets is below
    ``warm_start_low`` (the policy GRPO gets is weak), not merely because the ceiling came first.

    Two remedies for a run that does not get there: one with no sign of the skill and its loss on its plateau,
    not falling off it, at ``warm_start_restart_at`` (or a check soon after) starts again from fresh weights
    (:meth:`stalled`); one still short of its
    target ``warm_start_focus_at`` steps after its weights were fresh weighs every class of model token by how
    often the check gets it wrong (:meth:`focus`, ``SFTRun.focus``), the check's misses naming the token it
    does not copy.

    A warm start (of one of the :mod:`agentboost.train.warm_start` kinds) saves itself at every check
    in its directory and resumes from there; :meth:`run` returns what was measured (summary.json's
    ``warm_start``)."""

    def __init__(self, cfg: DemonstrationOptions, train_rows: list[dict[str, Any]], *, steps: int) -> None:
        self.cfg = cfg
        self.train_rows = train_rows
        self.steps = steps

    @staticmethod
    def summary_line(record: dict[str, Any]) -> str:
        return warm_start_line(record)

    def reward_floor(self, share: float) -> float:
        return 0.5 * (1.0 - self.cfg.verbose_fraction) * share

    def passed(self, reproduced: float, rewarded: float, share: float) -> bool:
        return reproduced >= share and rewarded >= self.reward_floor(share)

    def score(self, check: dict[str, Any]) -> tuple[bool, float, float]:
        """How close a check comes to the target, to pick the weights GRPO gets when no check reached it:
        whether it shows the skill (it passes at ``warm_start_low``) with greedy answers that follow the
        demonstrated style (:meth:`imitates`), then the lower of its two shares of what passing needs (check
        tasks reproduced greedily in both styles, the probability that a sample is rewarded), then their sum
        (each share counted up to 1). An untrained check (nothing reproduced, so nothing rewarded greedily
        either) never outranks a skilled one whose greedy answers are rewarded too often."""
        share = self.cfg.warm_start_target if self.cfg.warm_start_target is not None else self.cfg.warm_start_low
        floor = self.reward_floor(share)
        parts = [
            min(1.0, check["greedy"] / share) if share > 0 else 1.0,
            min(1.0, check["rewarded"] / floor) if floor > 0 else 1.0,
        ]
        shows_skill = self.passed(check["greedy"], check["rewarded"], self.cfg.warm_start_low)
        return shows_skill and self.imitates(check.get("greedy_rewarded")), min(parts), sum(parts)

    def imitates(self, greedy_rewarded: float | None) -> bool:
        """The greedy answers follow the demonstrations' majority style: with demonstrations mostly in the
        unrewarded style, at most the rewarded style's demonstrated share of check tasks (0.3) is rewarded
        greedily (``greedy_rewarded``: answered bare and right). A policy that has learnt the demonstrated
        preference answers (nearly) every task in the majority style greedily; one whose greedy answers are
        still often rewarded has not learnt it yet (the style comes after the skill), and GRPO's job, moving
        the policy from the demonstrated preference to the rewarded one, would be partly done before it
        starts: one seed ended its warm start at 0.70 held-out before GRPO (+0.30 to gain), and with "most"
        (0.5) as the bound seed 113 at 0.44 of its check (0.47 held-out before GRPO, +0.53)."""
        share = 1.0 - self.cfg.verbose_fraction
        return greedy_rewarded is None or self.cfg.verbose_fraction <= 0.5 or greedy_rewarded <= share + 1e-9

    @property
    def restart_from(self) -> int:
        """The first step a restart is considered at (0: never)."""
        return max(self.cfg.warm_start_restart_at, 400) if self.cfg.warm_start_restart_at else 0

    def stalled(self, step: int, skill: float, losses: list[float], *, restarted: bool) -> bool:
        """At a check from ``warm_start_restart_at`` (400 at the earliest: the plateau is measured on steps
        200-300) to 200 steps after it (once, built-in model): no sign of the skill (``skill``: the most
        seen at a check since then) and the loss still on its plateau, not falling off it (see
        the quickstart's ``warm_start_restart_at``)."""
        at = self.restart_from
        if (
            restarted
            or not at
            or not at <= step <= at + 200
            or self.cfg.model is not None
            or skill >= 0.05
            or len(losses) < step
        ):
            return False

        def mean(first: int, last: int) -> float:
            return sum(losses[first:last]) / (last - first)

        on_plateau = mean(step - 100, step) >= 0.75 * mean(200, 300)
        falling = mean(step - 50, step) < 0.92 * mean(step - 100, step - 50)
        return on_plateau and not falling

    def focus(self, misses: dict[str, list[int]]) -> dict[int, float]:
        """Loss weight per class of model token from a check's ``misses`` (see
        the quickstart's ``warm_start_focus_at``)."""
        return {int(c): 1.0 + self.cfg.warm_start_focus * wrong / seen for c, (seen, wrong) in misses.items()}

    def measure(self, trainer: GRPOTrainer, bare: list[Episode], sentence: list[Episode]) -> dict[str, Any]:
        """The check at one step, read off the check tasks' demonstrations in both styles with the
        demonstrations fed in (:func:`agentboost.train.forced.forced`): exact where a rollout check samples,
        and per style (a greedy rollout shows only the style greedy decoding picks: one seed's skill was
        there in the sentence only, 0.81 of its greedy check, and GRPO, which rewards the bare number,
        stayed at 0.34). A style's opening is set aside when the other style is checked, so a bare answer's
        first digit is checked against every other token but "The". ``rewarded`` is the probability that a
        sample is the bare demonstration token for token: a lower bound of the share of samples rewarded.
        ``misses``: per class of model token (:func:`agentboost.train.forced.response_classes`; "-1" the
        choice) that greedy decoding gets wrong somewhere, ``[checked, wrong]``."""
        from .forced import Tally, choice_token, forced

        temperature = trainer.config.sampling.temperature
        opens_bare = [choice_token(e) for e in bare]
        opens_sentence = [choice_token(e) for e in sentence]
        tally: Tally = {}
        b = forced(trainer.model, bare, pad_token_id=trainer.pad_token_id, temperature=temperature,
                   rivals=opens_sentence, tally=tally)  # fmt: skip
        s = forced(trainer.model, sentence, pad_token_id=trainer.pad_token_id, temperature=temperature,
                   rivals=opens_bare, tally=tally)  # fmt: skip
        n = len(b)
        return {
            "misses": {str(c): counts for c, counts in sorted(tally.items()) if counts[1]},
            "greedy": sum(x.greedy and y.greedy for x, y in zip(b, s, strict=True)) / n,
            "greedy_bare": sum(x.greedy for x in b) / n,
            "greedy_sentence": sum(y.greedy for y in s) / n,
            "greedy_rewarded": sum(x.picked and x.greedy for x in b) / n,
            "reproduced": sum(math.exp(x.logprob) + math.exp(y.logprob) for x, y in zip(b, s, strict=True)) / n,
            "rewarded": sum(math.exp(x.logprob) for x in b) / n,
        }

    def rollout_check(self, trainer: GRPOTrainer, check_rows: list[dict[str, Any]], step: int) -> dict[str, Any]:
        """The same tasks played for real at the end (greedy, then sampled as GRPO samples): what the
        forced check predicted, as rollouts see it."""
        by_id = {row["task_id"]: row for row in check_rows}
        sampling = trainer.config.sampling
        result: dict[str, Any] = {}
        for name, params in (("greedy", replace(sampling, temperature=0.0)), ("sampled", sampling)):
            episodes = trainer.rollout(check_rows, n=1, sampling=params, tag=f"warm-start-check-{step}-{name}")
            result[name] = sum(reproduces_demonstration(by_id[e.task_id], e) for e in episodes) / len(episodes)
            result[f"{name}_rewarded"] = sum(e.reward > 0 for e in episodes) / len(episodes)
        return result

    def run(
        self,
        trainer: GRPOTrainer,
        directory: Path | None,
        *,
        progress: bool = True,
        log: MetricsLogger | None = None,
    ) -> dict[str, Any]:
        cfg = self.cfg
        started = time.monotonic()
        check_rows = warm_start_check_rows(cfg, self.train_rows)
        demo_rows = demonstration_rows(cfg, check_rows)
        demos, weights = warm_start_demos(demo_rows, trainer.template, trainer.agent, cfg.verbose_fraction)
        check_bare = demonstration_episodes(check_rows, demo_turns(verbose=False), trainer.template, env=ENV,
                                            agent=trainer.agent)  # fmt: skip
        check_sentence = demonstration_episodes(check_rows, demo_turns(verbose=True), trainer.template, env=ENV,
                                                agent=trainer.agent)  # fmt: skip
        shown = {"demonstrations": len(demo_rows), "demo_max_value": cfg.demo_max_value,
                 "demo_seconds": time.monotonic() - started}  # fmt: skip
        target = cfg.warm_start_target
        sft_run = SFTRun(
            trainer.model, demos, pad_token_id=trainer.pad_token_id, steps=self.steps, lr=cfg.sft_lr,
            batch_size=cfg.sft_batch, seed=cfg.seed, weights=weights, weight_decay=cfg.sft_weight_decay,
            schedule=cfg.sft_schedule,
        )  # fmt: skip
        store = SFTCheckpoint(directory, trainer.model, sft_run) if directory is not None else None
        resumed = store.load() if store is not None else None
        record = dict((resumed or {}).get("record", {}))
        if resumed and resumed["done"]:
            return record
        checks: list[dict[str, Any]] = list(record.get("checks", []))
        # the best-checked weights so far: handed to GRPO if no check reaches the target (the last check of
        # a run at its ceiling can catch a low: one seed's bare style swung 0.0-0.56 between checks)
        kept = (resumed or {}).get("weights", {}).get("best")
        best: dict[str, Any] = {  # its check (one of ``checks``) and its weights, both or neither
            "check": next((c for c in checks if kept is not None and c["step"] == record.get("best_step")), None),
        }
        best["state"] = kept if best["check"] is not None else None
        earlier = float(record.get("seconds", 0.0))
        rows = StepRows(log, sft_run.step)
        bar = phase_bar("warm start", self.steps, unit="steps", progress=progress, initial=sft_run.step,
                        upper_bound=target is not None)  # fmt: skip

        def check(step: int, *, final: bool = False) -> bool:
            record = {"step": step, **self.measure(trainer, check_bare, check_sentence)}
            checks.append(record)
            rows.add(step, **{f"check_{k}": record[k] for k in CHECKED})
            logger.info("warm start step %d: %.2f of check tasks reproduce the demonstrations greedily in both "
                        "styles (bare %.2f, sentence %.2f; %.2f rewarded greedily); a sample reproduces them with "
                        "probability %.2f, the bare one with %.2f", step, record["greedy"], record["greedy_bare"],
                        record["greedy_sentence"], record["greedy_rewarded"], record["reproduced"],
                        record["rewarded"])  # fmt: skip
            goal = f" (target {target:.2f})" if target is not None else ""
            bar.set_postfix_str(f"step {step}: {record['greedy']:.2f} reproduce the demonstrations{goal}, "
                                f"{record['rewarded']:.2f} of samples give the bare answer")  # fmt: skip
            since = [max(c["greedy_bare"], c["greedy_sentence"]) for c in checks if c["step"] >= self.restart_from]
            sign = max(since, default=0.0)  # a sign of the skill at one check since then spares the run
            restarted = any(c.get("restarted") for c in checks)
            room = self.steps - step >= cfg.warm_start_restart_at  # fresh weights need the steps to learn
            if not final and room and self.stalled(step, sign, sft_run.losses, restarted=restarted):
                fresh_weights(trainer.model, seed=cfg.seed * 7919 + 1)
                sft_run.restart(self.steps - step)
                record["restarted"] = True
                rows.add(step, restarted=1.0)
                best.update(check=None, state=None)  # the stalled weights are never handed over
                logger.warning("warm start step %d: no sign of the copying skill and the loss still on its "
                               "plateau: starting again from fresh weights (at most %d more steps)", step,
                               self.steps - step)  # fmt: skip
                return False
            if best["check"] is None or self.score(record) >= self.score(best["check"]):
                best.update(check=record, state=trained_state(trainer.model, device="cpu"))
            passed = (
                target is not None
                and self.passed(record["greedy"], record["rewarded"], target)
                and self.imitates(record["greedy_rewarded"])
            )
            fresh = max((c["step"] for c in checks if c.get("restarted")), default=0)
            if not final and not passed and cfg.warm_start_focus_at and step - fresh >= cfg.warm_start_focus_at:
                for c, w in self.focus(record.get("misses", {})).items():  # weights only grow
                    sft_run.focus[c] = max(w, sft_run.focus.get(c, 1.0))
                record["focus"] = {str(c): round(w, 3) for c, w in sorted(sft_run.focus.items())}
            return passed

        def progress_record() -> dict[str, Any]:
            best_step = best["check"]["step"] if best["check"] is not None else None
            return {"checks": checks, "best_step": best_step, "seconds": earlier + time.monotonic() - started}

        def save(_step: int, stop: bool = False) -> None:
            if store is not None:
                kept = {"best": best["state"]} if best["state"] is not None else None
                store.save({**progress_record(), "stopped": stop}, done=False, weights=kept)

        if record.get("stopped"):  # resumed after its last check ended it (Ctrl-C while playing the check tasks)
            sft_run.steps = sft_run.step

        try:

            def on_step(step: int, loss: float) -> None:
                rows.step(step, loss=loss, lr=sft_run.last_lr)
                bar.update(1)

            losses = sft_run.run(
                until=check if target is not None else None, check_every=cfg.warm_start_check_every,
                after_check=save, on_step=on_step, on_interrupt=save if store is not None else None,
            )  # fmt: skip
            if not checks or checks[-1]["step"] != len(losses):
                check(len(losses), final=True)
                save(len(losses), True)  # Ctrl-C from here on resumes without training or checking again
            last = checks[-1]
            reached = (
                target is not None
                and self.passed(last["greedy"], last["rewarded"], target)
                and self.imitates(last["greedy_rewarded"])
            )
            handed = last
            if not reached and best["check"] is not None and best["check"] is not last:
                handed = best["check"]
                load_trained_state(trainer.model, best["state"], directory or Path("."))
                logger.info("warm start: no check reached the target; GRPO starts from the best-checked weights, "
                            "step %d's (%.2f reproduce the demonstrations greedily in both styles, %.2f of samples "
                            "give the rewarded answer; the last check, step %d: %.2f and %.2f)", handed["step"],
                            handed["greedy"], handed["rewarded"], last["step"], last["greedy"],
                            last["rewarded"])  # fmt: skip
            bar.set_postfix_str(f"playing the {len(check_rows)} check tasks")
            rows.flush()
            played = self.rollout_check(trainer, check_rows, len(losses))
        finally:
            rows.flush()
            bar.close()
        last = handed
        weak = not self.passed(last["greedy"], last["rewarded"], cfg.warm_start_low)
        if weak:
            logger.warning(
                "after %d warm-start steps (GRPO gets step %d's weights) %.2f of check tasks reproduce the "
                "demonstrations greedily in both styles and a sample gives the rewarded answer with probability %.2f "
                "(below %.2f and %.2f; target %s): GRPO starts from a weak policy and may learn little; train longer "
                "(--sft-steps, --warm-start-target) or try another --seed",
                len(losses), last["step"], last["greedy"], last["rewarded"], cfg.warm_start_low,
                self.reward_floor(cfg.warm_start_low), "none" if target is None else f"{target:.2f}",
            )  # fmt: skip
        elif target is not None and not reached:
            logger.info("the warm start reached its ceiling (%d steps) before its target %.2f; the policy passes "
                        "the %.2f that GRPO needs", len(losses), target, cfg.warm_start_low)  # fmt: skip
        share = target if target is not None else cfg.warm_start_low
        result = {
            "steps": len(losses),
            "ceiling": self.steps,
            "handed_over_step": last["step"],
            "target": target,
            "reward_floor": self.reward_floor(share),
            "check": last["greedy"],
            "reproduced": last["reproduced"],
            "rewarded": last["rewarded"],
            "rollout_check": played,
            "reached": reached if target is not None else not weak,
            "weak": weak,
            "checks": checks,
            **shown,
            "final_loss": losses[-1] if losses else None,
            **{k: v for k, v in progress_record().items() if k != "checks"},
        }
        if store is not None:
            store.save(result, done=True)
        return result


def warm_start(
    cfg: DemonstrationOptions,
    trainer: GRPOTrainer,
    train_rows: list[dict[str, Any]],
    *,
    steps: int,
    progress: bool = True,
    directory: Path | None = None,
) -> dict[str, Any]:
    """:class:`DemonstrationWarmStart` of ``steps`` at most (resumable from ``directory`` when given)."""
    return DemonstrationWarmStart(cfg, train_rows, steps=steps).run(trainer, directory, progress=progress)


def warm_start_line(warm: dict[str, Any]) -> str:
    """The warm start's line of the run's summary (what its check measured)."""
    if not warm:
        return "warm start: none"
    ceiling = " (its ceiling)" if warm.get("target") is not None and not warm.get("reached") else ""
    return (
        f"warm start: {warm['steps']} steps{ceiling}; check: {warm['check']:.2f} reproduce the demonstrations "
        f"greedily in both styles, {warm['rewarded']:.2f} of samples give the rewarded answer"
    )
