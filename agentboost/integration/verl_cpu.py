"""verl 0.9's own trainer on a machine without GPUs: a CPU layer registered from outside verl.

verl 0.9.1 runs only on CUDA/NPU devices with a vLLM, SGLang or TensorRT-LLM rollout. This module adds,
through verl's own registries and nothing else (no verl file is edited or copied), what
``python -m verl.trainer.main_ppo`` needs to run end to end on CPUs, so that CI exercises the real
trainer (V1 ``PPOTrainer``, ``AgentLoopWorkerTQ``, TransferQueue, FSDP2, checkpointing, validation)
with agentboost's ``strands_agent`` loop:

* a ``cpu`` platform (``verl.plugin.platform.PlatformRegistry``, selected with ``set_platform``): torch's
  CPU device, ``gloo`` collectives; the Ray resource stays ``"GPU"`` (logical GPUs, see
  :func:`cpu_overrides`);
* the default process group: verl builds ``"cpu:gloo,<device>:<backend>"``, which for a CPU device names
  ``cpu`` twice (torch refuses); the process group is made ``cpu:gloo`` instead, before
  ``verl.workers.engine_workers`` binds the function;
* a rollout named :data:`ROLLOUT_NAME` (``RolloutReplicaRegistry`` and the ``(name, "async")`` entry of
  ``verl.workers.rollout.base._ROLLOUT_REGISTRY``): one Ray actor per replica, :class:`HFRolloutServer`,
  serving verl's token-in/token-out ``generate`` contract with the project's in-process backend
  (:class:`agentboost.backends.hf_local.HFLocalBackend`: the same code that gives the built-in trainer
  its token ids and log-probs), and :class:`HFServerAdapter`, the trainer-side adapter through which
  verl pushes the updated weights into that server after every step;
* a checkpoint engine named :data:`CHECKPOINT_ENGINE` (``CheckpointEngineRegistry``) that carries the
  weights through Ray's object store, for ``separate_async`` (verl's ``nccl`` engine needs CUDA);
* ``VERL_ENGINE_DEVICE=cuda``: verl registers its FSDP engines for ``cuda`` and ``npu`` only; the FSDP2
  engine itself runs on whatever ``get_device_name()`` says.

Load it in every verl process with ``VERL_USE_EXTERNAL_MODULES=agentboost.integration.verl_cpu``
(``verl/__init__.py`` imports it; forward the variable to Ray workers through
``ray_kwargs.ray_init.runtime_env.env_vars``) plus the overrides of :func:`cpu_overrides`.
:mod:`agentboost.integration.verl_cpu_run` does all of that for a whole run. For tests and CI only:
a CPU is no place to train a real model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterable
from typing import Any

from .rollout_options import log_request, max_new_tokens, rollout_options

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "agentboost_hf"
"""``actor_rollout_ref.rollout.name`` of the CPU rollout."""
CHECKPOINT_ENGINE = "agentboost_ray"
"""``actor_rollout_ref.rollout.checkpoint_engine.backend`` of the CPU weight transfer (separate_async)."""
SERVER_PREFIX = "agentboost_hf_server_"
_FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
_REGISTERED: dict[str, bool] = {}


def cpu_overrides(
    *, num_cpus: int = 32, num_gpus: int = 1, storage_units: int = 1, rollout: str = ROLLOUT_NAME
) -> list[str]:
    """The Hydra overrides that put a verl 0.9.1 run on this layer (besides the route's own); ``rollout``: this
    module's in-process one or ``agentboost_vllm`` (real vLLM, :mod:`.verl_vllm`).

    The actor computes in fp32 (verl autocasts to bf16 by default), as the CPU server does. Ray gets
    ``num_gpus`` logical GPUs (verl's resource pools ask for them) and ``num_cpus`` logical CPUs:
    TransferQueue starts a controller and ``storage_units`` storage actors at one CPU each, and with
    Ray's real CPU count (2 here) ``tq.init`` waits forever for CPUs that never free up.
    """
    return [
        "trainer.device=cpu",
        f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        # fp32 actor and reference (bf16 autocast by default): the trainer's log-probs then match the server's
        # to ~1e-6, so the rollout-vs-actor gap shows whether the updated weights reached the server
        f"++actor_rollout_ref.actor.fsdp_config.mixed_precision={_FP32}",
        f"++actor_rollout_ref.ref.fsdp_config.mixed_precision={_FP32}",
        f"++ray_kwargs.ray_init.num_cpus={num_cpus}",
        f"++ray_kwargs.ray_init.num_gpus={num_gpus}",
        f"transfer_queue.backend.SimpleStorage.num_data_storage_units={storage_units}",
        "reward.num_workers=1",
    ]


# -- the platform -----------------------------------------------------------------------------------
class _CpuDevice:
    """What verl calls on ``get_torch_device()`` (``torch.cuda`` on GPUs), for the CPU."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> Any:
        import torch

        return torch.device("cpu")  # verl moves tensors with .to(get_device_id())

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(*args: Any, **kwargs: Any) -> None:
        return None

    @staticmethod
    def mem_get_info(*args: Any) -> tuple[int, int]:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * size
        return pages * size, total

    @staticmethod
    def memory_allocated(*args: Any) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(*args: Any) -> None:
        return None

    @staticmethod
    def get_device_name(*args: Any) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(*args: Any) -> Any:
        import torch

        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: Any, *args: Any) -> None:
        import torch

        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    manual_seed_all = manual_seed


def _platform_class() -> type:
    from verl.plugin.platform.platform_base import PlatformBase

    class PlatformCPU(PlatformBase):
        """verl platform for CPU-only machines (tests and CI)."""

        device = _CpuDevice()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> Any:
            return self.device

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            return self.device.current_device()

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            self.device.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            self.device.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Any:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"  # logical GPUs given to ray.init (cpu_overrides)

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    PlatformCPU.__module__ = __name__
    return PlatformCPU


def _register_platform() -> None:
    from verl.plugin.platform import platform_manager

    cls = platform_manager.PlatformRegistry.get("cpu") or platform_manager.PlatformRegistry.register("cpu")(
        _platform_class()
    )
    current = platform_manager._current_platform
    if current is None or current.device_name != "cpu":
        platform_manager.set_platform(cls())


def _register_process_group() -> None:
    """``cpu:gloo`` for verl's default process group (before ``engine_workers`` imports the function)."""
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "agentboost_cpu", False):
        return

    def initialize_global_process_group_ray(timeout_second: Any = None, backend: str | None = None) -> None:
        original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray.agentboost_cpu = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


