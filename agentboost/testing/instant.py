"""An instant fake policy for benchmarks and pool tests: no model, no latency.

Episode shape with the arithmetic environment: call 0 asks the calculator for the task's expression,
call 1 answers with the tool's result; ``turns`` > 2 inserts more calculator calls first. It reads
what it needs from the prompt tokens, like a model would, and returns canonical token ids.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..backends.base import FINISH_STOP, GenerationRequest, GenerationResult


class InstantPolicy:
    def __init__(self, tokenizer: Any, turns: int = 2) -> None:
        from ..chat.template import ChatTemplate

        self.template = ChatTemplate(tokenizer)
        self.turns = turns
        self.calls = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        text = self.template.decode(request.prompt_ids[-400:])
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.DOTALL)
        question = re.findall(r"What is (.*?)\?", text)
        done = text.count("<tool_response>")
        if results and done >= self.turns - 1:
            out = results[-1]
        else:
            expression = question[-1] if question else "1 + 1"
            out = (
                "<tool_call>\n"
                + json.dumps({"name": "calculator", "arguments": {"expression": expression}})
                + "\n</tool_call>"
            )
        ids = [*self.template.encode(out), self.template.info.eot_token_id][: request.max_tokens]
        return GenerationResult(
            ids, [-0.5] * len(ids) if request.sampling.logprobs else None, FINISH_STOP, server="instant"
        )

    def describe(self) -> str:
        return "instant"


def instant_backend(spec: Any, tokenizer: Any) -> InstantPolicy:
    return InstantPolicy(tokenizer)
