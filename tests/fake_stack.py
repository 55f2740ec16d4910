"""Faithful fakes of the rLLM v0.2.1.post1 / veRL 0.6.1 interfaces the adapters hook into.

Each fake mirrors what the adapter touches in the real source (read from the tagged releases):

* veRL ``vllm_async_server`` module namespace: ``vLLMHttpServerBase`` with ``config.max_model_len``
  (prompt_length + response_length), ``config.get``, ``model_config.processor/lora_rank``, ``engine``
  (vLLM ``AsyncLLM``: ``generate(prompt=, sampling_params=, request_id=, lora_request=)`` is an async
  generator of ``RequestOutput``; each ``CompletionOutput`` has ``token_ids``, ``logprobs`` (one
  ``{token_id: Logprob}`` dict per sampled token), ``finish_reason``, ``stop_reason``), ``wake_up``;
  ``TokenOutput`` (pydantic: ``token_ids``, ``log_probs``), ``SamplingParams``, ``TokensPrompt``.
* A Ray actor handle: ``handle.generate.remote(**kwargs)`` returns an awaitable ``ObjectRef``.
* rLLM ``AsyncAgentExecutionEngine`` fields the adapter uses: ``agent_class``, ``env_class``,
  ``agent_args``, ``env_args``, ``envs``, ``agents``, ``tokenizer``, ``config``, ``engine_name``,
  ``n_parallel_agents`` and ``rollout_engine`` (rLLM's ``VerlEngine``: ``rollout_manager.server_handles``,
  async ``wake_up()``/``sleep()`` over the replicas).

The "model" behind the fake vLLM engine is :class:`agentboost.testing.instant.InstantPolicy`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel

from agentboost.backends.base import GenerationRequest
from agentboost.testing.fake_vllm import fake_logprob
from agentboost.testing.instant import InstantPolicy
from agentboost.types import SamplingParams as ABSampling


class TokenOutput(BaseModel):
    token_ids: list[int]
    log_probs: list[float] | None = None


@dataclass
class FakeSamplingParams:  # the fields of vllm.SamplingParams the server passes
    max_tokens: int
    logprobs: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")


@dataclass
class FakeTokensPrompt:
    prompt_token_ids: list[int]
    multi_modal_data: Any = None


class FakeConfig(dict):
    def __init__(self, max_model_len: int) -> None:
        super().__init__(repetition_penalty=1.0)
        self.max_model_len = max_model_len


class FakeVLLMEngine:
    """vLLM's AsyncLLM as the server sees it, driven by a policy; can ignore max_tokens like real 0.6.1 would not."""

    def __init__(self, tokenizer: Any) -> None:
        self.policy = InstantPolicy(tokenizer)
        self.requests: list[tuple[str, FakeSamplingParams, int]] = []
        self.ramble: int = 0
        """Extra tokens to append before the end of turn (to provoke length stops)."""
        self.abort: bool = False
        """End every generation early with vLLM's ``abort`` (preemption, engine shutdown)."""

    async def generate(self, *, prompt: FakeTokensPrompt, sampling_params: FakeSamplingParams, request_id: str,
                       lora_request: Any = None):  # fmt: skip
        self.requests.append((request_id, sampling_params, len(prompt.prompt_token_ids)))
        request = GenerationRequest(
            prompt_ids=list(prompt.prompt_token_ids), sampling=ABSampling(), max_tokens=10**6, request_id=request_id
        )
        result = await self.policy.generate(request)
        ids = list(result.token_ids)
        if self.ramble:
            filler = self.policy.template.encode(" hmm" * self.ramble)
            ids = filler + ids
        finish, stop_reason = "stop", None
        if len(ids) > sampling_params.max_tokens:
            ids, finish = ids[: sampling_params.max_tokens], "length"
        if self.abort:
            ids, finish = ids[:2], "abort"
        await asyncio.sleep(0)
        logprobs = None
        if sampling_params.logprobs is not None:
            logprobs = [{t: SimpleNamespace(logprob=fake_logprob(i, t))} for i, t in enumerate(ids)]
        completion = SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=finish, stop_reason=stop_reason)
        yield SimpleNamespace(outputs=[completion])