# -- the rollout server -------------------------------------------------------------------------------
def _plain_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return dict(OmegaConf.to_container(value, resolve=True))  # type: ignore[arg-type]
    except ImportError:  # pragma: no cover - verl brings omegaconf
        pass
    return dict(value)


class HFRolloutServer:
    """One rollout replica on CPU: verl's server contract (``vLLMHttpServer``'s methods the trainer and
    ``LLMServerClient`` call) over :class:`~agentboost.backends.hf_local.HFLocalBackend`.

    Like verl's vLLM server it clamps ``max_tokens`` to the room left under ``max_model_len`` (the rollout
    config's, else the model's ``max_position_embeddings``) and raises ``ValueError("... leaves no room to
    generate ...")`` when there is none; reports ``stop_reason="completed"`` for a stop and for a cut alike;
    tags every output with the ``global_steps`` of the weights that produced it. ``abort_all_requests``
    closes the gate: new requests wait until ``resume_generation``; requests already decoding finish on
    the weights they started with (an in-process decode cannot be interrupted), and weights are loaded
    only once they have.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0) -> None:
        import torch
        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass

        from ..backends.hf_local import HFLocalBackend

        self.config = omega_conf_to_dataclass(config)
        self.replica_rank = replica_rank
        model = omega_conf_to_dataclass(model_config) if not hasattr(model_config, "local_path") else model_config
        path = getattr(model, "local_path", None) or model.path
        torch.set_num_threads(max(1, int(os.environ.get("AGENTBOOST_CPU_ROLLOUT_THREADS", "1"))))
        self.model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.model.eval()
        self.max_model_len = int(
            self.config.max_model_len or getattr(self.model.config, "max_position_embeddings", 1 << 30)
        )
        eos = getattr(self.model.generation_config, "eos_token_id", None) or self.model.config.eos_token_id
        self.eos_token_ids = [int(t) for t in (eos if isinstance(eos, list) else [eos]) if t is not None]
        pad = self.model.config.pad_token_id
        self.backend = HFLocalBackend(
            self.model,
            device="cpu",
            max_batch_size=int(self.config.max_num_seqs or 8) if self.config.max_num_seqs else 8,
            pad_token_id=int(pad if pad is not None else (self.eos_token_ids or [0])[0]),
            max_context=self.max_model_len,
        )
        self.global_steps: int | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self.weight_loads = 0
        self.requests = 0
        self.request_log = rollout_options(self.config).get("request_log")

    async def ready(self) -> dict[str, Any]:
        return {"max_model_len": self.max_model_len, "replica_rank": self.replica_rank}

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        from ..backends.base import GenerationRequest
        from ..types import SamplingParams

        prompt_ids = [int(t) for t in prompt_ids]
        params = dict(sampling_params)
        max_tokens = max_new_tokens(params, len(prompt_ids), self.config, self.max_model_len)
        logprobs = bool(params.pop("logprobs", False))
        stops = {int(t) for t in params.get("stop_token_ids") or ()}
        if not params.get("ignore_eos", False):
            stops.update(self.eos_token_ids)
        top_k = int(params.get("top_k", -1) or -1)
        sampling = SamplingParams(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=-1 if top_k <= 0 else top_k,
            min_p=float(params.get("min_p", 0.0) or 0.0),
            repetition_penalty=float(params.get("repetition_penalty", 1.0)),
            seed=params.get("seed"),
            logprobs=logprobs,
        )
        await self._open.wait()
        self._in_flight += 1
        self._drained.clear()
        steps = self.global_steps
        self.requests += 1
        try:
            request = GenerationRequest(prompt_ids, sampling, max_tokens, str(request_id), stop_token_ids=tuple(stops))
            result = await self.backend.generate(request)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._drained.set()
        log_request(self.request_log, request_id=str(request_id), replica=self.replica_rank, global_steps=steps,
                    model="hf", prompt_ids=prompt_ids, token_ids=list(result.token_ids),
                    log_probs=list(result.logprobs) if logprobs and result.logprobs is not None else None,
                    sampling=dict(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                  min_p=sampling.min_p, repetition_penalty=sampling.repetition_penalty),
                    finish_reason=result.finish_reason, max_tokens=max_tokens)  # fmt: skip
        return TokenOutput(
            token_ids=list(result.token_ids),
            log_probs=list(result.logprobs) if logprobs and result.logprobs is not None else None,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": steps},
        )

    async def load_weights(
        self, state: dict[str, Any], global_steps: int | None = None, *, peft_config: Any = None, **kwargs: Any
    ) -> dict[str, int]:
        """Load the trainer's weights (names as in the HF model) once in-flight requests have finished."""
        if peft_config is not None:
            raise NotImplementedError(f"{ROLLOUT_NAME} rollout: LoRA adapters (use model.lora.merge=true, or the "
                                      "real-vLLM rollout agentboost_vllm)")  # fmt: skip
        await self._drained.wait()
        missing, unexpected = await asyncio.to_thread(self._load, state)
        if global_steps is not None:
            self.global_steps = int(global_steps)
        self.weight_loads += 1
        if missing or unexpected:
            raise RuntimeError(f"weight sync: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return {"tensors": len(state)}

    def _load(self, state: dict[str, Any]) -> tuple[list[str], list[str]]:
        with self.backend.lock:
            result = self.model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        return [k for k in result.missing_keys if k not in tied], list(result.unexpected_keys)

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = int(global_steps)

    async def stats(self) -> dict[str, Any]:
        return {"global_steps": self.global_steps, "weight_loads": self.weight_loads, "requests": self.requests}

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        self._open.clear()
        await self._drained.wait()
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        self._open.set()

    async def wait_for_requests_to_drain(self) -> None:
        await self._drained.wait()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


def _replica_class() -> type:
    import ray
    from verl.workers.rollout.replica import RolloutReplica

    class HFRolloutReplica(RolloutReplica):
        """One ``server_class`` actor per replica (no GPU, no CPU reserved: it runs beside the trainer's workers
        as vLLM does): :class:`HFRolloutServer`, or :class:`~.verl_vllm.VllmRolloutServer` for real vLLM."""

        server_class: type = HFRolloutServer

        async def launch_servers(self) -> None:
            name = f"{SERVER_PREFIX}{self.replica_rank}{self.name_suffix}"
            server = (
                ray.remote(self.server_class)
                .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency, runtime_env=_runtime_env())
                .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
            )
            await server.ready.remote()
            self.servers = [server]
            self._server_handle = server
            self._server_address = f"agentboost-hf-{self.replica_rank}{self.name_suffix}"

        async def sleep(self) -> None:
            await asyncio.gather(*[server.sleep.remote() for server in self.servers])

    HFRolloutReplica.__module__ = __name__
    return HFRolloutReplica


