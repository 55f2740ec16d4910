"""Tools and a directed fake policy for the worker-pool tests (importable by spawned workers).

The task prompt says which tool to call: ``CALL <tool> <json arguments>``. The policy calls it once,
then answers ``done``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from typing import Any

from strands import tool

from agentboost.backends.base import FINISH_STOP, GenerationRequest, GenerationResult
from agentboost.chat.template import ChatTemplate
from agentboost.tools.strands_code_tool import make_code_tool

_HOARD: list[bytearray] = []


@tool
def crash_worker() -> str:
    """Kill the process this tool runs in."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@tool
async def block_loop(seconds: float) -> str:
    """Block the worker's event loop (a badly written async tool).

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "unblocked"


@tool
def eat_memory(mb: int) -> str:
    """Allocate memory and hold it.

    Args:
        mb: megabytes
    """
    for _ in range(mb // 8):  # in 8 MB pieces, as real code grows: the worker keeps beating
        _HOARD.append(bytearray(8 * 2**20))
    time.sleep(30)
    return "ate"


@tool
def slow(seconds: float) -> str:
    """Sleep in a thread.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "slept"


@tool
def noisy(text: str) -> str:
    """Write to stdout and stderr in every way possible.

    Args:
        text: what to write
    """
    print(text)
    print(text, file=sys.stderr)
    os.write(1, b'{"not": "a protocol message"}\n')
    sys.stdout.flush()
    return "quiet now"


def tools_for(task: dict[str, Any]) -> list[Any]:
    public = [{"input": "", "output": "ok"}]
    return [crash_worker, block_loop, eat_memory, slow, noisy, make_code_tool(public, timeout_s=5.0)]


def reward(task: dict[str, Any], episode: Any) -> float:
    return float(episode.final_text.strip() == "done")


class DirectedPolicy:
    def __init__(self, tokenizer: Any) -> None:
        self.template = ChatTemplate(tokenizer)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        text = self.template.decode(request.prompt_ids)
        if "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
            out = "done"
        else:
            match = re.search(r"CALL (\w+) (\{.*?\})\s*<\|im_end\|>", text, re.DOTALL)
            if match is None:
                out = "done"
            else:
                call = {"name": match.group(1), "arguments": json.loads(match.group(2))}
                out = "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        ids = [*self.template.encode(out), self.template.info.eot_token_id]
        return GenerationResult(ids, [-0.1] * len(ids), FINISH_STOP, server="directed")


def directed_backend(spec: Any, tokenizer: Any) -> DirectedPolicy:
    return DirectedPolicy(tokenizer)
