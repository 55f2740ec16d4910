"""The ``strands_agent`` verl loop vs verl's own ``ToolAgentLoop`` on one real vLLM CPU server, side by side.

Both loops run the same conversations (the arithmetic system prompt, a question, the calculator tool) against the
same vLLM server, through the server class verl's trainer calls on this machine (the CPU layer's real-vLLM
rollout, :class:`agentboost.integration.verl_vllm.VllmRolloutServer`), greedy: the same prompt tokens get the same
reply, so both loops hold the same conversations (checked token for token, reported as ``identical`` and
``identical_episodes``). For that the two sides see the tool alike: its schema with the keys in the order verl
renders them, and its result as the text the Strands loop renders (:func:`tool_text`). Each row gets a new loop
object, as verl's ``AgentLoopWorker`` does; runs alternate loop by loop, the median is reported.

* ``tokens_per_s``: tokens vLLM generated / wall time (goal: strands_agent >= 0.95 x ToolAgentLoop);
* ``cpu_ms_per_call``: this process's CPU time per model call (vLLM runs in its own process): everything a loop
  does around a call, the server client included (goal: strands_agent adds <= 1 ms);
* ``calls_in_flight``: the calls' seconds with the server over the wall time (at most the concurrency): how well
  a loop keeps the server fed.

Needs verl 0.9 (its own environment) and a vLLM server of the model (the warm-started tiny model of
:func:`agentboost.integration.verl_cpu_run.prepare_assets`, which calls the calculator). On a small machine give
the server and the loops their own cores: sharing them, a loop's waits are the OS's scheduling of that core
(consecutive runs of one loop at 8 concurrent episodes differed 2.4x on 2 shared cores)::

    taskset -c 0 python -m agentboost.integration.verl_vllm --python VLLM_PY --model DIR --log vllm.log &  # URL
    taskset -c 1 python benchmarks/verl_loop_vllm.py --vllm-url URL --model DIR [--episodes 32] [--concurrency 1 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
# Questions whose greedy conversation is the same under both loops with the warm-started tiny model. On some others
# ("90 - 45", "33 + 66") its tool call is not valid JSON: ToolAgentLoop ends the episode there, the Strands loop
# returns the parse error to the model and goes on (another call): the conversations, and so the figures, differ.
QUESTIONS = ("12 + 7", "3 * 4 - 5", "81 - 9", "6 * 7", "15 + 27 * 2", "8 * 9 + 1", "7 * 8", "5 * 12")


class CountingServerManager:
    """verl's ``LLMServerClient.generate`` contract over one :class:`VllmRolloutServer`, counting calls, tokens and
    the seconds calls spent with the server (their sum over the wall time: how many were in flight on average)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.calls = 0
        self.tokens = 0
        self.server_s = 0.0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        started = time.perf_counter()
        output = await self.server.generate(list(prompt_ids), dict(sampling_params), f"{request_id}-{self.calls}")
        self.server_s += time.perf_counter() - started
        self.calls += 1
        self.tokens += len(output.token_ids)
        return output


def tool_text(expression: str) -> str:
    """The calculator for ``ToolAgentLoop``: its result as the text the Strands loop's tool message holds.
    (verl's ``FunctionTool`` would send the tool's dict as JSON, ``{"status": "success", "content": [...]}``,
    where the Strands loop sends ``19``: the next replies, and so the conversations, would differ.)"""
    from agentboost.chat.messages import tool_result_text
    from agentboost.tools.calculator import calculator

    return tool_result_text(calculator(expression=expression))


async def setup(url: str, model_dir: str) -> dict[str, Any]:
    from hydra import compose, initialize_config_module
    from strands import tool
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.tools.function_tool import FunctionTool
    from verl.tools.schemas import OpenAIFunctionToolSchema
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer import hf_tokenizer

    import agentboost.integration.verl_plugin  # noqa: F401 - registers the loop as verl's external_lib would
    from agentboost.environments.arithmetic import SYSTEM_PROMPT
    from agentboost.integration.verl_vllm import VllmRolloutServer
    from agentboost.tools.calculator import calculator

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=agentboost_vllm",
            "actor_rollout_ref.rollout.prompt_length=1024", "actor_rollout_ref.rollout.response_length=256",
            "actor_rollout_ref.rollout.multi_turn.format=hermes", "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
            f"++actor_rollout_ref.rollout.custom.agentboost.vllm_url={url}",
        ])  # fmt: skip
    server = VllmRolloutServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model)
    await server.ready()  # the model's weights, whatever the server held
    spec = calculator.tool_spec
    schema = {"type": "function", "function": {"name": spec["name"], "description": spec["description"],
                                               "parameters": spec["inputSchema"]["json"]}}  # fmt: skip
    verl_schema = OpenAIFunctionToolSchema.model_validate(schema)
    verl_tool = FunctionTool(name=spec["name"], fn=tool_text, tool_schema=verl_schema)
    # verl renders the schema as its pydantic model dumps it (keys in the model's order: type, properties,
    # required); the Strands loop renders the tool spec as given. The same JSON, keys in the same order, or the
    # prompts differ from the first call on.
    parameters = verl_schema.model_dump(exclude_unset=True, exclude_none=True)["function"]["parameters"]
    strands_calculator = tool(name=spec["name"], description=spec["description"],
                              inputSchema={"json": parameters})(calculator.__wrapped__)  # fmt: skip
    common = {"trainer_config": DictConfigWrap(config), "tokenizer": hf_tokenizer(model_dir), "processor": None,
              "dataset_cls": RLHFDataset, "data_config": DictConfigWrap(config.data), "hf_model_type": "qwen2",
              "tools": ToolListWrap([verl_tool])}  # fmt: skip
    prompts = [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"What is {q}?"}]
               for q in QUESTIONS]  # fmt: skip
    return {"server": server, "common": common, "prompts": prompts, "strands_tools": [strands_calculator]}


