"""The ``strands_agent`` loop inside the real verl 0.9.1 (skipped without it: CI has no verl).

Run in verl 0.9's own environment (docs/gpu-verl.md, "On CPU"; CI's second venv)::

    python -m pytest tests/test_verl_agent_loop_real.py -q

The V1 path the launch scripts use (``AgentLoopWorkerTQ``, TransferQueue, ``_validate``,
``_compute_advantage``, ``_compute_metrics``, the replay buffer) runs for real, end to end, in
``tests/test_verl_cpu_e2e.py``; this file checks the pieces one by one:

* verl's ``AgentLoopWorker`` loads the loop through the shipped YAML (``agent_loop_config_path``, Hydra
  ``instantiate``) and verl's own post-processing turns the outputs into exactly the tensors
  :func:`agentboost.batch.episodes_to_batch` builds for the episodes;
* ``actor_rollout_ref.model.external_lib`` registers the estimator in a fresh process as soon as verl
  builds the model config (what the trainer process does first);
* the V1 trainer's per-row dict (``AgentLoopOutput.as_dict``) and verl's advantage code
  (``compute_advantage``, V1's ``compute_advantage_for_multi_trajectories``) with ``agentboost_grpo``;
* equivalence with verl's own ``ToolAgentLoop`` for conversations both can express, token by token,
  with every difference listed in :func:`test_the_differences_from_tool_agent_loop_are_the_listed_ones`;
* agentboost's replay buffer (Strands metrics at training steps) and the plugin's separate_async fix.

The rollout servers are the fakes of ``tests/fake_verl09.py`` (no GPU, no vLLM).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

try:
    import verl

    VERL_VERSION: str | None = str(verl.__version__)
except ImportError:  # CI: verl 0.9 lives in its own environment
    VERL_VERSION = None

pytestmark = pytest.mark.skipif(
    VERL_VERSION is None or not VERL_VERSION.startswith("0.9."),
    reason=f"needs verl 0.9.x (its own environment, constraints/verl09.txt); installed: {VERL_VERSION}",
)

import torch  # noqa: E402

from agentboost.batch import episodes_to_batch  # noqa: E402
from agentboost.chat.template import ChatTemplate  # noqa: E402
from agentboost.integration import verl_agent_loop  # noqa: E402
from agentboost.train.grpo import group_advantages  # noqa: E402
from tests import fake_verl09 as fv  # noqa: E402
from tests.conftest import tokenizer_for  # noqa: E402

ARITH = "agentboost.environments.arithmetic:ArithmeticEnv"
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from agentboost.offline.tiny_model import build_tiny_qwen2, save_model

    model, tokenizer = build_tiny_qwen2(tokenizer=tokenizer_for("qwen2.5"))
    return str(save_model(model, tokenizer, tmp_path_factory.mktemp("tiny-qwen2")))


def verl_config(model_dir: str, *overrides: str) -> Any:
    """verl's own ``ppo_trainer`` config with the route's Hydra overrides."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.prompt_length=300",
                "actor_rollout_ref.rollout.response_length=256",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={verl_agent_loop.AGENT_LOOP_CONFIG}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=strands_agent",
                "actor_rollout_ref.model.external_lib=agentboost.integration.verl_plugin",
                "algorithm.adv_estimator=agentboost_grpo",
                *overrides,
            ],
        )


def client_for(template: ChatTemplate, policy: Any = None) -> fv.FakeLLMServerClient:
    policy = policy or fv.arithmetic_policy(template)
    servers = [
        fv.FakeVLLMServer(f"s{i}", policy, config=fv.trainer_config(), eos_token_id=template.tokenizer.eos_token_id)
        for i in range(2)
    ]
    return fv.FakeLLMServerClient(servers)


def rows() -> list[dict[str, Any]]:
    """Groups: a = 2 right, 1 wrong, 2 masked; b = 1 right + 1 masked (lone survivor); c = 2 wrong."""

    def arith(question: str, uid: str, guess: bool = False) -> dict[str, Any]:
        prompt = f"What is {question}?" + (" (guess)" if guess else "")
        return {"raw_prompt": [{"role": "user", "content": prompt}], "uid": uid, "data_source": "arith",
                "extra_info": {"prompt": prompt, "answer": str(eval(question))}}  # fmt: skip

    too_long = "What is " + " + ".join(["1"] * 200) + "?"
    return [
        arith("2 + 3", "a"), arith("2 + 3", "a"), arith("2 + 3", "a", guess=True),
        {**arith("1 + 1", "a"), "extra_info": {"prompt": too_long, "answer": "200"}},  # context_overflow
        {"raw_prompt": [], "extra_info": {"answer": "1"}, "uid": "a", "data_source": "arith"},  # no prompt
        arith("4 * 4", "b"), {"raw_prompt": [], "extra_info": {}, "uid": "b", "data_source": "arith"},
        arith("5 - 1", "c", guess=True), arith("5 - 1", "c", guess=True),
    ]  # fmt: skip


