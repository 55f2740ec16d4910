"""Adapter for veRL 0.6.1's vLLM rollout server (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``).

``apply_patches.py`` appends a marked block to that module which calls :func:`install` with the
module's globals once the module has been executed. :func:`install` then changes, on
``vLLMHttpServerBase`` (and so on the ``vLLMHttpServer`` Ray actor that subclasses it):

* ``generate(prompt_ids, sampling_params, request_id, image_data=None)``, same signature (Ray records
  actor method signatures when the class is decorated):

  - honours ``sampling_params["max_tokens"]``: the reply is capped at ``min(max_tokens, max_model_len
    - len(prompt))``. Upstream always generates up to ``max_model_len - len(prompt)``, and passing
    ``max_tokens`` to it is a ``TypeError``. Without ``max_tokens`` the upstream behaviour is kept, so
    veRL's and rLLM's own agent loops are unaffected;
  - refuses a prompt that leaves no room (``ValueError`` naming ``max_model_len``) instead of asking
    vLLM for a non-positive ``max_tokens``;
  - returns a ``TokenOutput`` subclass that adds ``finish_reason`` (``stop``/``length``/``abort``),
    ``stop_reason`` and ``weight_version``; log-probs as upstream (``sampling_params["logprobs"]``);
* ``wake_up()``: counts weight versions. In hybrid mode every wake-up syncs the actor's weights into
  vLLM, so the counter names the policy version that served a request.

The ``vLLMHttpServer`` actor class was made by ``@ray.remote`` before this block runs, and Ray's decorator
copies every method onto the actor class it builds (wrapped for tracing: ``_inject_tracing_into_class`` in
``ray/actor.py``'s ``_make_actor``), so those copies of upstream's ``generate``/``wake_up`` would shadow the
base class's and the actors would run upstream code. :func:`install` removes the copies of the methods it
replaces from each such actor class in the module (the lookup then reaches the adapted base class; a Ray
worker wraps it for tracing again when it loads the class) and refuses an actor class it cannot adapt.

Everything else the server does (launch, LoRA, multi-modal dedup, sleep) is upstream's.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

logger = logging.getLogger("agentboost.verl_server")

MARK = "_agentboost_installed"
SERVER_ACTOR = "vLLMHttpServer"
"""The Ray actor class veRL's ``vLLMReplica`` starts its servers from (``server_class``)."""
_REQUIRED = ("vLLMHttpServerBase", "TokenOutput", "SamplingParams", "TokensPrompt")


def make_token_output_class(token_output: type) -> type:
    """``TokenOutput`` (a pydantic model) plus the fields agentboost reads."""

    class StrandsTokenOutput(token_output):  # type: ignore[misc, valid-type]
        finish_reason: str | None = None
        stop_reason: int | str | None = None
        weight_version: int | None = None

    StrandsTokenOutput.__name__ = StrandsTokenOutput.__qualname__ = "StrandsTokenOutput"
    return StrandsTokenOutput


