"""Per-model-call cost of the ``strands_agent`` verl loop vs verl's own ``ToolAgentLoop`` (goal: <= 1 ms added).

Both loops run the same episodes against the same instant server manager (no model, no latency: every
call answers at once from a script): ``--calls - 1`` calls of an ``add`` tool, then a final answer, with a
system prompt and a user turn. Each row gets a new loop object, as verl's ``AgentLoopWorker`` does. The
figure is wall time / model calls, so it includes everything a loop does per episode (env and agent
construction, rendering, parsing, tools, the output record). Needs verl 0.9 (its own environment)::

    python benchmarks/verl_agent_loop_overhead.py [--episodes 64] [--calls 4] [--concurrency 1 16 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "description": "first"},
          "b": {"type": "integer", "description": "second"}}, "required": ["a", "b"]}  # fmt: skip
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
MESSAGES = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "Add 1 to 2, repeatedly."}]


class InstantServerManager:
    """verl's ``LLMServerClient.generate`` contract, answering at once from a per-episode script."""

    def __init__(self, replies: list[list[int]]) -> None:
        from verl.workers.rollout.replica import TokenOutput

        self.token_output = TokenOutput
        self.replies = replies
        self.calls: dict[str, int] = {}

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        k = self.calls.get(request_id, 0)
        self.calls[request_id] = k + 1
        ids = self.replies[min(k, len(self.replies) - 1)]
        return self.token_output(token_ids=ids, log_probs=[-0.1] * len(ids), stop_reason="completed",
                                 extra_fields={"global_steps": 0})  # fmt: skip


def setup(calls: int) -> dict[str, Any]:
    from hydra import compose, initialize_config_module
    from strands import tool
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.tools.function_tool import FunctionTool
    from verl.tools.schemas import OpenAIFunctionToolSchema
    from verl.utils.dataset.rl_dataset import RLHFDataset

    import agentboost.integration.verl_plugin  # noqa: F401 - registers the loop as verl's external_lib would
    from agentboost.chat.template import ChatTemplate
    from agentboost.offline.tokenizer_builder import load_tokenizer

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[
            "actor_rollout_ref.model.path=unused", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.prompt_length=1024", "actor_rollout_ref.rollout.response_length=2048",
            "actor_rollout_ref.rollout.multi_turn.format=hermes", "actor_rollout_ref.rollout.calculate_log_probs=true",
        ])  # fmt: skip
    tokenizer = load_tokenizer("qwen2.5")
    template = ChatTemplate(tokenizer)
    call = "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 1, "b": 2}}) + "\n</tool_call>"
    replies = [[*template.encode(call), template.info.eot_token_id]] * (calls - 1)
    replies.append([*template.encode("The answer is 3."), template.info.eot_token_id])

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first
            b: second
        """
        return a + b

    spec = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": SCHEMA}}
    verl_tool = FunctionTool(name="add", fn=add, tool_schema=OpenAIFunctionToolSchema.model_validate(spec))
    common = {"trainer_config": DictConfigWrap(config), "tokenizer": tokenizer, "processor": None,
              "dataset_cls": RLHFDataset, "data_config": DictConfigWrap(config.data), "hf_model_type": "qwen2",
              "tools": ToolListWrap([verl_tool])}  # fmt: skip
    # The same tool schema (key order included) on both sides, so both send the same prompts.
    return {"common": common, "replies": replies, "strands_tools": [tool(inputSchema={"json": SCHEMA})(add)]}


async def run_loops(kind: str, ctx: dict[str, Any], episodes: int, concurrency: int, calls: int) -> tuple[float, float]:
    """(wall, CPU) seconds per model call for ``episodes`` rows, ``concurrency`` at a time. CPU time (this
    process, all threads) is the steadier figure on a shared machine."""
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    from agentboost.integration.verl_agent_loop import StrandsAgentLoop

    server = InstantServerManager(ctx["replies"])
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            if kind == "ToolAgentLoop":
                loop = ToolAgentLoop(server_manager=server, **ctx["common"])
                output = await loop.run(dict(SAMPLING), raw_prompt=list(MESSAGES))
            else:
                loop = StrandsAgentLoop(server_manager=server, env_args={"tools": ctx["strands_tools"]},
                                        **ctx["common"])  # fmt: skip
                output = await loop.run(dict(SAMPLING), raw_prompt=list(MESSAGES), extra_info={})
                assert output.extra_fields["strands"]["termination"] == "completed", output.extra_fields
            assert sum(output.response_mask) == sum(len(r) for r in ctx["replies"][:calls])

    started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one() for _ in range(episodes)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    assert sum(server.calls.values()) == episodes * calls
    return elapsed / (episodes * calls), cpu / (episodes * calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--calls", type=int, default=4, help="model calls per episode (the last one answers)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per loop; the median is reported")
    args = parser.parse_args()
    ctx = setup(args.calls)

    async def measure() -> dict[str, Any]:
        for kind in ("ToolAgentLoop", "strands_agent"):  # warm-up: imports, template probes, thread pools
            await run_loops(kind, ctx, 4, 4, args.calls)
        results: dict[str, Any] = {}
        for concurrency in args.concurrency:
            samples: dict[str, list[tuple[float, float]]] = {"ToolAgentLoop": [], "strands_agent": []}
            for _ in range(args.repeats):
                for kind, values in samples.items():
                    values.append(await run_loops(kind, ctx, args.episodes, concurrency, args.calls))
            row = {}
            for i, measure_name in enumerate(("wall", "cpu")):
                ref, ours = (statistics.median(s[i] for s in samples[k]) * 1000 for k in samples)
                row[f"{measure_name}_ms_per_call"] = {
                    "ToolAgentLoop": round(ref, 3), "strands_agent": round(ours, 3), "added": round(ours - ref, 3)
                }  # fmt: skip
            results[f"concurrency={concurrency}"] = row
        return results

    results = asyncio.run(measure())
    print(json.dumps({"episodes": args.episodes, "calls_per_episode": args.calls, **results}, indent=2))


if __name__ == "__main__":
    main()