def to_dataproto(batch_rows: list[dict[str, Any]]) -> Any:
    import numpy as np
    from verl.protocol import DataProto

    columns = {}
    for key in ("raw_prompt", "extra_info", "uid", "data_source"):
        column = np.empty(len(batch_rows), dtype=object)
        column[:] = [r[key] for r in batch_rows]
        columns[key] = column
    return DataProto(non_tensor_batch=columns, meta_info={"global_steps": 1, "validate": False})


async def episodes_of(config: Any, tokenizer: Any, batch_rows: list[dict[str, Any]]) -> list[Any]:
    """The same rows run by agentboost alone (same deterministic policy, so the same tokens)."""
    runner = verl_agent_loop.shared_runner(config, tokenizer, {}, {})
    client = client_for(runner.template)
    results = await asyncio.gather(*(runner.run(dict(SAMPLING), dict(r), client) for r in batch_rows))
    return [episode for episode, _ in results]


def test_verl_worker_runs_strands_agent_from_the_config_path_and_batches_it_like_episodes_to_batch(model_dir) -> None:
    from verl.experimental.agent_loop import agent_loop as verl_loop
    from verl.trainer.ppo import core_algos

    config = verl_config(model_dir, f"+strands.env_class={ARITH}")

    async def main():
        worker = verl_loop.AgentLoopWorker(config, llm_client=None)  # imports verl_plugin (external_lib)
        template = ChatTemplate(worker.tokenizer)
        worker.llm_client = client_for(template)
        out = await worker.generate_sequences(to_dataproto(rows()))
        return worker, out, await episodes_of(config, worker.tokenizer, rows())

    worker, out, episodes = asyncio.run(main())
    entry = verl_loop._agent_loop_registry["strands_agent"]
    assert entry["_target_"] == "agentboost.integration.verl_agent_loop.StrandsAgentLoop"  # the YAML's entry
    assert core_algos.get_adv_estimator_fn("agentboost_grpo").__name__ == "masked_grpo_advantage"

    reference = episodes_to_batch(
        episodes, pad_token_id=worker.tokenizer.pad_token_id, max_prompt_length=300, max_response_length=256
    )
    for key in ("prompts", "responses", "response_mask", "attention_mask", "input_ids"):
        assert torch.equal(out.batch[key], getattr(reference, key)), key
    assert torch.allclose(out.batch["rollout_log_probs"], reference.rollout_log_probs)
    assert torch.equal(out.batch["rm_scores"], reference.token_level_scores)
    # position_ids agree on every real token; on right padding verl repeats the last position, agentboost writes 0.
    real = reference.attention_mask.bool()
    assert torch.equal(out.batch["position_ids"][real], reference.position_ids[real])
    assert out.batch["rm_scores"].sum(-1).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert out.non_tensor_batch["strands_masked"].tolist() == [0, 0, 0, 1, 1, 0, 1, 0, 0]
    assert [s["termination"] for s in out.non_tensor_batch["strands"]] == [
        "completed", "completed", "completed", "context_overflow", "infra_error",
        "completed", "infra_error", "completed", "completed",
    ]  # fmt: skip
    assert out.meta_info["reward_extra_keys"][0].startswith("strands_")  # logged by verl's validation as val-aux


