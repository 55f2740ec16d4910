"""Real episodes (scripted model, real Strands agent and tools) for the viewer and trajectory-table
tests, with hostile text wherever an episode can carry it: tool output, model output, task ids, prompts,
termination details."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from strands import tool

from agentboost.episode import Episode
from agentboost.rollout import RolloutSettings
from agentboost.types import Budget, Termination
from tests.helpers import add, calls_text, explode, mul, run

HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"></script><!--'
MULTIBYTE = "héllo 你好 🎉 naïve"


@tool
def fetch(url: str) -> str:
    """Fetch a web page.

    Args:
        url: the address
    """
    return f"page {url}: {HOSTILE}"


def make_episodes(template: Any) -> list[Episode]:
    """Six episodes over three tasks: rewards 1 and 0, a tool error, hostile tool and model output,
    multi-byte text, a turn limit and an infrastructure failure."""
    tools = [add, mul, explode, fetch]
    hostile_task = f"t2{HOSTILE}"
    scripts: list[tuple[str, list[str], dict[str, Any]]] = [
        ("t0", [calls_text("hermes", [("add", {"a": 2, "b": 3}), ("explode", {"reason": "x"})]),
                calls_text("hermes", [("fetch", {"url": "http://example.invalid"})]), "20"], {}),
        ("t0", ["21 " + HOSTILE], {}),
        ("t1", [MULTIBYTE], {"row": {"prompt": "Say hello in three languages."}}),
        ("t1", [calls_text("hermes", [("mul", {"a": 5, "b": 4})])],
         {"settings": RolloutSettings(budget=Budget(max_turns=1))}),
        (hostile_task, [calls_text("hermes", [("mul", {"a": 5, "b": 4})]), "20"],
         {"row": {"prompt": "What is 5 * 4? " + HOSTILE}}),
    ]  # fmt: skip
    episodes = []
    counts: dict[str, int] = {}
    for task, texts, kwargs in scripts:
        episode, _ = run(template, texts, tools=tools, **kwargs)
        k = counts[task] = counts.get(task, -1) + 1
        episode.id, episode.task_id = f"{task}:{k}", task
        episodes.append(episode)
    episodes.append(Episode.failed(f"{hostile_task}:1", Termination.INFRA_ERROR, f"server down {HOSTILE}",
                                   task_id=hostile_task))  # fmt: skip
    return episodes


def write_jsonl(path: Path, episodes: list[Episode], *, extra_lines: list[str] = ()) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for episode in episodes:
            fh.write(episode.to_json() + "\n")
        for line in extra_lines:
            fh.write(line)
    return path