async def run_loops(kind: str, ctx: dict[str, Any], episodes: int, concurrency: int) -> dict[str, Any]:
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    from agentboost.integration.verl_agent_loop import StrandsAgentLoop

    manager = CountingServerManager(ctx["server"])
    gate = asyncio.Semaphore(concurrency)
    sequences: list[list[int]] = [[] for _ in range(episodes)]

    async def one(i: int) -> None:
        messages = ctx["prompts"][i % len(ctx["prompts"])]
        async with gate:
            if kind == "ToolAgentLoop":
                loop = ToolAgentLoop(server_manager=manager, **ctx["common"])
                output = await loop.run(dict(SAMPLING), raw_prompt=list(messages))
            else:
                loop = StrandsAgentLoop(server_manager=manager, env_args={"tools": ctx["strands_tools"]},
                                        **ctx["common"])  # fmt: skip
                output = await loop.run(dict(SAMPLING), raw_prompt=list(messages), extra_info={})
        sequences[i] = list(output.prompt_ids) + list(output.response_ids)

    started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(episodes)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {"tokens_per_s": manager.tokens / wall, "cpu_ms_per_call": 1000 * cpu / manager.calls,
            "calls": manager.calls, "tokens": manager.tokens, "in_flight": manager.server_s / wall,
            "sequences": sequences}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-url", required=True)
    parser.add_argument("--model", required=True, type=Path, help="the model directory the server serves")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per loop; the median is reported")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    async def measure() -> dict[str, Any]:
        ctx = await setup(args.vllm_url, str(args.model.resolve()))
        for kind in ("ToolAgentLoop", "strands_agent"):  # warm-up: imports, template probes, thread pools
            await run_loops(kind, ctx, 4, 4)
        results: dict[str, Any] = {}
        for concurrency in args.concurrency:
            runs: dict[str, list[dict[str, Any]]] = {"ToolAgentLoop": [], "strands_agent": []}
            for _ in range(args.repeats):
                for kind, values in runs.items():
                    values.append(await run_loops(kind, ctx, args.episodes, concurrency))
            row: dict[str, Any] = {}
            for name in ("tokens_per_s", "cpu_ms_per_call"):
                ref, ours = (statistics.median(r[name] for r in runs[k]) for k in runs)
                row[name] = {"ToolAgentLoop": round(ref, 3), "strands_agent": round(ours, 3)}
            row["tokens_per_s"]["ratio"] = round(
                row["tokens_per_s"]["strands_agent"] / row["tokens_per_s"]["ToolAgentLoop"], 3
            )
            row["cpu_ms_per_call"]["added"] = round(
                row["cpu_ms_per_call"]["strands_agent"] - row["cpu_ms_per_call"]["ToolAgentLoop"], 3
            )
            row["calls_per_run"] = {k: runs[k][0]["calls"] for k in runs}
            row["tokens_per_run"] = {k: runs[k][0]["tokens"] for k in runs}
            row["calls_in_flight"] = {k: round(statistics.median(r["in_flight"] for r in runs[k]), 2) for k in runs}
            row["identical"] = all(a["sequences"] == b["sequences"] for a, b in zip(*runs.values(), strict=True))
            first = [r["sequences"] for r in (runs["ToolAgentLoop"][0], runs["strands_agent"][0])]
            row["identical_episodes"] = sum(a == b for a, b in zip(*first, strict=True))
            results[f"concurrency={concurrency}"] = row
        await ctx["server"].shutdown()
        return results

    results = {"episodes": args.episodes, **asyncio.run(measure())}
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