def test_external_lib_registers_the_estimator_where_the_trainer_builds_its_model_config(model_dir) -> None:
    """A fresh process does what verl's V1 trainer does first (``_init_tokenizer``: the model config as
    ``HFModelConfig``): afterwards ``agentboost_grpo`` is in verl's registry, nothing else imported it."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from hydra import compose, initialize_config_module\n"
        "with initialize_config_module(config_module='verl.trainer.config', version_base=None):\n"
        "    config = compose(config_name='ppo_trainer', overrides=[\n"
        f"        'actor_rollout_ref.model.path={model_dir}', 'actor_rollout_ref.rollout.name=vllm',\n"
        "        'actor_rollout_ref.model.external_lib=agentboost.integration.verl_plugin'])\n"
        "from verl.utils.config import omega_conf_to_dataclass\n"
        "from verl.trainer.ppo import core_algos\n"
        "assert not any(m.startswith('agentboost') for m in sys.modules)\n"
        "omega_conf_to_dataclass(config.actor_rollout_ref.model)\n"
        "print(core_algos.get_adv_estimator_fn('agentboost_grpo').__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=str(Path(__file__).resolve().parents[1]))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "masked_grpo_advantage"


def test_v1_row_dict_and_verls_advantage_code_apply_the_masking_rule(model_dir) -> None:
    import numpy as np
    from verl.protocol import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    config = verl_config(model_dir, f"+strands.env_class={ARITH}")
    tokenizer = tokenizer_for("qwen2.5")
    import agentboost.integration.verl_plugin  # noqa: F401 - what external_lib does in the trainer process

    loop_cls = verl_agent_loop.StrandsAgentLoop  # how Hydra resolves the YAML's _target_

    async def main():
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

        client = client_for(ChatTemplate(tokenizer))
        loops = [
            loop_cls(trainer_config=DictConfigWrap(config), server_manager=client, tokenizer=tokenizer,
                     processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
                     hf_model_type="qwen2", tools=ToolListWrap([]))
            for _ in rows()
        ]  # fmt: skip
        outputs = await asyncio.gather(*(loop.run(dict(SAMPLING), **r) for loop, r in zip(loops, rows(), strict=True)))
        return outputs, await episodes_of(config, tokenizer, rows())

    outputs, episodes = asyncio.run(main())
    reference = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id, max_prompt_length=300,
                                  max_response_length=256)  # fmt: skip
    for i, output in enumerate(outputs):  # V1 stores as_dict() per row in TransferQueue (agent_loop_tq.py)
        row = output.as_dict()
        n_prompt, n_response = len(row["prompts"]), len(row["responses"])
        assert torch.equal(row["prompts"], reference.prompts[i, 300 - n_prompt :])
        assert torch.equal(row["responses"], reference.responses[i, :n_response])
        assert torch.equal(row["response_mask"], reference.response_mask[i, :n_response])
        assert torch.allclose(row["rollout_log_probs"], reference.rollout_log_probs[i, :n_response])
        assert torch.equal(row["rm_scores"], reference.token_level_scores[i, :n_response])

    uids = np.array([r["uid"] for r in rows()], dtype=object)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": reference.token_level_scores, "response_mask": reference.response_mask},
        non_tensors={"uid": uids},
    )
    legacy = compute_advantage(data, adv_estimator="agentboost_grpo", config=AlgoConfig())
    v1 = compute_advantage_for_multi_trajectories(
        DataProto.from_dict(
            tensors={"token_level_rewards": reference.token_level_scores, "response_mask": reference.response_mask},
            non_tensors={"uid": uids},
        ),
        batch_keys=[f"{uid}_{i}_0" for i, uid in enumerate(uids)],
        adv_estimator="agentboost_grpo",
        config=AlgoConfig(),
    )
    expected = group_advantages(reference.rewards, list(uids), reference.masked).unsqueeze(-1) * reference.response_mask
    assert torch.allclose(legacy.batch["advantages"], expected) and torch.allclose(v1.batch["advantages"], expected)
    per_row = expected.sum(-1) / reference.response_mask.sum(-1).clamp(min=1)
    assert per_row[5] == 0 and per_row[0] > 0 > per_row[2]  # b's lone survivor gets 0; a's baseline ignores masks
    # verl's own grpo counts the masked zeros as siblings: b's survivor "beats" a failure it did not cause.
    grpo = compute_advantage(data, adv_estimator="grpo")
    assert grpo.batch["advantages"][5].max() == pytest.approx(0.7071, abs=1e-3)
    assert not torch.allclose(grpo.batch["advantages"][0], expected[0])  # and a's baseline moves


# -- equivalence with verl's own ToolAgentLoop ---------------------------------------------------------
def strands_tools(*, verl_key_order: bool = True, result: str = "json_block") -> list[Any]:
    """``result``: how ``weather`` returns its report: a ``{"json": ...}`` content block, a plain dict, a list."""
    from strands import tool

    add_schema = {"type": "object", "properties": {"a": {"type": "integer", "description": "first"},
                  "b": {"type": "integer", "description": "second"}}, "required": ["a", "b"]}  # fmt: skip
    weather_schema = {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                      "required": ["city"]}  # fmt: skip

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first
            b: second
        """
        return a + b

    def weather(city: str) -> dict:
        """Weather report for a city.

        Args:
            city: the city
        """
        report = {"city": city, "temp_c": 21, "sky": "klar, sonnig"}
        if result == "json_block":
            return {"status": "success", "content": [{"json": report}]}
        return report if result == "dict" else [report, None, True]

    if not verl_key_order:
        return [tool(add), tool(weather)]
    return [tool(inputSchema={"json": add_schema})(add), tool(inputSchema={"json": weather_schema})(weather)]


