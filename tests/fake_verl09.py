"""Faithful fakes of the verl 0.9.1 agent-loop contract the ``strands_agent`` loop relies on.

Each piece mirrors the released source (``pip download verl==0.9.1``), as far as the loop touches it:

* ``verl/experimental/agent_loop/agent_loop.py``: ``AgentLoopMetrics``, ``AgentLoopOutput`` (fields,
  defaults, ``as_dict``: ``rm_scores`` = ``reward_score`` on the last response token), ``DictConfigWrap``,
  ``ToolListWrap``, ``AgentLoopBase.__init__`` (what it stores), ``register`` / ``_agent_loop_registry``;
  ``AgentLoopWorker``: how a loop is built per row (``_run_agent_loop``: Hydra ``instantiate`` of the
  registry entry with ``trainer_config``, ``server_manager``, ``tokenizer``, ``processor``,
  ``hf_model_type``, ``dataset_cls``, ``data_config``, ``tools`` plus the entry's own keys), how rows become
  keyword arguments (``generate_sequences``: every non-tensor column of the row), and how outputs
  become the batch (``_agent_loop_postprocess`` + ``_postprocess``: prompts left-padded to
  ``rollout.prompt_length``, responses right-padded to ``rollout.response_length``, ``response_mask``
  times the response attention mask, ``rollout_log_probs`` zero-padded, ``rm_scores`` at the last
  attended response position, every ``extra_fields`` key as an object column).
* ``verl/workers/rollout/llm_server.py``, ``LLMServerClient.generate(request_id, *, prompt_ids,
  sampling_params, ...)``: acquire a server from the load balancer for ``request_id``, call it with a
  fresh vLLM request id per turn, ``setdefault`` ``min/max_global_steps`` in ``extra_fields``, release.
* ``verl/workers/rollout/router.py``, ``GlobalRequestLoadBalancer``: sticky by ``request_id`` (LRU),
  otherwise the server with the fewest in-flight requests.
* ``verl/workers/rollout/vllm_rollout/vllm_async_server.py``, ``vLLMHttpServer.generate``: ``ValueError``
  when the prompt leaves no room under ``max_model_len``; ``max_tokens`` popped from the params (default
  ``min(response_length, prompt_length + response_length - len(prompt))``) and clamped to
  ``[1, max_model_len - len(prompt)]``; ``logprobs`` popped (0 or None for vLLM); ``stop_reason``
  ``"completed"`` for vLLM's ``stop`` and ``length`` alike, ``"aborted"`` for an abort (no tokens);
  ``extra_fields={"global_steps": ...}``; ``TokenOutput`` from ``verl/workers/rollout/replica.py``.
* ``verl/trainer/ppo/core_algos.py`` (``ADV_ESTIMATOR_REGISTRY``, ``register_adv_est`` refusing a second
  function under a name, ``get_adv_estimator_fn``) and ``verl/trainer/ppo/ray_trainer.py``
  (``compute_advantage``: a registered estimator gets ``token_level_rewards``, ``response_mask``,
  ``config`` and ``index`` = the ``uid`` column).

The "model" behind the fake server is a policy ``(prompt_ids, call) -> token ids``.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel

from agentboost.testing.fake_vllm import fake_logprob


class Config(dict):
    """Attribute access over nested dicts: the part of OmegaConf's ``DictConfig`` the loop uses."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        return Config(value) if isinstance(value, dict) and not isinstance(value, Config) else value

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        return Config(value) if isinstance(value, dict) and not isinstance(value, Config) else value


def trainer_config(**overrides: Any) -> Config:
    """The slice of verl's ``ppo_trainer`` config the loop reads (dotted keys override)."""
    config: dict[str, Any] = {
        "actor_rollout_ref": {
            "rollout": {
                "prompt_length": 512, "response_length": 256, "max_model_len": None, "full_determinism": False,
                "calculate_log_probs": True, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                "multi_turn": {"max_assistant_turns": None},
            }
        },
        "data": {"apply_chat_template_kwargs": {}},
        "trainer": {"use_v1": True},
    }  # fmt: skip
    for path, value in overrides.items():
        node = config
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return Config(config)


# -- agent_loop.py --------------------------------------------------------------------------------
class AgentLoopMetrics(BaseModel):
    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
    num_preempted: int = -1