def _runtime_env() -> dict[str, Any]:
    names = ("VERL_USE_EXTERNAL_MODULES", "VERL_ENGINE_DEVICE", "PYTHONPATH", "AGENTBOOST_CPU_ROLLOUT_THREADS")
    return {"env_vars": {n: os.environ[n] for n in names if n in os.environ}}


def _adapter_class() -> type:
    from verl.workers.rollout.base import BaseRollout

    class HFServerAdapter(BaseRollout):
        """The trainer-side rollout of :data:`ROLLOUT_NAME`: verl's actor worker hands it the updated weights
        (``update_weights``: ``(name, tensor)`` pairs, full tensors on every rank); the replica's leader
        rank sends them to its :class:`HFRolloutServer` through Ray."""

        def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, *args: Any, **kwargs: Any):
            super().__init__(config, model_config, device_mesh)
            world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
            world *= self.config.pipeline_model_parallel_size
            rank = int(os.environ.get("RANK", "0"))
            replica_rank = int(kwargs.get("replica_rank", -1))
            self.replica_rank = rank // world if replica_rank < 0 else replica_rank
            self.is_leader_rank = rank % world == 0
            self.sleep_level = 1
            self._server: Any = None

        def server(self) -> Any:
            import ray

            if self._server is None:
                self._server = ray.get_actor(f"{SERVER_PREFIX}{self.replica_rank}")
            return self._server

        async def resume(self, tags: list[str]) -> None:
            return None

        async def release(self) -> None:
            return None

        async def update_weights(
            self,
            weights: Iterable[tuple[str, Any]] | AsyncIterator[tuple[str, Any]],
            wire_format: str = "named_tensors",
            **kwargs: Any,
        ) -> None:
            if wire_format != "named_tensors":
                raise NotImplementedError(f"{ROLLOUT_NAME} rollout: weight format {wire_format!r}")
            state: dict[str, Any] = {}
            if hasattr(weights, "__aiter__"):
                async for name, tensor in weights:  # type: ignore[union-attr]
                    state[name] = _cpu_copy(tensor)
            else:
                for name, tensor in weights:  # type: ignore[union-attr]
                    state[name] = _cpu_copy(tensor)
            if self.is_leader_rank:
                lora = {k: kwargs[k] for k in ("peft_config", "base_sync_done") if k in kwargs}
                if lora.get("peft_config") is None:
                    lora = {}
                await self.server().load_weights.remote(state, kwargs.get("global_steps"), **lora)

    HFServerAdapter.__module__ = __name__
    return HFServerAdapter