def verl_tools(result: str = "dict") -> list[Any]:
    from verl.tools.function_tool import FunctionTool
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from agentboost.chat.messages import tool_specs_to_openai

    def weather(city: str) -> Any:
        report = {"city": city, "temp_c": 21, "sky": "klar, sonnig"}
        return [report, None, True] if result == "list" else report

    fns = {"add": lambda a, b: a + b, "weather": weather}
    specs = tool_specs_to_openai([t.tool_spec for t in strands_tools(verl_key_order=False)])
    return [FunctionTool(name=s["function"]["name"], fn=fns[s["function"]["name"]],
                         tool_schema=OpenAIFunctionToolSchema.model_validate(s)) for s in specs]  # fmt: skip


def call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


CONVERSATIONS = {
    "json_result": [call("weather", {"city": "Zürich"}), "Sunny, 21 degrees."],
    "parallel_calls": [call("add", {"a": 2, "b": 3}) + "\n" + call("weather", {"city": "Zürich"}), "5; sunny."],
    "two_rounds": [call("add", {"a": 2, "b": 3}), call("add", {"a": 5, "b": 10}), "15"],
    "no_tool_call": ["I can answer directly: 5."],
}
SYSTEM, USER = "You are a helpful assistant.", "What is 2 + 3, and the weather in Zürich?"


def split_tools(prompt: str) -> tuple[str, list[str]]:
    """(the prompt without its ``<tools>`` block, the block's lines)."""
    start, end = prompt.index("<tools>\n") + len("<tools>\n"), prompt.index("\n</tools>")
    return prompt[:start] + prompt[end:], prompt[start:end].splitlines()


def scripted_client(template: ChatTemplate, texts: list[str]) -> fv.FakeLLMServerClient:
    calls = iter(texts)

    def policy(prompt_ids: list[int]) -> list[int]:
        return [*template.encode(next(calls)), template.info.eot_token_id]

    return fv.FakeLLMServerClient(
        [fv.FakeVLLMServer("s0", policy, config=fv.trainer_config(), eos_token_id=template.tokenizer.eos_token_id)]
    )