class AgentLoopOutput(BaseModel):
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    routed_experts: Any | None = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics
    extra_fields: dict[str, Any] = {}
    mm_processor_kwargs: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        import torch

        output = self.model_dump(exclude_unset=True)
        output["prompts"] = torch.tensor(output.pop("prompt_ids"), dtype=torch.int64)
        output["responses"] = torch.tensor(output.pop("response_ids"), dtype=torch.int64)
        output["response_mask"] = torch.tensor(output.pop("response_mask"), dtype=torch.int64)
        logprobs = output.pop("response_logprobs", None)
        if logprobs is not None:
            output["rollout_log_probs"] = torch.tensor(logprobs, dtype=torch.float32)
        score = output.pop("reward_score", None)
        if score is not None:
            rm_scores = torch.zeros_like(output["response_mask"], dtype=torch.float32)
            rm_scores[-1] = score
            output["rm_scores"] = rm_scores
        output.setdefault("extra_fields", self.extra_fields.copy())
        return output


class DictConfigWrap:
    def __init__(self, config: Any) -> None:
        self.config = config


class ToolListWrap:
    def __init__(self, tools: list) -> None:
        self.tools = tools


class AgentLoopBase(ABC):
    def __init__(self, trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config,
                 hf_model_type=None, **kwargs):  # fmt: skip
        self.config = trainer_config.config
        self.rollout_config = self.config.actor_rollout_ref.rollout
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.data_config = data_config.config
        self.apply_chat_template_kwargs = self.data_config.get("apply_chat_template_kwargs", {})

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput: ...


def agent_loop_module() -> SimpleNamespace:
    """A fresh ``verl.experimental.agent_loop.agent_loop`` namespace (own registry)."""
    registry: dict[str, dict] = {}

    def register(agent_name: str):
        def decorator(subclass: type) -> type:
            registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
            return subclass

        return decorator

    return SimpleNamespace(
        AgentLoopBase=AgentLoopBase, AgentLoopOutput=AgentLoopOutput, AgentLoopMetrics=AgentLoopMetrics,
        register=register, _agent_loop_registry=registry,
    )  # fmt: skip


# -- core_algos.py / ray_trainer.py ----------------------------------------------------------------
def core_algos_module() -> SimpleNamespace:
    registry: dict[str, Any] = {}

    def register_adv_est(name: str):
        def decorator(fn):
            if name in registry and registry[name] != fn:
                raise ValueError(f"Adv estimator {name} has already been registered: {registry[name]} vs {fn}")
            registry[name] = fn
            return fn

        return decorator

    def get_adv_estimator_fn(name: str):
        if name not in registry:
            raise ValueError(f"Unknown advantage estimator simply: {name}")
        return registry[name]

    return SimpleNamespace(
        ADV_ESTIMATOR_REGISTRY=registry, register_adv_est=register_adv_est, get_adv_estimator_fn=get_adv_estimator_fn
    )


def compute_advantage(core_algos: Any, name: str, batch: dict[str, Any], uids: Any, config: Any = None) -> Any:
    """``ray_trainer.compute_advantage`` for an estimator other than GAE/GRPO."""
    fn = core_algos.get_adv_estimator_fn(name)
    advantages, _ = fn(
        token_level_rewards=batch["rm_scores"], response_mask=batch["response_mask"], config=config, index=uids
    )
    return advantages


# -- rollout servers -------------------------------------------------------------------------------
class TokenOutput(BaseModel):
    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any | None = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = {}


