"""A vLLM worker extension that loads a trainer's weights through vLLM's own weight reload (``load_weights``).

Runs inside vLLM's worker processes (``--worker-extension-cls agentboost.integration.vllm_worker.WeightLoader``,
any vLLM environment with this checkout on ``PYTHONPATH``); the server's ``/collective_rpc`` endpoint
(``VLLM_SERVER_DEV_MODE=1``) calls it by name with string arguments only. The weights travel as a safetensors
file (HF names, as verl's actor hands them over): on CPU there is neither CUDA IPC nor NCCL, and a file in the
rollout's work directory is what a trainer and a server process on one machine share. Imports nothing but
torch and safetensors (both come with vLLM).
"""

from __future__ import annotations

from typing import Any


class WeightLoader:
    """Mixed into vLLM's worker class (``self`` is the worker: ``self.model_runner`` is its model runner)."""

    def agentboost_load_weights(self, path: str) -> dict[str, Any]:
        """Load the HF-named tensors of the safetensors file ``path`` into the served model with vLLM's in-place
        reload (``Worker.reload_weights``: the model's own ``load_weights`` between vLLM's layerwise reload
        hooks, which redo what loading does after the checkpoint, e.g. the CPU kernels' weight packing); report
        the model's parameters the file did not set (none, for a full state)."""
        from safetensors.torch import load_file

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        params = {_hf_name(name) for name, _ in model.named_parameters()}
        state = load_file(path)
        loaded: set[str] = set()
        load_weights = model.load_weights

        def recording(weights: Any) -> Any:  # what vLLM's reload loaded (it logs, but does not return, the rest)
            names = load_weights(weights)
            loaded.update(names or ())
            return names

        tied = _tied_layers(model)
        model.load_weights = recording
        try:
            self.reload_weights(weights_iterator=((_hf_name(n), t) for n, t in state.items()))  # type: ignore[attr-defined]
        finally:
            del model.load_weights
        for layer, source in tied:
            # A tied output layer (lm_head sharing embed_tokens' weight) has no checkpoint tensor of its own: vLLM's
            # reload gives it back its old kernel tensors ("ParallelLMHead: Failed to load weights") and the CPU
            # GEMM it built from them. Tie it to the reloaded weight again and redo its post-load processing.
            layer.weight = source.weight
            layer.quant_method.process_weights_after_loading(layer)
        # LoRA slots (lora_a/lora_b stacks) are not the base model's: an adapter sets them
        missing = sorted(n for n in params - {_hf_name(n) for n in loaded} if "lora_" not in n)
        return {"tensors": len(state), "loaded": len(loaded), "missing": missing}


def _tied_layers(model: Any) -> list[tuple[Any, Any]]:
    """(layer, source) for every layer whose ``weight`` is another layer's (``tie_word_embeddings``)."""
    owners: dict[int, Any] = {}
    tied = []
    for _, layer in model.named_modules(remove_duplicate=False):
        weight = layer.__dict__.get("_parameters", {}).get("weight")
        if weight is None:
            continue
        source = owners.setdefault(id(weight), layer)
        if source is not layer and hasattr(layer, "quant_method"):
            tied.append((layer, source))
    return tied


def _hf_name(name: str) -> str:
    """Without LoRA wrappers' ``.base_layer`` (verl's LoRA base sync names the wrapped layers' weights so; vLLM's
    loader takes the plain names, LoRA slots or not)."""
    return name.replace(".base_layer.", ".")