def both_loops(
    model_dir: str, texts: list[str], *overrides: str, tools: list[Any] | None = None, verl_result: str = "dict"
) -> tuple:
    """(ToolAgentLoop output, strands_agent output) for the same scripted server replies."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = verl_config(model_dir, "actor_rollout_ref.rollout.prompt_length=1024",
                         "actor_rollout_ref.rollout.multi_turn.format=hermes", *overrides)  # fmt: skip
    tokenizer = tokenizer_for("qwen2.5")
    template = ChatTemplate(tokenizer)
    common = {"trainer_config": DictConfigWrap(config), "tokenizer": tokenizer, "processor": None,
              "dataset_cls": RLHFDataset, "data_config": DictConfigWrap(config.data), "hf_model_type": "qwen2",
              "tools": ToolListWrap(verl_tools(verl_result))}  # fmt: skip
    raw_prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]

    async def main():
        ref = ToolAgentLoop(server_manager=scripted_client(template, texts), **common)
        ours = verl_agent_loop.install()(
            server_manager=scripted_client(template, texts), env_args={"tools": tools or strands_tools()}, **common
        )
        return (
            await ref.run(dict(SAMPLING), raw_prompt=list(raw_prompt)),
            await ours.run(dict(SAMPLING), raw_prompt=list(raw_prompt), extra_info={}),
        )

    return asyncio.run(main())


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_same_tokens_as_verls_tool_agent_loop(model_dir, conversation: str) -> None:
    ref, ours = both_loops(
        model_dir, CONVERSATIONS[conversation], "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=8"
    )
    assert ours.prompt_ids == ref.prompt_ids
    assert ours.response_ids == ref.response_ids
    assert ours.response_mask == ref.response_mask
    assert ours.response_logprobs == ref.response_logprobs
    assert ours.num_turns == ref.num_turns
    assert ours.extra_fields["strands"]["termination"] == "completed"


def test_the_differences_from_tool_agent_loop_are_the_listed_ones(model_dir) -> None:
    """Every way the two loops' outputs differ for these conversations, each shown on its own:

    1. Tool schema key order: Strands' ``@tool`` writes ``{"properties", "required", "type"}``, verl's
       pydantic ``OpenAIFunctionToolSchema`` ``{"type", "properties", "required"}``; the template prints
       them as given, so the system prompts differ inside ``<tools>`` (same JSON). Same tokens when the
       Strands tool declares its schema in verl's order (``@tool(inputSchema=...)``).
    2. Parallel calls: verl runs only the first ``multi_turn.max_parallel_calls`` calls of a reply (default
       1) and silently drops the rest; Strands runs every call. Same tokens with a high enough limit.
    3. Tool results that are neither text nor a dict: verl's function tools render them with ``str()``
       (Python ``repr``: ``None``, ``True``, single quotes), Strands' ``@tool`` with ``json.dumps``
       (``null``, ``true``, double quotes). Text, dicts and ``{"json": ...}`` content render the same
       (both ``json.dumps(..., ensure_ascii=False)``).
    4. ``reward_score``: ``ToolAgentLoop`` leaves it None (verl's reward function scores the row later); the
       Strands loop carries the episode's reward (0 for a masked episode), so verl's reward manager is skipped.
    5. ``extra_fields``: ``ToolAgentLoop`` copies the first call's server fields (``global_steps``,
       ``min/max_global_steps``) and adds ``turn_scores``/``tool_rewards``; the Strands loop has
       ``min/max_global_steps`` over its calls, ``turn_scores``/``tool_rewards`` (empty) and its own
       ``reward_extra_info`` and ``strands``.
    (Also different by configuration, not exercised here: verl cuts tool responses at
    ``multi_turn.max_tool_response_length`` characters, agentboost at ``Budget.max_tool_output_chars``; verl
    cuts a response at ``response_length`` and keeps it trainable, agentboost's budget ends the episode there.)
    """
    tokenizer = tokenizer_for("qwen2.5")
    texts = CONVERSATIONS["parallel_calls"]
    many = "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=8"

    ref, ours = both_loops(model_dir, texts, many, tools=strands_tools(verl_key_order=False))  # 1.
    assert ours.response_ids == ref.response_ids and ours.prompt_ids != ref.prompt_ids
    ours_rest, ours_tools = split_tools(tokenizer.decode(ours.prompt_ids))
    ref_rest, ref_tools = split_tools(tokenizer.decode(ref.prompt_ids))
    assert ours_rest == ref_rest and ours_tools != ref_tools
    assert [json.loads(x) for x in ours_tools] == [json.loads(x) for x in ref_tools]

    ref, ours = both_loops(model_dir, texts)  # 2. verl's default max_parallel_calls=1
    assert ours.prompt_ids == ref.prompt_ids
    assert tokenizer.decode(ref.response_ids).count("<tool_response>") == 1
    assert tokenizer.decode(ours.response_ids).count("<tool_response>") == 2

    json_result = CONVERSATIONS["json_result"]
    ref, ours = both_loops(model_dir, json_result, tools=strands_tools(result="dict"))  # 3.
    assert ours.response_ids == ref.response_ids  # a plain dict: the same JSON
    ref, ours = both_loops(model_dir, json_result, tools=strands_tools(result="list"), verl_result="list")
    assert "[{'city': 'Zürich', 'temp_c': 21, 'sky': 'klar, sonnig'}, None, True]" in tokenizer.decode(ref.response_ids)
    assert '[{"city": "Zürich", "temp_c": 21, "sky": "klar, sonnig"}, null, true]' in tokenizer.decode(
        ours.response_ids
    )

    ref, ours = both_loops(model_dir, CONVERSATIONS["json_result"])  # 4. and 5.
    assert ours.response_ids == ref.response_ids
    assert ref.reward_score is None and ours.reward_score == 0.0  # StrandsEnv without reward_fn: 0
    assert set(ours.extra_fields) - set(ref.extra_fields) == {"reward_extra_info", "strands"}
    assert set(ref.extra_fields) - set(ours.extra_fields) == {"global_steps"}
    for key in ("min_global_steps", "max_global_steps"):
        assert ours.extra_fields[key] == ref.extra_fields[key]


def test_strands_replay_buffer_is_verls_own_and_reports_strands_metrics_once_per_step(monkeypatch) -> None:
    """verl builds the custom sampler with its base arguments only (trainer_base.py:160-167); the Strands buffer
    is verl's ReplayBuffer (sync) or ReplayBufferAsync (async modes) plus strands/* metrics of the rows it hands
    out, pooled over the mini-batches of one step (parameter_sync_step) and reported once."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
    from verl.utils.import_utils import load_extern_type

    from agentboost.integration import verl_sampler

    cls = load_extern_type("pkg://agentboost.integration.verl_sampler", "StrandsReplayBuffer")
    base = {"max_off_policy_threshold": 8, "max_off_policy_strategy": "drop", "sampler_kwargs": {}, "refill_fn": None}
    sync = cls(trainer_mode="sync", trainer_config=OmegaConf.create({}), **base)
    assert type(sync.inner) is ReplayBuffer and sync.sync_steps == 1
    separate = cls(trainer_mode="separate_async", trainer_config=OmegaConf.create({"parameter_sync_step": 2}), **base)
    assert type(separate.inner) is ReplayBufferAsync and separate.sync_steps == 2

    def info(termination: str, masked: float, tools: float) -> dict:
        row = {f"strands_termination_{t}": float(t == termination) for t in ("completed", "max_turns", "infra_error")}
        return {**row, "strands_masked": masked, "strands_tool_calls": tools, "strands_tool_errors": 1.0,
                "strands_latency_s": 2.0 + tools, "strands_model_s": 1.0}  # fmt: skip

    batches = [[info("completed", 0.0, 2.0), info("max_turns", 0.0, 4.0)], [info("infra_error", 1.0, 0.0)] * 2]
    monkeypatch.setattr(verl_sampler, "batch_infos", lambda batch: batch)
    handed = iter([*batches, []])

    def sample(global_steps: int, partition_id: str, batch_size: int) -> tuple:
        return next(handed), {"training/off_policy/evicted_samples": 0}

    monkeypatch.setattr(separate.inner, "sample", sample)
    _, first = separate.sample(global_steps=5, partition_id="train", batch_size=2)
    _, second = separate.sample(global_steps=5, partition_id="train", batch_size=2)
    assert not any(k.startswith("strands/") for k in first)  # reported once, with the step's last mini-batch
    assert second["strands/episodes"] == 4 and second["strands/masked_fraction"] == 0.5
    assert second["strands/termination/infra_error"] == 0.5 and second["strands/termination/completed"] == 0.25
    assert second["strands/tool_calls_per_episode"] == 1.5 and second["strands/tool_error_rate"] == pytest.approx(4 / 6)
    assert second["strands/latency_s/max"] == 6.0 and second["training/off_policy/evicted_samples"] == 0
    _, val = separate.sample(global_steps=5, partition_id="val", batch_size=2)
    assert not any(k.startswith("strands/") for k in val)  # validation: verl's val-aux/* already has them


def test_plugin_keeps_verls_separate_async_trainer_from_crashing_on_its_own_log_call(monkeypatch) -> None:
    """verl 0.9.1's PPOTrainerSeparateAsync._setup logs with ``flush=True`` when hybrid_engine=false (ASYNC=separate):
    at INFO, logging raises TypeError and the trainer dies before its first step."""
    import logging
    import sys

    import verl.trainer.ppo.v1.trainer_separate_async as separate

    from agentboost.integration.verl_plugin import quiet_separate_async_logger

    monkeypatch.setattr(separate.logger, "level", logging.INFO)  # the module's default (VERL_LOGGING_LEVEL unset)
    with pytest.raises(TypeError, match="flush"):
        separate.logger.info("standalone replicas only", flush=True)
    assert sys.modules["verl.trainer.ppo.v1.trainer_separate_async"] is separate
    assert quiet_separate_async_logger() is True
    separate.logger.info("standalone replicas only", flush=True)  # skipped below WARNING: no crash
    assert quiet_separate_async_logger() is False  # idempotent
