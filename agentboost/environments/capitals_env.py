"""Capitals: a small tool-use QA task scored by strands-agents-evals evaluators (``--example capitals``).

The agent looks a country up with the ``country_facts`` tool and answers with its capital. Tasks are
generated from an embedded table (no download). The reward is an
:class:`~agentboost.rewards.strands_evals.EvaluatorReward` over three deterministic strands-evals
evaluators, one per kind of evidence:

* ``Contains(capital, case_sensitive=False)``: the final answer names the capital;
* ``ToolCalled("country_facts")``: the trajectory used the tool;
* ``StateEquals("looked_up")``: the environment's state (the countries the tool was asked about,
  recorded in ``episode.metadata["environment_state"]``) is exactly the asked country.

With the environment argument ``judge=openai:<model>@<base_url>`` (``--env-arg judge=...``; the key
from ``judge_api_key_env=NAME`` if the endpoint needs one) an LLM judge joins them: strands-evals'
``OutputEvaluator`` with :data:`JUDGE_RUBRIC`, asked through that OpenAI-compatible endpoint (cached,
bounded, its failures masked as infrastructure errors).
"""

from __future__ import annotations

import random
from typing import Any

from ..episode import Episode
from ..rewards.strands_evals import EvaluatorReward, judge_model
from ..types import RewardOutput
from .strands_env import _RESERVED, StrandsEnv

SYSTEM_PROMPT = (
    "You answer geography questions. Look the country up with the country_facts tool, "
    "then answer with the name of its capital."
)
JUDGE_RUBRIC = (
    "Score 1.0 if the output names the expected capital city as the answer and says nothing false; "
    "0.5 if it names the capital but adds a false statement; 0.0 otherwise."
)

CAPITALS: dict[str, tuple[str, str]] = {
    "France": ("Paris", "Europe"),
    "Germany": ("Berlin", "Europe"),
    "Italy": ("Rome", "Europe"),
    "Spain": ("Madrid", "Europe"),
    "Portugal": ("Lisbon", "Europe"),
    "Poland": ("Warsaw", "Europe"),
    "Norway": ("Oslo", "Europe"),
    "Greece": ("Athens", "Europe"),
    "Japan": ("Tokyo", "Asia"),
    "India": ("New Delhi", "Asia"),
    "Thailand": ("Bangkok", "Asia"),
    "Vietnam": ("Hanoi", "Asia"),
    "Egypt": ("Cairo", "Africa"),
    "Kenya": ("Nairobi", "Africa"),
    "Ghana": ("Accra", "Africa"),
    "Morocco": ("Rabat", "Africa"),
    "Canada": ("Ottawa", "North America"),
    "Mexico": ("Mexico City", "North America"),
    "Cuba": ("Havana", "North America"),
    "Brazil": ("Brasilia", "South America"),
    "Argentina": ("Buenos Aires", "South America"),
    "Peru": ("Lima", "South America"),
    "Chile": ("Santiago", "South America"),
    "Australia": ("Canberra", "Oceania"),
    "New Zealand": ("Wellington", "Oceania"),
}


def make_tasks(n: int, *, seed: int = 0, split: str = "eval") -> list[dict[str, Any]]:
    """``n`` tasks (countries repeat when ``n`` exceeds the table), deterministic for a seed."""
    rng = random.Random(f"capitals:{split}:{seed}")
    countries = sorted(CAPITALS)
    rng.shuffle(countries)
    tasks = []
    for i in range(n):
        country = countries[i % len(countries)]
        tasks.append(
            {
                "task_id": f"capitals-{split}-{seed}-{i}",
                "prompt": f"What is the capital of {country}?",
                "country": country,
                "answer": CAPITALS[country][0],
                "expected_environment_state": {"looked_up": [country]},
            }
        )
    return tasks


def make_tools(lookups: list[str]) -> list[Any]:
    """A fresh ``country_facts`` tool that records every country it is asked about in ``lookups``."""
    from strands import tool

    @tool
    def country_facts(country: str) -> str:
        """Facts about a country: its capital and continent.

        Args:
            country: the country's English name, e.g. "France"
        """
        name = str(country).strip()
        lookups.append(name)
        match = next((c for c in CAPITALS if c.lower() == name.lower()), None)
        if match is None:
            return f"Unknown country {name!r}."
        capital, continent = CAPITALS[match]
        return f"{match}: capital {capital}; continent {continent}."

    return [country_facts]


def _evaluators(task: dict[str, Any]) -> list[Any]:
    from strands_evals.evaluators import Contains, StateEquals, ToolCalled

    return [
        Contains(str(task["answer"]), case_sensitive=False, name="answer"),
        ToolCalled("country_facts", name="used_tool"),
        StateEquals("looked_up"),
    ]


capitals_reward = EvaluatorReward(_evaluators)
"""The deterministic reward (no judge)."""


class CapitalsEnv(StrandsEnv):
    """The capitals task: its tool (fresh per episode), its state and its evaluator reward."""

    def __init__(
        self,
        task: dict[str, Any] | None = None,
        tools: Any = None,
        reward_fn: Any = None,
        *,
        judge: str | None = None,
        judge_api_key_env: str | None = None,
        **kwargs: Any,
    ) -> None:
        if reward_fn is None and judge:
            model = judge_model(judge, api_key_env=judge_api_key_env)

            def with_judge(task: dict[str, Any]) -> list[Any]:
                from strands_evals.evaluators import OutputEvaluator

                return [*_evaluators(task), OutputEvaluator(JUDGE_RUBRIC, model=model, name="judge")]

            reward_fn = EvaluatorReward(with_judge)
        super().__init__(task, tools=tools, reward_fn=reward_fn or capitals_reward, **kwargs)
        self.lookups: list[str] = []

    @classmethod
    def from_dict(cls, info: dict[str, Any]) -> CapitalsEnv:  # type: ignore[override]
        row = dict(info)
        kwargs = {key: row.pop(key) for key in (*_RESERVED, "judge", "judge_api_key_env") if key in row}
        return cls(task=row, **kwargs)

    def make_tools(self) -> list[Any]:
        if self._tools_spec is not None:
            return super().make_tools()
        self.lookups = []
        return make_tools(self.lookups)

    def environment_state(self) -> dict[str, Any]:
        """What StateEquals compares: the countries looked up, sorted, without repeats."""
        return {"looked_up": sorted(set(self.lookups))}

    async def compute_reward(self, episode: Episode) -> RewardOutput:
        state = self.environment_state()
        episode.metadata["environment_state"] = state
        if isinstance(self.reward_fn, EvaluatorReward):
            return await self.reward_fn.score(self.task, episode, tools=self.tools, environment_state=state)
        return await super().compute_reward(episode)
