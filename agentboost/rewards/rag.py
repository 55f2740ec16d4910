"""HotpotQA answer scoring: exact match and token F1 with the official normalisation.

Normalisation (the HotpotQA / SQuAD evaluation scripts): lower-case, drop punctuation, drop the
articles a / an / the, collapse whitespace. F1 follows the official special case: when either side
normalises to ``yes``, ``no`` or ``noanswer`` and the two differ, F1 is 0.

The answer is taken from the agent's final message only (reasoning excluded): the text inside the
last ``<answer>...</answer>`` tag, else the last ``\\boxed{...}``, else the whole final text.
Hedging does not pay: a final text listing several candidates fails exact match, and its F1
shrinks with every extra token. The reward is EM (1/0) by default; F1 and EM are always reported.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from ..episode import Episode
from ..types import RewardOutput
from .answer import final_answer_text
from .math import last_boxed

MAX_ANSWER_CHARS = 1000
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_TEXT_MACRO = re.compile(r"\\text(?:bf|it|rm)?\{([^{}]*)\}")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """The official normalisation: lower-case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str) -> float:
    """Token-level F1 of the normalised strings (0 when a yes/no/noanswer side differs)."""
    pred, gold = normalize_answer(prediction), normalize_answer(truth)
    if (pred in _SPECIAL or gold in _SPECIAL) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def extract_answer(final_text: str) -> str:
    """The agent's answer: last ``<answer>`` tag, else last ``\\boxed{}``, else the final text."""
    text = final_text or ""
    tags = _ANSWER_TAG.findall(text)
    if tags:
        text = tags[-1]
    else:
        boxed = last_boxed(text)
        if boxed is not None:
            text = _TEXT_MACRO.sub(r"\1", boxed)
    return text.strip()[:MAX_ANSWER_CHARS]


def gold_answers(task: dict[str, Any]) -> list[str]:
    """The task's accepted answers (``answers`` list or ``answer`` string); ``ValueError`` if none."""
    answers = task.get("answers")
    if answers is None:
        answers = [task.get("answer")]
    if isinstance(answers, str):
        answers = [answers]
    gold = [str(a) for a in answers if a is not None and str(a).strip()]
    if not gold:
        raise ValueError("RAG task without an answer (fields 'answer' or 'answers')")
    return gold


async def rag_reward(task: dict[str, Any], episode: Episode, *, metric: str | None = None) -> RewardOutput:
    """EM (default) or F1 (``metric="f1"`` or task field ``reward_metric``) against the best gold answer."""
    metric = metric or str(task.get("reward_metric", "em"))
    if metric not in ("em", "f1"):
        raise ValueError(f"reward_metric must be 'em' or 'f1', got {metric!r}")
    gold = gold_answers(task)
    text = final_answer_text(episode)
    answer = extract_answer(text) if text is not None else ""
    if not answer:
        return RewardOutput(0.0, metrics={"em": 0.0, "f1": 0.0, "answered": 0.0}, is_correct=False)
    em = max(exact_match(answer, g) for g in gold)
    f1 = max(f1_score(answer, g) for g in gold)
    reward = em if metric == "em" else f1
    return RewardOutput(reward, metrics={"em": em, "f1": f1, "answered": 1.0}, is_correct=bool(em))