def _cpu_copy(tensor: Any) -> Any:
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().to("cpu", copy=True).contiguous()


# -- the checkpoint engine (separate_async) --------------------------------------------------------------
class WeightRelay:
    """A named Ray actor that holds the last weights the trainer sent, by version (``global_steps``)."""

    def __init__(self) -> None:
        self.version: Any = None
        self.refs: list[Any] = []
        self._changed = asyncio.Condition()

    async def put(self, version: Any, refs: list[Any]) -> None:
        async with self._changed:
            self.version, self.refs = version, refs
            self._changed.notify_all()

    async def get(self, version: Any) -> list[Any]:
        async with self._changed:
            await self._changed.wait_for(lambda: self.version == version)
            return self.refs


RELAY_NAME = "agentboost_weight_relay"


_RELAY: list[Any] = []


def _relay() -> Any:
    """The run's relay actor. Each process keeps its handle for good: a named actor dies with its creator's
    last handle, and the creator is whichever worker asked first."""
    import ray

    if not _RELAY:
        _RELAY.append(ray.remote(WeightRelay).options(name=RELAY_NAME, get_if_exists=True, num_cpus=0).remote())
    return _RELAY[0]


def _checkpoint_engine_class() -> type:
    from verl.checkpoint_engine.base import CheckpointEngine

    class RayCheckpointEngine(CheckpointEngine):
        """verl checkpoint engine over Ray's object store (CPU; verl's ``nccl`` engine needs CUDA): the trainer's
        master rank puts the full state dict once per version, every rollout worker fetches it."""

        def __init__(self, bucket_size: int = 0, is_master: bool = False, **kwargs: Any) -> None:
            self.is_master = is_master

        def prepare(self) -> dict[str, Any]:
            return {}

        @classmethod
        def build_topology(cls, trainer_world_size: int, rollout_world_size: int, metadata: list[dict]) -> tuple:
            return {}, {}

        def init_process_group(self, **kwargs: Any) -> None:
            _relay()

        def finalize(self) -> None:
            return None

        async def send_weights(self, weights: Any, global_steps: int | None = None, **kwargs: Any) -> dict:
            import ray

            state = {name: _cpu_copy(tensor) for name, tensor in weights}
            if self.is_master:
                await _relay().put.remote(global_steps, [ray.put(state)])
            return {}

        async def receive_weights(self, global_steps: int | None = None, **kwargs: Any) -> AsyncIterator[Any]:
            refs = await _relay().get.remote(global_steps)
            state = await refs[0]
            for item in state.items():
                yield item

    RayCheckpointEngine.__module__ = __name__
    return RayCheckpointEngine