class FakeServerBase:
    """The part of veRL 0.6.1's ``vLLMHttpServerBase`` the adapter relies on (upstream generate semantics)."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.config = FakeConfig(max_model_len)
        self.model_config = SimpleNamespace(processor=None, lora_rank=0)
        self.engine = FakeVLLMEngine(tokenizer)
        self.woken = 0
        self.slept = 0

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None):  # upstream 0.6.1 semantics
        max_tokens = self.config.max_model_len - len(prompt_ids)
        sampling_params["logprobs"] = 0 if sampling_params.pop("logprobs", False) else None
        params = FakeSamplingParams(max_tokens=max_tokens, **sampling_params)  # TypeError if max_tokens given
        final = None
        async for out in self.engine.generate(
            prompt=FakeTokensPrompt(prompt_ids), sampling_params=params, request_id=request_id
        ):
            final = out
        ids = final.outputs[0].token_ids
        lps = (
            [d[t].logprob for t, d in zip(ids, final.outputs[0].logprobs, strict=True)]
            if params.logprobs is not None
            else None
        )
        return TokenOutput(token_ids=ids, log_probs=lps)

    async def wake_up(self):
        self.woken += 1

    async def sleep(self):
        self.slept += 1


def server_namespace() -> dict[str, Any]:
    """A fresh copy of the server module's namespace (so install() can run once per test)."""

    class vLLMHttpServerBase(FakeServerBase):  # the upstream name
        pass

    return {
        "vLLMHttpServerBase": vLLMHttpServerBase,
        "TokenOutput": TokenOutput,
        "SamplingParams": FakeSamplingParams,
        "TokensPrompt": FakeTokensPrompt,
        "_qwen2_5_vl_dedup_image_tokens": lambda ids, processor: ids,
    }


class FakeRef:
    def __init__(self, coro: Any) -> None:
        self._task = asyncio.ensure_future(coro)

    def __await__(self):
        return self._task.__await__()

    def cancel(self) -> None:
        self._task.cancel()


class FakeMethod:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> FakeRef:
        return FakeRef(self.fn(*args, **kwargs))


class FakeActorHandle:
    """A Ray actor handle over a local server object."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.generate = FakeMethod(server.generate)
        self.wake_up = FakeMethod(server.wake_up)
        self.sleep = FakeMethod(server.sleep)


class FakeReplica:
    def __init__(self, handle: FakeActorHandle) -> None:
        self._server_handle = handle

    async def wake_up(self) -> None:
        await self._server_handle.wake_up.remote()

    async def sleep(self) -> None:
        await self._server_handle.sleep.remote()


class FakeVerlEngine:
    """rLLM's ``VerlEngine``: wake_up/sleep over ``rollout_manager.rollout_replicas``."""

    def __init__(self, handles: list[FakeActorHandle]) -> None:
        replicas = [FakeReplica(h) for h in handles]
        self.rollout_manager = SimpleNamespace(server_handles=handles, rollout_replicas=replicas)
        self.phases: list[str] = []

    async def wake_up(self) -> None:
        self.phases.append("wake_up")
        await asyncio.gather(*[r.wake_up() for r in self.rollout_manager.rollout_replicas])

    async def sleep(self) -> None:
        self.phases.append("sleep")
        await asyncio.gather(*[r.sleep() for r in self.rollout_manager.rollout_replicas])


def engine_namespace(handles: list[FakeActorHandle]) -> dict[str, Any]:
    class AsyncAgentExecutionEngine:  # the constructor arguments rLLM's trainer passes, and what it stores
        upstream_calls: list[str] = []

        def __init__(self, engine_name="openai", tokenizer=None, rollout_engine=None, config=None,
                     agent_class=None, env_class=None, agent_args=None, env_args=None,
                     n_parallel_agents=128, **kwargs):  # fmt: skip
            self.engine_name = engine_name
            self.tokenizer = tokenizer
            self.config = config
            self.agent_class, self.env_class = agent_class, env_class
            self.agent_args, self.env_args = agent_args or {}, env_args or {}
            self.n_parallel_agents = n_parallel_agents
            self.envs: list[Any] = []
            self.agents: list[Any] = []
            self.rollout_engine = FakeVerlEngine(handles) if engine_name == "verl" else None

        def update_envs_and_agents(self, envs, agents):
            for idx, env in enumerate(envs):
                env.idx = idx
            self.envs, self.agents = envs, agents

        async def trajectory_generator(self, reset_seed=0, timing_raw=None, mode="Text", **kwargs):
            self.upstream_calls.append("trajectory_generator")
            yield {"upstream": True}

        async def execute_tasks(self, tasks):
            self.upstream_calls.append("execute_tasks")
            return ["upstream"] * len(tasks)

    return {"AsyncAgentExecutionEngine": AsyncAgentExecutionEngine}


