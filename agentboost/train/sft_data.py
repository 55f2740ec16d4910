"""Warm-start data from episodes (``agentboost train --sft-data``): what ``agentboost rollout`` and
``agentboost eval`` write, turned into SFT episodes for the model being trained.

Only successful episodes are used (the environment's verdict, else ``reward >= threshold``; ending
``completed``). Each is one of:

* **token-exact, this model's tokens**: a rollout of a model with the trained model's tokenizer and
  chat template (the same template fingerprint, and prompt tokens that decode and re-encode to
  themselves with this tokenizer). Used as it is: its tokens and loss mask are what the model would
  have been trained on in RL;
* **distillation**: an episode with messages but no usable tokens: a frontier model's
  (``--strands-model``: no tokens at all) or one made with another tokenizer. Its assistant turns are
  rendered through the trained model's own chat template (text and tool calls as the template writes an
  assistant message, closed by its end-of-turn token) and replayed, as a scripted policy, through the
  task's environment and the training agent: the prompt, system prompt, tool specs and tool results are
  rendered exactly as they will be in RL, the tools run again and the reward is computed again. A replay
  that no longer succeeds (a tool answered otherwise, a turn longer than ``max_tokens_per_call``) is
  dropped and counted. Replayed episodes are marked ``metadata["distillation"]`` (the teacher, the
  source episode): SFT data only, never an RL row (GRPO's rows are always sampled from the policy).

Episodes of held-out tasks are refused (training on them would leak the evaluation), as are episodes of
tasks a replay cannot find among the training rows. Every drop is counted by reason in ``sources``
(``summary.json``'s ``warm_start``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agents.strands_agent import StrandsAgent
from ..backends.scripted import ScriptedBackend
from ..backends.strands_provider import is_token_exact
from ..chat.messages import strands_to_hf
from ..chat.template import ChatTemplate
from ..data import task_id_of
from ..episode import Episode
from ..errors import TemplateError
from ..evaluation.report import is_success
from ..rollout import RolloutSettings, run_episode
from ..types import Budget, SamplingParams, Termination
from ..utils.gc_pause import collection_deferred
from ..utils.refs import resolve

logger = logging.getLogger(__name__)

DISTILLATION = "distillation"
"""``Episode.metadata`` key of a replayed (distilled) episode: ``{"teacher", "source_episode"}``."""
_PROBE = [
    {"role": "system", "content": "agentboost-probe-system"},
    {"role": "user", "content": "agentboost-probe-user"},
]


@dataclass
class SFTData:
    episodes: list[Episode]
    sources: dict[str, Any] = field(default_factory=dict)
    """Counts: read, token_exact, distilled, and dropped by reason; the files read."""


def read_episodes(paths: list[str | Path]) -> list[Episode]:
    """Every episode of the JSONL files (``episodes.jsonl`` of a rollout or eval run, or its directory)."""
    out: list[Episode] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            path = path / "episodes.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"--sft-data {given}: no such file (an episodes.jsonl or the run directory)")
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    out.append(Episode.from_json(line))
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"--sft-data {path}:{number}: not an episode record ({exc})") from None
    return out


def uses_this_tokenizer(episode: Episode, template: ChatTemplate) -> bool:
    """Whether ``episode``'s tokens are this model's: the same chat template and tool-call format, and
    prompt tokens that this tokenizer decodes and re-encodes to themselves (another vocabulary does not)."""
    if not episode.segments or episode.metadata.get("template") != template.fingerprint:
        return False
    vocab = len(template.tokenizer)
    ids = [t for segment in episode.segments for t in segment.token_ids]
    if any(not 0 <= t < vocab for t in ids):
        return False
    prompt = episode.segments[0].token_ids  # the first trajectory's prompt (an episode may hold several)
    return template.encode(template.decode(prompt)) == prompt


def assistant_turn_ids(template: ChatTemplate, message: dict[str, Any]) -> list[int]:
    """A (Strands) assistant message as this model would emit it: rendered by its own chat template as
    an assistant turn (text, tool calls in the template's format; reasoning dropped), ending with its
    end-of-turn token."""
    (turn,) = strands_to_hf([message])
    turn.pop("reasoning_content", None)
    prefix = template.render(_PROBE, add_generation_prompt=True)
    full = template.render([*_PROBE, turn], add_generation_prompt=False)
    if not full.startswith(prefix):
        raise TemplateError("the chat template renders an assistant turn that does not follow its generation prompt")
    text = full[len(prefix) :]
    eot = template.decode([template.info.eot_token_id])
    end = text.rfind(eot)
    if end < 0:
        raise TemplateError(f"the chat template does not close an assistant turn with {eot!r}")
    return [*template.encode(text[:end]), template.info.eot_token_id]


def assistant_turns(episode: Episode) -> list[dict[str, Any]]:
    """The episode's assistant messages in the order its calls made them: across its trajectories (a
    conversation manager may have trimmed early turns from the final history), else from its messages."""
    if episode.calls:
        turns = []
        for call in episode.calls:
            history = episode.messages_of(call.trajectory)
            if 0 <= call.message_index < len(history) and history[call.message_index].get("role") == "assistant":
                turns.append(history[call.message_index])
        if len(turns) == len(episode.calls):
            return turns
    return [m for m in episode.messages if m.get("role") == "assistant"]


def _teacher(episode: Episode) -> str:
    return str(episode.metadata.get("strands_model") or episode.metadata.get("backend") or "unknown")


def build_sft_data(
    paths: list[str | Path],
    *,
    template: ChatTemplate,
    train_rows: list[dict[str, Any]],
    eval_rows: list[dict[str, Any]],
    env: Any,
    env_args: dict[str, Any] | None,
    agent: StrandsAgent,
    budget: Budget,
    max_tokens_per_call: int,
    threshold: float = 1.0,
) -> SFTData:
    """The SFT episodes of ``paths`` for the model of ``template`` (see module doc)."""
    episodes = read_episodes(paths)
    rows = {task_id_of(row, i): row for i, row in enumerate(train_rows)}
    held_out = {task_id_of(row, i) for i, row in enumerate(eval_rows)} - set(rows)
    dropped: Counter[str] = Counter()
    ready: list[Episode] = []
    to_replay: list[tuple[Episode, dict[str, Any], list[list[int]]]] = []
    for episode in episodes:
        if episode.termination is not Termination.COMPLETED or not is_success(episode, threshold):
            dropped["not successful"] += 1
            continue
        if episode.task_id in held_out:
            dropped["held-out task"] += 1
            continue
        if is_token_exact(episode) and not episode.masked and uses_this_tokenizer(episode, template):
            copy = Episode.from_dict(episode.to_dict())
            copy.metadata["sft_source"] = "token-exact"
            ready.append(copy)
            continue
        row = rows.get(str(episode.task_id))
        if row is None:
            dropped["task not in the training rows"] += 1
            continue
        turns = assistant_turns(episode)
        try:
            script = [assistant_turn_ids(template, m) for m in turns]
        except (TemplateError, KeyError, TypeError, ValueError) as exc:
            logger.debug("episode %s: cannot render its assistant turns: %s", episode.id, exc)
            dropped["assistant turns the template cannot render"] += 1
            continue
        if not script:
            dropped["no assistant turn"] += 1
            continue
        to_replay.append((episode, row, script))
    replayed = _replay(to_replay, template=template, env=env, env_args=env_args or {}, agent=agent, budget=budget,
                       max_tokens_per_call=max_tokens_per_call)  # fmt: skip
    distilled = 0
    for (source, _row, script), episode in zip(to_replay, replayed, strict=True):
        if episode.termination is not Termination.COMPLETED:
            why = "a turn longer than --max-tokens-per-call" if episode.termination is Termination.MAX_TOKENS else ""
            dropped[f"replay ended {episode.termination.value}" + (f" ({why})" if why else "")] += 1
        elif len(episode.calls) != len(script):
            dropped["replay took other turns than the episode"] += 1
        elif not is_success(episode, threshold):
            dropped["replay not successful"] += 1
        else:
            episode.metadata[DISTILLATION] = {"teacher": _teacher(source), "source_episode": source.id}
            episode.metadata["sft_source"] = "distillation"
            ready.append(episode)
            distilled += 1
    sources = {
        "files": [str(p) for p in paths],
        "read": len(episodes),
        "token_exact": len(ready) - distilled,
        "distilled": distilled,
        "dropped": dict(dropped),
    }
    if dropped:
        logger.warning("--sft-data: %d of %d episodes not used: %s", sum(dropped.values()), len(episodes),
                       ", ".join(f"{n} {why}" for why, n in dropped.most_common()))  # fmt: skip
    return SFTData(ready, sources)


def _replay(
    work: list[tuple[Episode, dict[str, Any], list[list[int]]]],
    *,
    template: ChatTemplate,
    env: Any,
    env_args: dict[str, Any],
    agent: StrandsAgent,
    budget: Budget,
    max_tokens_per_call: int,
) -> list[Episode]:
    env_cls = resolve(env)
    settings = RolloutSettings(sampling=SamplingParams(logprobs=False, max_tokens_per_call=max_tokens_per_call),
                               budget=budget)  # fmt: skip

    async def one(source: Episode, row: dict[str, Any], script: list[list[int]]) -> Episode:
        episode_env = env_cls.from_dict({**row, **env_args})
        episode_agent = StrandsAgent(agent.agent_factory, agent.system_prompt, **agent.agent_kwargs)
        return await run_episode(
            episode_env, episode_agent, ScriptedBackend(script), template, settings,
            episode_id=f"distilled:{source.id}", task_id=source.task_id,
        )  # fmt: skip

    async def everything() -> list[Episode]:
        return list(await asyncio.gather(*(one(*item) for item in work)))

    if not work:
        return []
    with collection_deferred():
        return asyncio.run(everything())