# -- registration -----------------------------------------------------------------------------------
def register() -> None:
    """Register the CPU platform, process group, rollout and checkpoint engine with this process's verl
    (idempotent). Runs on import."""
    if _REGISTERED.get("done"):
        return
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    _register_platform()
    _register_process_group()
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from . import verl_vllm

    replica = _replica_class()
    vllm_replica = verl_vllm.replica_class(replica)
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: replica)
    RolloutReplicaRegistry.register(verl_vllm.ROLLOUT_NAME, lambda: vllm_replica)
    adapter = _adapter_class()
    globals()["HFServerAdapter"] = adapter
    globals()["HFRolloutReplica"] = replica
    for name in (ROLLOUT_NAME, verl_vllm.ROLLOUT_NAME):  # one trainer-side adapter: it sends to the named server
        rollout_base._ROLLOUT_REGISTRY[(name, "async")] = f"{__name__}.HFServerAdapter"
    if CHECKPOINT_ENGINE not in getattr(CheckpointEngineRegistry, "_registry", {}):
        engine = _checkpoint_engine_class()
        globals()["RayCheckpointEngine"] = engine
        CheckpointEngineRegistry.register(CHECKPOINT_ENGINE)(engine)
    _REGISTERED["done"] = True
    logger.info("agentboost: verl CPU layer registered (platform cpu, rollout %s)", ROLLOUT_NAME)


_lock = threading.Lock()
with _lock:
    register()