def training_config(**overrides: Any) -> dict[str, Any]:
    """The slice of rLLM's Hydra config the adapters read (plain dicts stand in for OmegaConf)."""
    config: dict[str, Any] = {
        "data": {"max_prompt_length": 512, "max_response_length": 256, "train_batch_size": 2},
        "actor_rollout_ref": {
            "rollout": {
                "temperature": 0.7, "top_p": 0.95, "top_k": -1, "do_sample": True, "n": 4,
                "val_kwargs": {"temperature": 0.3, "top_p": 1.0, "top_k": 5, "do_sample": False, "n": 2},
            }
        },
        "rllm": {"agent": {"max_steps": 4, "trajectory_timeout": None}, "stepwise_advantage": {"enable": False}},
        "trainer": {"default_local_dir": "/tmp"},
    }  # fmt: skip
    for path, value in overrides.items():
        node = config
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return config


def adapted_server(tokenizer: Any, max_model_len: int = 1024) -> Any:
    from modified_verl_files import vllm_async_server as server_adapter

    ns = server_namespace()
    assert server_adapter.install(ns) is True
    assert server_adapter.install(ns) is False  # idempotent
    return ns["vLLMHttpServerBase"](tokenizer, max_model_len)


def make_engine(tokenizer: Any, n_servers: int = 2, config: dict | None = None, **kwargs: Any) -> tuple[Any, list]:
    """An adapted execution engine over ``n_servers`` adapted fake rollout servers."""
    from agentboost import StrandsAgent
    from agentboost.environments.arithmetic import ArithmeticEnv
    from modified_rllm_files import agent_execution_engine as engine_adapter

    servers = [adapted_server(tokenizer) for _ in range(n_servers)]
    handles = [FakeActorHandle(s) for s in servers]
    ns = engine_namespace(handles)
    assert engine_adapter.install(ns) is True and engine_adapter.install(ns) is False
    cls = ns["AsyncAgentExecutionEngine"]
    assert cls.__name__ == "AsyncAgentExecutionEngine" and issubclass(cls, ns["UpstreamAsyncAgentExecutionEngine"])
    kwargs.setdefault("agent_class", StrandsAgent)
    kwargs.setdefault("env_class", ArithmeticEnv)
    engine = cls(engine_name="verl", tokenizer=tokenizer, config=config or training_config(),
                 n_parallel_agents=8, **kwargs)  # fmt: skip
    return engine, servers


def load_rows(engine: Any, rows: list[dict], n: int) -> None:
    """What rLLM's ``init_envs_and_agents`` does after ``batch.repeat(n, interleave=True)``."""
    from agentboost import StrandsAgent

    repeated = [row for row in rows for _ in range(n)]
    engine.update_envs_and_agents([engine.env_class.from_dict(dict(r)) for r in repeated],
                                  [StrandsAgent() for _ in repeated])  # fmt: skip


# -- veRL DataProto and rLLM's AgentPPOTrainer, as far as the trainer adapter touches them ----------
class FakeTensorDict(dict):
    """Like tensordict.TensorDict: ``key in td`` is refused (rLLM uses ``td.keys()``)."""

    def __contains__(self, key: object) -> bool:
        raise NotImplementedError("TensorDict does not support membership checks with `in`; use .keys()")


class FakeDataProto:
    def __init__(self, tensors: dict[str, Any], non_tensors: dict[str, Any] | None = None) -> None:
        self.batch = FakeTensorDict(tensors)
        self.non_tensor_batch = dict(non_tensors or {})
        self.meta_info: dict[str, Any] = {}

    @classmethod
    def from_dict(cls, tensors: dict[str, Any], non_tensors: dict[str, Any] | None = None, meta_info: Any = None):
        sizes = {len(v) for v in tensors.values()} | {len(v) for v in (non_tensors or {}).values()}
        assert len(sizes) == 1, f"ragged batch: {sizes}"
        for value in (non_tensors or {}).values():
            assert value.__class__.__name__ == "ndarray"
        return cls(tensors, non_tensors)

    def __len__(self) -> int:
        return len(next(iter(self.batch.values())))

    def union(self, other: FakeDataProto) -> FakeDataProto:
        for key in other.non_tensor_batch:
            assert key not in self.non_tensor_batch, f"union conflict on {key}"
        self.batch.update(other.batch)
        self.non_tensor_batch.update(other.non_tensor_batch)
        return self


