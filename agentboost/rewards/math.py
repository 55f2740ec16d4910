"""Math reward: final-answer extraction plus symbolic equivalence (math-verify on sympy).

* The answer is taken from the final answer only (:mod:`agentboost.rewards.answer`: a completed
  episode's last assistant text, reasoning and ``<think>`` blocks excluded): the content of
  the **last** ``\\boxed{...}`` (balanced braces). Exactly one candidate is checked, so listing many
  answers (``\\boxed{1} \\boxed{2} ...``) cannot win; an unclosed ``\\boxed{`` is no answer.
* Without a box, the plain answer is the last line that holds a digit or math markup, with an
  answer prefix ("The final answer is", "Answer:"), markdown emphasis, ``$...$`` and a trailing
  period removed. What is left must be a bare expression: a word of two or more letters outside
  LaTeX commands ("204, not 205", "204 (or maybe 205)") means no answer, so prose cannot hedge.
* Equivalence is decided by math-verify (``parse`` + ``verify``), in a killable child process with a
  timeout (hostile expressions can make sympy hang); a timeout, a crash of the check or an error
  inside math-verify on the model's expression counts as not equivalent.
* Reward 1.0 when equivalent, else 0.0; no answer -> 0.0. Metrics: ``has_answer``, ``boxed``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from ..episode import Episode
from ..types import RewardOutput
from .answer import final_answer_text
from .isolated import WorkerDied, default_runner

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 1000


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces, or None."""
    best = None
    for marker in ("\\boxed{", "\\fbox{"):
        start = text.rfind(marker)
        if start != -1 and (best is None or start > best[0]):
            best = (start, marker)
    if best is None:
        return None
    i = best[0] + len(best[1])
    depth = 1
    for j in range(i, len(text)):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None  # unbalanced: no answer


_PREFIX = re.compile(
    r"^(?:(?:so|thus|hence|therefore)\b[\s,]*)?(?:the\s+)?(?:final\s+)?answer\b(?:\s+is\b)?\s*[:=]?\s*", re.I
)
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_MATHY = re.compile(r"[0-9]|\\|\$")


def plain_answer(final_text: str) -> str | None:
    """The unboxed answer: one line, prefix and markup removed, a bare expression or None (module doc)."""
    lines = [line.strip() for line in final_text.strip().splitlines() if line.strip()]
    line = next((line for line in reversed(lines) if _MATHY.search(line)), None)
    if line is None:
        return None
    text = re.sub(r"\*\*|__|`", "", line).strip()
    text = _PREFIX.sub("", text).strip().rstrip(".;!").strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(left) and text.endswith(right) and len(text) > len(left) + len(right):
            text = text[len(left) : -len(right)].strip()
            break
    text = text.rstrip(".;!").strip()
    if not text or "$" in text or _WORD.search(text):
        return None
    return text


def extract_answer(final_text: str) -> tuple[str | None, bool]:
    """(answer candidate, came from \\boxed)."""
    boxed = last_boxed(final_text)
    if boxed is not None:
        return boxed.strip() or None, True
    if "\\boxed{" in final_text or "\\fbox{" in final_text:
        return None, False  # an unclosed box: the model meant to box an answer and did not
    return plain_answer(final_text), False


def _verify(gold: str, answer: str) -> bool:
    from math_verify import parse, verify

    # The caller enforces the timeout by killing this process; math-verify's own (signal-based)
    # timeouts are disabled, which it reports at WARNING on every call.
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    gold_parsed = parse(f"${gold}$" if "$" not in gold else gold, parsing_timeout=None)
    try:
        answer_parsed = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
        if not gold_parsed or not answer_parsed:
            return False
        return bool(verify(gold_parsed, answer_parsed, timeout_seconds=None))
    except Exception as exc:  # hostile input can break sympy in many ways; it is not an answer
        logging.getLogger(__name__).debug("math-verify failed on %r: %s", answer[:100], exc)
        return False


def math_equal(gold: str, answer: str, *, timeout_s: float = 10.0) -> bool:
    """Symbolic equivalence of two answers (isolated, with a timeout; a timeout counts as not equal)."""
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    if answer.strip() == gold.strip():
        return True
    try:
        return bool(default_runner().run(_verify, gold, answer, timeout_s=timeout_s))
    except (TimeoutError, WorkerDied):
        return False


async def math_reward(task: dict[str, Any], episode: Episode) -> RewardOutput:
    """Reward function for math tasks: ``task["answer"]`` is the gold answer."""
    gold = str(task.get("answer", task.get("ground_truth", ""))).strip()
    if not gold:
        raise ValueError("math task without an 'answer'")
    text = final_answer_text(episode)
    answer, boxed = extract_answer(text) if text is not None else (None, False)
    metrics = {"has_answer": float(answer is not None), "boxed": float(boxed), "completed": float(text is not None)}
    if answer is None:
        return RewardOutput(0.0, metrics=metrics, is_correct=False)
    import asyncio

    correct = await asyncio.to_thread(math_equal, gold, answer)
    return RewardOutput(1.0 if correct else 0.0, metrics=metrics, is_correct=correct, info={"answer": answer[:200]})
