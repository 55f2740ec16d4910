"""AdamW that keeps fp32 master weights for low-precision (bf16/fp16) trainable parameters.

An AdamW step is ~lr per weight; a bf16 weight of magnitude 0.02 moves only in steps of ~1.2e-4, so
at lr 1e-5 nearly every update rounds away and full fine-tuning silently does not train. The
optimizer works on fp32 copies and writes them back rounded after every step (LoRA adapters, fp32
already, are their own masters). Gradients are moved to the masters before clipping, so the norm
and the finiteness check are computed in fp32; with micro-batches, ``accumulate()`` after each
backward sums them in fp32 (summed in bf16, GRPO's largely cancelling chunk gradients lose digits).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_LOW_PRECISION = ("bfloat16", "float16")


class MasterWeightAdamW:
    """``torch.optim.AdamW`` over fp32 masters of ``params``. Use: ``backward()`` (with micro-batches:
    ``backward()`` then ``accumulate()`` per micro-batch), then ``clip_grad_norm_(max_norm)`` (returns
    the fp32 norm), then ``step()`` or, for a non-finite norm, ``zero_grad()`` to skip the step."""

    def __init__(self, params: Iterable[Any], *, lr: float, weight_decay: float = 0.0, **kwargs: Any) -> None:
        import torch

        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("no trainable parameters")
        self.masters = []
        for p in self.params:
            if str(p.dtype).rsplit(".", 1)[-1] in _LOW_PRECISION:
                master = p.detach().clone().float()
                master.requires_grad_(True)
                self.masters.append(master)
            else:
                self.masters.append(p)
        self.optimizer = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay, **kwargs)

    def take_weights(self) -> None:
        """Make the masters the weights as they are now, after something else changed them (a warm start
        between this optimizer's creation and its first step): its next step would otherwise write the old
        weights back over them."""
        import torch

        with torch.no_grad():
            for p, m in zip(self.params, self.masters, strict=True):
                if m is not p:
                    m.copy_(p.float())

    @property
    def has_masters(self) -> bool:
        return any(m is not p for m, p in zip(self.masters, self.params, strict=True))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups  # for learning-rate schedulers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def accumulate(self) -> None:
        """Add the low-precision gradients of the backward passes since the last call to the fp32
        masters' and clear them (fp32 parameters accumulate in place as usual)."""
        for p, m in zip(self.params, self.masters, strict=True):
            if m is not p and p.grad is not None:
                grad = p.grad.detach().float()
                m.grad = grad if m.grad is None else m.grad.add_(grad)
                p.grad = None

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip the (fp32) gradients to ``max_norm``; returns their norm before clipping (may be inf/nan)."""
        import torch

        self.accumulate()
        grads = [m for m in self.masters if m.grad is not None]
        if not grads:
            return 0.0
        return float(torch.nn.utils.clip_grad_norm_(grads, max_norm))

    def step(self) -> None:
        import torch

        self.accumulate()
        self.optimizer.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters, strict=True):
                if m is not p:
                    p.copy_(m)
                    m.grad = None  # 4 bytes a weight, not kept through the next rollout

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "masters": [
                m.detach().clone() if m is not p else None for m, p in zip(self.masters, self.params, strict=True)
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        if "optimizer" not in state:  # a plain torch optimizer's state (older checkpoints)
            self.optimizer.load_state_dict(state)
            return
        self.optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for p, m, saved in zip(self.params, self.masters, state.get("masters", []), strict=False):
                if saved is not None and m is not p:
                    m.copy_(saved.to(m.device))
                    p.copy_(m)