def pad_dataproto_to_divisor(data: FakeDataProto, size_divisor: int) -> tuple[FakeDataProto, int]:
    """veRL: pads by repeating rows from the start of the batch."""
    import numpy as np
    import torch

    n = len(data)
    pad = (size_divisor - n % size_divisor) % size_divisor
    if pad == 0:
        return data, 0
    idx = [i % n for i in range(pad)]
    tensors = {k: torch.cat([v, v[idx]]) for k, v in data.batch.items()}
    non = {k: np.concatenate([v, v[idx]]) for k, v in data.non_tensor_batch.items()}
    return FakeDataProto(tensors, non), pad


def grpo_compute_advantage(data: FakeDataProto, **kwargs: Any) -> FakeDataProto:
    """veRL's GRPO outcome advantage: (score - group mean) / (group std + eps); singleton: mean 0, std 1."""
    import torch

    scores = data.batch["token_level_scores"].sum(-1)
    uids = data.non_tensor_batch["uid"]
    advantages = torch.zeros_like(scores)
    for uid in set(uids.tolist()):
        rows = [i for i, u in enumerate(uids) if u == uid]
        group = scores[rows]
        if len(rows) == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = group.mean(), group.std()
        advantages[rows] = (group - mean) / (std + 1e-6)
    data.batch["advantages"] = advantages.unsqueeze(-1) * data.batch["response_mask"]
    return data


def compute_data_metrics(batch: FakeDataProto, use_critic: bool = False) -> dict[str, float]:
    """veRL 0.6.1: rows without loss tokens count as aborted and are left out; the score and advantage
    statistics take max/min over what is left (an empty selection raises, as in veRL)."""
    import torch

    response_mask = batch.batch["response_mask"].bool()
    kept = response_mask.sum(-1) > 0
    scores = batch.batch["token_level_scores"].sum(-1)[kept]
    metrics = {"critic/score/mean": float(scores.mean()), "critic/score/max": float(torch.max(scores))}
    if "advantages" in batch.batch.keys():  # noqa: SIM118 - TensorDict refuses `in`
        metrics["critic/advantages/max"] = float(torch.max(torch.masked_select(batch.batch["advantages"], response_mask)))
    return metrics


class FakeWorkerGroup:
    """A veRL worker group: ``update_actor``/``update_critic`` return a DataProto whose meta_info holds metrics."""

    def __init__(self) -> None:
        self.updates: list[int] = []

    def update_actor(self, batch: Any) -> Any:
        from types import SimpleNamespace

        self.updates.append(len(batch))
        return SimpleNamespace(meta_info={"metrics": {"actor/pg_loss": [0.1]}})

    update_critic = update_actor


def trainer_namespace() -> dict[str, Any]:
    import numpy as np

    class AgentPPOTrainer:
        """rLLM's trainer: the constructor state and the methods the adapter overrides or calls."""

        def __init__(self, config, tokenizer, agent_class=None, env_class=None, engine=None, world_size=4):
            self.config, self.tokenizer = config, tokenizer
            self.agent_class, self.env_class = agent_class, env_class
            self.agent_execution_engine = engine
            self.world_size = world_size
            self.global_steps = 1

        def init_workers(self):
            self.actor_rollout_wg = FakeWorkerGroup()
            self.critic_wg = FakeWorkerGroup()

        def generate_agent_trajectory(self, timing_raw=None, meta_info=None):
            return "upstream", {}

        def _pad_dataproto_to_world_size(self, batch):
            batch, _ = pad_dataproto_to_divisor(batch, self.world_size)
            return batch

        def _validate_agent(self):  # per row: reward sum; failures count (row present, reward 0)
            out, _ = self.generate_agent_trajectory(meta_info={"validate": True})
            return {"val/test_score/x": float(out.batch["token_level_scores"].sum(-1).clamp(0, 1).mean())}

    return {
        "AgentPPOTrainer": AgentPPOTrainer,
        "DataProto": FakeDataProto,
        "compute_advantage": grpo_compute_advantage,
        "compute_data_metrics": compute_data_metrics,
        "np": np,
    }
