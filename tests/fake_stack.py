"""Faithful fakes of the rLLM v0.2.1.post1 / veRL 0.6.1 and rLLM v0.3.0-pre / veRL 0.7.1 interfaces the
adapters hook into.

Each fake mirrors what the adapter touches in the real source (read from the tagged releases):

* veRL ``vllm_async_server`` module namespace: ``vLLMHttpServerBase`` with ``config.max_model_len``
  (prompt_length + response_length), ``config.get``, ``model_config.processor/lora_rank``, ``engine``
  (vLLM ``AsyncLLM``: ``generate(prompt=, sampling_params=, request_id=, lora_request=)`` is an async
  generator of ``RequestOutput``; each ``CompletionOutput`` has ``token_ids``, ``logprobs`` (one
  ``{token_id: Logprob}`` dict per sampled token), ``finish_reason``, ``stop_reason``), ``wake_up``;
  ``TokenOutput`` (pydantic: ``token_ids``, ``log_probs``), ``SamplingParams``, ``TokensPrompt``.
* veRL's ``vLLMHttpServer`` is ``@ray.remote(num_cpus=1)`` over ``vLLMHttpServerBase``, decorated when the
  module runs, i.e. before the adapter's block at its end. Ray's decorator (``_make_actor`` in ``ray/actor.py``)
  builds a subclass (``__ray_metadata__.modified_class``) and sets on it a tracing wrapper of every method the
  class has at that moment (``_inject_tracing_into_class``): those copies of upstream's methods shadow the base
  class's. :func:`ray_remote` does the same, and the servers of these tests are instances of that subclass
  (what a Ray worker instantiates).
* A Ray actor handle: ``handle.generate.remote(**kwargs)`` returns an awaitable ``ObjectRef``.
* rLLM ``AsyncAgentExecutionEngine`` fields the adapter uses: ``agent_class``, ``env_class``,
  ``agent_args``, ``env_args``, ``envs``, ``agents``, ``tokenizer``, ``config``, ``engine_name``,
  ``n_parallel_agents`` and ``rollout_engine`` (rLLM's ``VerlEngine``: ``rollout_manager.server_handles``,
  async ``wake_up()``/``sleep()`` over the replicas).

rLLM v0.3.0-pre (tag ``v0.3.0-pre``, commit 09567646) with veRL 0.7.1, where they differ (the rest is as above):

* veRL 0.7.1 ``vllm_async_server.vLLMHttpServer`` (used unpatched): ``generate(prompt_ids,
  sampling_params, request_id, image_data=None, video_data=None, priority=0)`` raises ``ValueError`` when
  the prompt exceeds ``config.max_model_len``; takes ``max_tokens`` (else ``max_new_tokens``, else
  ``min(response_length, prompt_length + response_length - len(prompt))``) and clamps it to
  ``[0, max_model_len - len(prompt)]`` (vLLM refuses 0: "max_tokens must be at least 1, got 0.");
  returns ``replica.TokenOutput(token_ids, log_probs, routed_experts, stop_reason, num_preempted,
  extra_fields)`` with ``stop_reason`` ``"aborted"`` for vLLM's ``abort``, ``"completed"`` for ``stop`` *and*
  ``length``, else vLLM's finish reason, and ``extra_fields={"global_steps": self.global_steps}`` (None until
  ``set_global_steps``); ``wake_up`` raises ``ValueError`` in hybrid mode (weights are synced by the
  trainer's ``CheckpointEngineManager.update_weights``), ``sleep`` frees memory.
* ``AgentLoopManager``: ``server_handles``, ``server_addresses``, ``global_load_balancer``,
  ``rollout_replicas``; ``CheckpointEngineManager.update_weights(global_steps)`` (through the workers'
  ``update_weights`` the servers' ``set_global_steps``) and ``sleep_replicas()``.
* rLLM's ``VerlEngine``: builds ``AsyncLLMServerManager(config, servers=zip(addresses, handles),
  load_balancer_handle=...)``, keeps ``rollout_manager``; its ``wake_up``/``sleep`` are ``RolloutEngine``'s
  no-ops. ``AsyncAgentExecutionEngine``'s constructor and fields are unchanged.
* ``AgentPPOTrainer``: its constructor no longer passes the reward functions to ``RayPPOTrainer``;
  ``fit_agent`` unions the data batch (veRL 0.7.1's dataset: only ``dummy_tensor`` plus non-tensors) with
  the generated one without popping anything, and calls ``checkpoint_manager.update_weights`` after the
  actor update. The methods the adapter overrides keep their signatures.

The "model" behind the fake vLLM engine is :class:`agentboost.testing.instant.InstantPolicy`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
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
                       lora_request: Any = None, priority: int = 0):  # fmt: skip
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


class FakeActorClass:
    """What ``@ray.remote`` returns for a class (its actors instantiate ``__ray_metadata__.modified_class``)."""

    def __init__(self, modified_class: type, options: dict[str, Any]) -> None:
        self.__ray_metadata__ = SimpleNamespace(modified_class=modified_class)
        self._default_options = options

    def remote(self, *args: Any, **kwargs: Any) -> FakeActorHandle:
        return FakeActorHandle(self.__ray_metadata__.modified_class(*args, **kwargs))


def ray_remote(**options: Any) -> Any:
    """``ray.remote(**options)`` for a class, as Ray 2.x decorates it: a subclass carrying a (tracing) wrapper of
    each method the class has now, so a later change to a base class's method does not reach the actors."""

    def decorate(cls: type) -> FakeActorClass:
        class Class(cls):  # type: ignore[misc, valid-type]
            __ray_actor_class__ = cls

        Class.__module__, Class.__name__ = cls.__module__, cls.__name__
        for name, method in inspect.getmembers(Class, inspect.isfunction):
            if name == "__del__":
                continue
            if inspect.iscoroutinefunction(method):

                async def wrapper(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                    return await _method(*args, **kwargs)
            else:

                def wrapper(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                    return _method(*args, **kwargs)

            setattr(Class, name, functools.wraps(method)(wrapper))
        return FakeActorClass(Class, options)

    return decorate


def server_namespace() -> dict[str, Any]:
    """A fresh copy of the server module's namespace (so install() can run once per test)."""

    class vLLMHttpServerBase(FakeServerBase):  # the upstream name
        pass

    class vLLMHttpServer(vLLMHttpServerBase):  # decorated as the module runs, before the adapter's block
        def __init__(self, tokenizer: Any, max_model_len: int) -> None:
            super().__init__(tokenizer, max_model_len)

    return {
        "vLLMHttpServerBase": vLLMHttpServerBase,
        "vLLMHttpServer": ray_remote(num_cpus=1)(vLLMHttpServer),
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
    """A Ray actor handle over a local server object (every method as ``handle.method.remote(...)``)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.generate = FakeMethod(server.generate)
        self.wake_up = FakeMethod(server.wake_up)
        self.sleep = FakeMethod(server.sleep)

    def __getattr__(self, name: str) -> FakeMethod:
        return FakeMethod(getattr(self.server, name))


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


# -- veRL 0.7.1 / rLLM v0.3.0-pre -----------------------------------------------------------------------
class TokenOutput071(BaseModel):  # verl/workers/rollout/replica.py
    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = {}


class FakeServer071:
    """veRL 0.7.1's ``vLLMHttpServer`` in hybrid mode, unpatched (semantics in the module docstring)."""

    def __init__(self, tokenizer: Any, prompt_length: int = 512, response_length: int = 256) -> None:
        self.config = FakeConfig(prompt_length + response_length)
        self.config.prompt_length, self.config.response_length = prompt_length, response_length
        self.model_config = SimpleNamespace(processor=None, lora_rank=0)
        self.engine = FakeVLLMEngine(tokenizer)
        self.global_steps: int | None = None
        self.slept = 0

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None, priority=0):
        max_possible = self.config.max_model_len - len(prompt_ids)
        if max_possible < 0:
            raise ValueError(f"Prompt length ({len(prompt_ids)}) exceeds the model's maximum context length "
                             f"({self.config.max_model_len}).")  # fmt: skip
        if "max_tokens" in sampling_params:
            max_tokens = sampling_params.pop("max_tokens")
        elif "max_new_tokens" in sampling_params:
            max_tokens = sampling_params.pop("max_new_tokens")
        else:
            max_tokens = min(self.config.response_length,
                             self.config.prompt_length + self.config.response_length - len(prompt_ids))  # fmt: skip
        max_tokens = max(0, min(max_tokens, max_possible))
        sampling_params["logprobs"] = 0 if sampling_params.pop("logprobs", False) else None
        sampling_params.setdefault("repetition_penalty", self.config.get("repetition_penalty", 1.0))
        params = FakeSamplingParams(max_tokens=max_tokens, **sampling_params)
        final = None
        async for out in self.engine.generate(prompt=FakeTokensPrompt(prompt_ids), sampling_params=params,
                                              request_id=request_id, lora_request=None, priority=priority):  # fmt: skip
            final = out
        assert final is not None
        completion = final.outputs[0]
        ids = completion.token_ids
        lps = [d[ids[i]].logprob for i, d in enumerate(completion.logprobs)] if params.logprobs is not None else None
        finish = completion.finish_reason
        stop_reason = "aborted" if finish == "abort" else "completed" if finish in ("stop", "length") else finish
        return TokenOutput071(token_ids=ids, log_probs=lps, stop_reason=stop_reason,
                              extra_fields={"global_steps": self.global_steps})  # fmt: skip

    async def wake_up(self):
        raise ValueError("wake_up not support rollout_mode RolloutMode.HYBRID")

    async def sleep(self):
        self.slept += 1

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps


class FakeLoadBalancer:
    """veRL 0.7.1's ``GlobalRequestLoadBalancer`` actor (rLLM's own path acquires servers through it)."""

    def __init__(self) -> None:
        self.acquired: list[str] = []

    async def _acquire(self, request_id: str) -> str:
        self.acquired.append(request_id)
        return "addr-0"

    @property
    def acquire_server(self) -> FakeMethod:
        return FakeMethod(self._acquire)


def agent_loop_manager_071(handles: list[FakeActorHandle]) -> SimpleNamespace:
    """veRL 0.7.1's ``AgentLoopManager`` as rLLM v0.3.0-pre's ``VerlEngine`` reads it."""
    return SimpleNamespace(
        server_handles=handles,
        server_addresses=[f"addr-{i}" for i in range(len(handles))],
        global_load_balancer=FakeLoadBalancer(),
        rollout_replicas=[FakeReplica(h) for h in handles],
    )


class FakeCheckpointManager071:
    """veRL 0.7.1's ``CheckpointEngineManager`` (naive backend, hybrid): the trainer pushes weights into the
    replicas (the new worker implementation also tells the servers the step); ``sleep_replicas`` frees them."""

    def __init__(self, handles: list[FakeActorHandle]) -> None:
        self.handles = handles
        self.updates: list[int] = []

    def update_weights(self, global_steps: int) -> None:
        self.updates.append(global_steps)
        for handle in self.handles:
            handle.server.global_steps = global_steps

    def sleep_replicas(self) -> None:
        for handle in self.handles:
            handle.server.slept += 1


class FakeVerlEngine030:
    """rLLM v0.3.0-pre's ``VerlEngine``: wake_up/sleep are ``RolloutEngine``'s no-ops (calls recorded here)."""

    def __init__(self, manager: SimpleNamespace) -> None:
        self.rollout_manager = manager
        self.server_manager = dict(zip(manager.server_addresses, manager.server_handles, strict=True))
        self.phases: list[str] = []

    async def wake_up(self) -> None:
        self.phases.append("wake_up")

    async def sleep(self) -> None:
        self.phases.append("sleep")


RELEASES = ("0.2.1", "0.3.0rc0")
"""rLLM releases the fakes cover (as installed metadata reports them: v0.2.1.post1, v0.3.0-pre)."""


def engine_namespace(handles: list[FakeActorHandle], release: str = "0.2.1") -> dict[str, Any]:
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
            self.rollout_engine = None
            if engine_name == "verl":
                self.rollout_engine = (FakeVerlEngine(handles) if release == "0.2.1"
                                       else FakeVerlEngine030(agent_loop_manager_071(handles)))  # fmt: skip

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
    return actor_server(ns, tokenizer, max_model_len)


def actor_server(ns: dict[str, Any], tokenizer: Any, max_model_len: int = 1024) -> Any:
    """A server as veRL's ``vLLMReplica`` starts it: an instance of the Ray actor class ``vLLMHttpServer``."""
    return ns["vLLMHttpServer"].__ray_metadata__.modified_class(tokenizer, max_model_len)


def make_engine(tokenizer: Any, n_servers: int = 2, config: dict | None = None, release: str = "0.2.1",
                **kwargs: Any) -> tuple[Any, list]:  # fmt: skip
    """An adapted execution engine over ``n_servers`` fake rollout servers of the release's veRL (0.6.1:
    adapted by agentboost; 0.7.1: as upstream ships it, weights already pushed for step 1)."""
    from agentboost import StrandsAgent
    from agentboost.environments.arithmetic import ArithmeticEnv
    from modified_rllm_files import agent_execution_engine as engine_adapter

    if release == "0.2.1":
        servers = [adapted_server(tokenizer) for _ in range(n_servers)]
    else:
        servers = [FakeServer071(tokenizer) for _ in range(n_servers)]
    handles = [FakeActorHandle(s) for s in servers]
    if release != "0.2.1":
        FakeCheckpointManager071(handles).update_weights(1)
    ns = engine_namespace(handles, release)
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
        """veRL's union: a key on both sides must hold equal values (tensors: ``equal``)."""
        for key in other.non_tensor_batch:
            assert key not in self.non_tensor_batch, f"union conflict on {key}"
        for key, value in other.batch.items():
            mine = dict.get(self.batch, key)
            assert mine is None or (mine.shape == value.shape and bool((mine == value).all())), (
                f"{key} in tensor_dict1 and tensor_dict2 are not the same object"
            )
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
        metrics["critic/advantages/max"] = float(
            torch.max(torch.masked_select(batch.batch["advantages"], response_mask))
        )
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


def trainer_namespace(release: str = "0.2.1") -> dict[str, Any]:
    import numpy as np

    class AgentPPOTrainer:
        """rLLM's trainer: the constructor state and the methods the adapter overrides or calls."""

        def __init__(self, config, tokenizer, agent_class=None, env_class=None, engine=None, world_size=4,
                     reward_fn=None, val_reward_fn=None):  # fmt: skip
            self.config, self.tokenizer = config, tokenizer
            if release != "0.2.1":  # v0.3.0-pre: set after RayPPOTrainer.__init__, which no longer takes them
                self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
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