def install(ns: dict[str, Any]) -> bool:
    """Adapt the server classes in the module namespace ``ns``. Idempotent; returns True if it changed anything."""
    missing = [name for name in _REQUIRED if name not in ns]
    if missing:
        raise RuntimeError(
            f"agentboost: verl's vllm_async_server lacks {missing}; this adapter targets verl 0.6.1 "
            "(run `python apply_patches.py --revert`)"
        )
    base = ns["vLLMHttpServerBase"]
    if getattr(base, MARK, False):
        return False
    output_cls = make_token_output_class(ns["TokenOutput"])
    upstream_wake_up = base.wake_up

    async def generate(
        self: Any,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
    ) -> Any:
        """Token-in/token-out generation that honours ``max_tokens`` and reports why it stopped."""
        params = dict(sampling_params)
        max_model_len = int(self.config.max_model_len)
        room = max_model_len - len(prompt_ids)
        if room <= 0:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room to generate (max_model_len={max_model_len})"
            )
        requested = params.pop("max_tokens", None)
        max_tokens = room if requested is None else max(1, min(int(requested), room))
        want_logprobs = bool(params.pop("logprobs", False))
        params["logprobs"] = 0 if want_logprobs else None
        params.setdefault("repetition_penalty", self.config.get("repetition_penalty", 1.0))
        sampling = ns["SamplingParams"](max_tokens=max_tokens, **params)
        dedup = ns.get("_qwen2_5_vl_dedup_image_tokens")
        if dedup is not None:
            prompt_ids = dedup(prompt_ids, self.model_config.processor)
        prompt = ns["TokensPrompt"](
            prompt_token_ids=prompt_ids, multi_modal_data={"image": image_data} if image_data else None
        )
        lora_request = None
        use_lora = getattr(self.model_config, "lora_rank", 0) > 0 and "LoRARequest" in ns
        if use_lora and ns["VLLM_LORA_INT_ID"] in await self.engine.list_loras():
            lora_request = ns["LoRARequest"](
                lora_name=ns["VLLM_LORA_NAME"], lora_int_id=ns["VLLM_LORA_INT_ID"], lora_path=ns["VLLM_LORA_PATH"]
            )
        final = None
        async for output in self.engine.generate(
            prompt=prompt, sampling_params=sampling, request_id=request_id, lora_request=lora_request
        ):
            final = output
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        log_probs = None
        if want_logprobs:
            if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
                raise RuntimeError(f"vLLM returned no log-probs for request {request_id}")
            log_probs = [float(step[token].logprob) for token, step in zip(token_ids, completion.logprobs, strict=True)]
        stop_reason = completion.stop_reason
        return output_cls(
            token_ids=token_ids,
            log_probs=log_probs,
            finish_reason=completion.finish_reason,
            stop_reason=stop_reason if isinstance(stop_reason, int | str) else None,
            weight_version=getattr(self, "_agentboost_weight_version", 0),
        )

    async def wake_up(self: Any) -> Any:
        result = await upstream_wake_up(self)
        self._agentboost_weight_version = getattr(self, "_agentboost_weight_version", 0) + 1
        return result

    upstream = {"generate": base.generate, "wake_up": upstream_wake_up}
    actor_classes = _ray_actor_classes(ns, base)
    for actor_class in actor_classes:  # checked before anything changes: all or nothing
        for name, upstream_fn in upstream.items():
            copy = actor_class.__dict__.get(name)
            if copy is not None and inspect.unwrap(copy) is not upstream_fn:
                raise RuntimeError(
                    f"agentboost: {actor_class.__qualname__}.{name} is not verl 0.6.1's vLLMHttpServerBase.{name}; "
                    "the adapter cannot replace it (run `python apply_patches.py --revert`)"
                )
    generate.__wrapped_upstream__ = upstream["generate"]  # type: ignore[attr-defined]
    wake_up.__wrapped_upstream__ = upstream_wake_up  # type: ignore[attr-defined]
    base.generate = generate
    base.wake_up = wake_up
    for actor_class in actor_classes:
        for name in upstream:
            if name in actor_class.__dict__:
                delattr(actor_class, name)  # Ray's copy of upstream's method
    setattr(base, MARK, True)
    ns["StrandsTokenOutput"] = output_cls
    logger.info("agentboost: verl vLLM server adapted (max_tokens, finish reason, weight version)")
    return True


def _ray_actor_classes(ns: dict[str, Any], base: type) -> list[type]:
    """The classes that ``@ray.remote`` built from subclasses of ``base`` in the module (``vLLMHttpServer``'s).

    A Ray actor class keeps the class its actors instantiate in ``__ray_metadata__.modified_class``. A
    ``vLLMHttpServer`` in the module that is not such a class is refused: the adapter could not reach it.
    """
    found = []
    for name, value in ns.items():
        modified = getattr(getattr(value, "__ray_metadata__", None), "modified_class", None)
        if isinstance(modified, type) and issubclass(modified, base):
            found.append(modified)
        elif name == SERVER_ACTOR:
            raise RuntimeError(
                f"agentboost: {SERVER_ACTOR} is not a Ray actor class over vLLMHttpServerBase (Ray or veRL changed?); "
                "its actors would run upstream code (run `python apply_patches.py --revert`)"
            )
    return found