class FakeVLLMServer:
    """``vLLMHttpServer.generate`` over a policy ``(prompt_ids, call_index) -> token ids``."""

    def __init__(self, name: str, policy: Any, *, config: Config, eos_token_id: int, latency_s: float = 0.0) -> None:
        self.name = name
        self.policy = policy
        rollout = config.actor_rollout_ref.rollout
        self.prompt_length, self.response_length = rollout.prompt_length, rollout.response_length
        self.max_model_len = rollout.max_model_len or (self.prompt_length + self.response_length)
        self.eos_token_id = eos_token_id
        self.latency_s = latency_s
        self.global_steps = 7
        self.abort = False
        self.requests: list[dict[str, Any]] = []

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None,
                       audio_data=None, mm_processor_kwargs=None, priority=0):  # fmt: skip
        max_possible = self.max_model_len - len(prompt_ids)
        if max_possible < 1:
            raise ValueError(
                f"Prompt length ({len(prompt_ids)}) leaves no room to generate within the model's maximum "
                f"context length ({self.max_model_len}); need at least 1 token of headroom."
            )
        if "max_tokens" in sampling_params:
            max_tokens = sampling_params.pop("max_tokens")
        else:
            max_tokens = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        max_tokens = max(1, min(max_tokens, max_possible))
        logprobs = 0 if sampling_params.pop("logprobs", False) else None
        self.requests.append({"request_id": request_id, "max_tokens": max_tokens, "prompt_len": len(prompt_ids),
                              "params": dict(sampling_params)})  # fmt: skip
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        else:
            await asyncio.sleep(0)
        extra = {"global_steps": self.global_steps}
        if self.abort:
            return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields=extra)
        ids = list(self.policy(list(prompt_ids)))
        stops = set(sampling_params.get("stop_token_ids") or []) | {self.eos_token_id}
        for i, token in enumerate(ids):
            if token in stops:
                ids = ids[: i + 1]
                break
        ids = ids[:max_tokens]  # vLLM: finish_reason "length"; verl reports it as "completed" too
        lps = [fake_logprob(i, t) for i, t in enumerate(ids)] if logprobs is not None else None
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason="completed", num_preempted=0, extra_fields=extra)


class FakeLoadBalancer:
    """``GlobalRequestLoadBalancer``: sticky sessions (LRU) + least in-flight requests."""

    def __init__(self, servers: dict[str, Any], max_cache_size: int = 10000) -> None:
        self.servers = dict(servers)
        self.inflight = dict.fromkeys(servers, 0)
        self.sticky: OrderedDict[str, str] = OrderedDict()
        self.max_cache_size = max_cache_size

    def acquire_server(self, request_id: str) -> tuple[str, Any]:
        if request_id in self.sticky:
            server_id = self.sticky[request_id]
            self.sticky.move_to_end(request_id)
            self.inflight[server_id] += 1
            return server_id, self.servers[server_id]
        low = min(self.inflight.values())
        server_id = next(sid for sid, count in self.inflight.items() if count == low)
        self.sticky[request_id] = server_id
        if len(self.sticky) > self.max_cache_size:
            self.sticky.popitem(last=False)
        self.inflight[server_id] += 1
        return server_id, self.servers[server_id]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        self.inflight[server_id] -= 1


class FakeLLMServerClient:
    """``LLMServerClient``: what an agent loop sees as ``self.server_manager``."""

    def __init__(self, servers: list[FakeVLLMServer], *, full_determinism: bool = False) -> None:
        self.balancer = FakeLoadBalancer({s.name: s for s in servers})
        self.full_determinism = full_determinism
        self.calls: list[SimpleNamespace] = []
        """Per call: request_id, server, prompt_ids, token_ids, log_probs, stop_reason."""
        self.max_in_flight = 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None,
                       audio_data=None, mm_processor_kwargs=None, **kwargs):  # fmt: skip
        server_id, server = self.balancer.acquire_server(request_id)
        self.max_in_flight = max(self.max_in_flight, sum(self.balancer.inflight.values()))
        try:
            output = await server.generate(
                request_id=request_id if self.full_determinism else uuid.uuid4().hex,
                prompt_ids=list(prompt_ids),
                sampling_params=dict(sampling_params),  # a copy, as through Ray
                image_data=image_data,
                video_data=video_data,
            )
            steps = output.extra_fields.get("global_steps")
            output.extra_fields.setdefault("min_global_steps", steps)
            output.extra_fields.setdefault("max_global_steps", steps)
            self.calls.append(SimpleNamespace(
                request_id=request_id, server=server_id, prompt_ids=list(prompt_ids), token_ids=list(output.token_ids),
                log_probs=output.log_probs, stop_reason=output.stop_reason, params=dict(sampling_params),
            ))  # fmt: skip
            return output
        finally:
            self.balancer.release_server(server_id, request_id=request_id)


# -- AgentLoopWorker ---------------------------------------------------------------------------------
def sampling_params(config: Config) -> dict[str, Any]:
    """``AgentLoopWorker.generate_sequences``: the per-request sampling dict of a training batch."""
    rollout = config.actor_rollout_ref.rollout
    return {"temperature": rollout.temperature, "top_p": rollout.top_p, "top_k": rollout.top_k,
            "repetition_penalty": 1.0, "logprobs": rollout.calculate_log_probs}  # fmt: skip


async def run_rows(
    loop_cls: type,
    rows: list[dict[str, Any]],
    *,
    config: Config,
    tokenizer: Any,
    server_manager: Any,
    entry: dict[str, Any] | None = None,
) -> list[AgentLoopOutput]:
    """``AgentLoopWorker.generate_sequences`` + ``_run_agent_loop``: one loop object per row, all rows at once."""

    async def one(row: dict[str, Any]) -> AgentLoopOutput:
        loop = loop_cls(
            trainer_config=DictConfigWrap(config), server_manager=server_manager, tokenizer=tokenizer,
            processor=None, hf_model_type=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]), **{"name": "strands_agent", **(entry or {})},
        )  # fmt: skip
        return await loop.run(dict(sampling_params(config)), **row)

    return list(await asyncio.gather(*(one(r) for r in rows)))


def postprocess(outputs: list[AgentLoopOutput], *, config: Config, pad_token_id: int) -> dict[str, Any]:
    """``_agent_loop_postprocess`` + ``_postprocess``: the padded training tensors and object columns."""
    import numpy as np
    import torch

    rollout = config.actor_rollout_ref.rollout
    p_len, r_len = rollout.prompt_length, rollout.response_length
    rows = []
    for out in outputs:
        prompt = torch.full((p_len,), pad_token_id, dtype=torch.long)
        prompt_attn = torch.zeros(p_len, dtype=torch.long)
        if out.prompt_ids:
            prompt[p_len - len(out.prompt_ids) :] = torch.tensor(out.prompt_ids)
            prompt_attn[p_len - len(out.prompt_ids) :] = 1
        response = torch.full((r_len,), pad_token_id, dtype=torch.long)
        response_attn = torch.zeros(r_len, dtype=torch.long)
        mask = torch.zeros(r_len, dtype=torch.long)
        response[: len(out.response_ids)] = torch.tensor(out.response_ids, dtype=torch.long)
        response_attn[: len(out.response_ids)] = 1
        mask[: len(out.response_mask)] = torch.tensor(out.response_mask, dtype=torch.long)
        row = {"prompts": prompt, "responses": response, "response_mask": mask * response_attn,
               "attention_mask": torch.cat([prompt_attn, response_attn])}  # fmt: skip
        row["input_ids"] = torch.cat([prompt, response])
        if out.response_logprobs is not None:
            row["rollout_log_probs"] = torch.tensor(
                out.response_logprobs + [0.0] * (r_len - len(out.response_logprobs)), dtype=torch.float32
            )
        rows.append(row)
    batch = {key: torch.stack([r[key] for r in rows]) for key in rows[0]}
    if all(o.reward_score is not None for o in outputs):
        last = batch["attention_mask"][:, p_len:].sum(dim=1) - 1
        rm_scores = torch.zeros_like(batch["response_mask"], dtype=torch.float32)
        rm_scores[torch.arange(len(outputs)), last] = torch.tensor([o.reward_score for o in outputs])
        batch["rm_scores"] = rm_scores
    keys = {k for o in outputs for k in o.extra_fields} | {"turn_scores", "tool_rewards", "min_global_steps",
                                                            "max_global_steps", "extras"}  # fmt: skip
    for key in keys:
        column = np.empty(len(outputs), dtype=object)
        column[:] = [o.extra_fields.get(key) for o in outputs]
        batch[key] = column
    infos = [o.extra_fields.get("reward_extra_info", {}) for o in outputs]
    for key in infos[0]:
        batch[f"reward_extra_info/{key}"] = np.array([info[key] for info in infos])  # KeyError if a row lacks it
    return batch


def arithmetic_policy(template: Any, *, ramble: int = 0):
    """A policy for :class:`FakeVLLMServer`: calls the calculator for the question, then answers with its
    result (``ramble`` extra words first); a question marked ``(guess)`` gets the answer 0 instead."""

    def policy(prompt_ids: list[int]) -> list[int]:
        text = template.decode(prompt_ids[-400:])
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.DOTALL)
        question = re.findall(r"What is (.*?)\?", text)
        if results:
            out = "0" if "(guess)" in text else results[-1]
        else:
            call = {"name": "calculator", "arguments": {"expression": question[-1] if question else "1 + 1"}}
            out = "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
        return [*template.encode(" hmm" * ramble + out), template.info.eot_token_id]

    return policy
