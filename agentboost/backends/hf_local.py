"""In-process generation with a Hugging Face ``transformers`` causal LM (CPU or one GPU).

The embedded default for a single machine and for tests. Concurrent requests (one per in-flight
episode) are micro-batched: every request already waiting joins the batch, which stays open while
requests keep arriving (a short window after each, a cap from the first); up to ``max_batch_size``
requests are left-padded into one batch and decoded together with a KV cache by
a sampling loop that applies each request's own temperature / top-k / top-p / min-p / seed /
``max_tokens`` / stop tokens. Generation runs in a worker thread so the event loop stays free.

The prompts' common prefix (system prompt, tool specs) is prefilled once and its cache shared by the
batch, as vLLM's prefix caching does, once a first batch showed that this gives the full prefill's
logits for this model (otherwise every prompt is prefilled in full).

Logprobs are log-softmax of the raw logits at each sampled position (vLLM's default semantics).
``model`` may be a live ``nn.Module`` that a trainer is updating: rollouts then always come from the
current weights. Hold :attr:`HFLocalBackend.lock` while changing weights.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from ..errors import BackendContextOverflow, BackendError
from ..utils.torch_errors import is_out_of_memory
from .base import FINISH_LENGTH, FINISH_STOP, GenerationRequest, GenerationResult

logger = logging.getLogger(__name__)

CANCEL_WAIT_S = 10.0
"""How long a cancelled batcher waits for its decode thread to stop (one token step, normally)."""


@dataclass
class _Pending:
    request: GenerationRequest
    future: asyncio.Future[GenerationResult]


class HFLocalBackend:
    """Micro-batched in-process generation.

    Args:
        model: an ``nn.Module`` causal LM, or a local path loaded with ``AutoModelForCausalLM``
            (``local_files_only``; no hub download).
        device: torch device; defaults to the model's device (CUDA if a path is loaded and CUDA exists).
        max_batch_size: requests decoded together.
        batch_window_s: how long a batch waits for one more request after the last one arrived.
        max_batch_wait_s: how long a batch waits for company at most, from its first request.
        max_context: refuse prompts + max_tokens beyond this (defaults to the model's
            ``max_position_embeddings``).
    """

    def __init__(
        self,
        model: Any,
        *,
        device: str | None = None,
        dtype: Any = None,
        max_batch_size: int = 8,
        batch_window_s: float = 0.005,
        max_batch_wait_s: float = 0.1,
        max_context: int | None = None,
        pad_token_id: int = 0,
    ) -> None:
        import torch

        if isinstance(model, str):
            from transformers import AutoModelForCausalLM

            target = device or ("cuda" if torch.cuda.is_available() else "cpu")
            model = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=dtype or "auto")
            model.to(target)
        self.model = model
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self.max_batch_wait_s = max(max_batch_wait_s, batch_window_s)
        self.max_context = max_context or int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.pad_token_id = pad_token_id
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.lock = threading.Lock()
        """Held while a batch decodes; a trainer holds it while updating weights."""
        # Per event loop (weakly: a loop a summariser ran in and closed takes its queue with it; a new loop
        # reusing a dead one's id never gets a queue whose batcher died with it).
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Queue[_Pending]] = (
            weakref.WeakKeyDictionary()
        )
        self._workers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )
        self.batches = 0
        self.compactions = 0
        """Times a decoding batch dropped its finished rows (their cache included) to go on with the rest."""
        self.tokens_generated = 0
        self.shares_prefix: bool | None = None
        """Whether batches prefill their common prefix once (None until a batch could; checked then)."""
        self.policy: str | None = None
        """What the weights are now, when they are not the loaded model's (a trainer's policy at its step):
        what the episodes' ``backend`` says, so an evaluation of trained weights is not labelled with the
        directory they were loaded from."""

    def describe(self) -> str:
        name = self.policy or getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__
        return f"hf-local({name}, {self.device})"

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if len(request.prompt_ids) + request.max_tokens > self.max_context:
            raise BackendContextOverflow(
                f"prompt ({len(request.prompt_ids)}) + max_tokens ({request.max_tokens}) exceeds the model's "
                f"context of {self.max_context} tokens"
            )
        if any(t >= self.vocab_size for t in request.prompt_ids):
            raise BackendError("prompt contains token ids outside the model's vocabulary")
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = asyncio.Queue()
        worker = self._workers.get(loop)
        if worker is None or worker.done():
            self._workers[loop] = loop.create_task(self._batcher(queue))
        future: asyncio.Future[GenerationResult] = loop.create_future()
        await queue.put(_Pending(request, future))
        return await future

    async def _collect(self, queue: asyncio.Queue[_Pending]) -> list[_Pending]:
        """The next batch: the first waiting request, everything already queued behind it, and what
        arrives while requests keep coming (each arrival holds the batch open ``batch_window_s``
        longer, ``max_batch_wait_s`` at most after the first)."""
        batch = [await queue.get()]
        closes = time.monotonic() + self.max_batch_wait_s
        while len(batch) < self.max_batch_size:
            while len(batch) < self.max_batch_size and not queue.empty():  # queued already: never left behind
                batch.append(queue.get_nowait())
            # the window runs from now: the last arrival, or the moment this batch saw the queue empty
            timeout = min(self.batch_window_s, closes - time.monotonic())
            if len(batch) >= self.max_batch_size or timeout <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), timeout))
            except (TimeoutError, asyncio.TimeoutError):
                break
        return batch

    async def _batcher(self, queue: asyncio.Queue[_Pending]) -> None:
        while True:
            batch = await self._collect(queue)
            live = [p for p in batch if not p.future.cancelled()]
            if not live:
                continue
            stop = threading.Event()
            try:
                results = await asyncio.to_thread(self._decode_batch, [p.request for p in live], stop)
            except asyncio.CancelledError:  # the loop is closing (a run stopped): the thread stops at its next
                stop.set()  # token; wait for it, or interpreter exit can kill it inside torch (abort, exit 134)
                if self.lock.acquire(timeout=CANCEL_WAIT_S):
                    self.lock.release()
                raise
            except Exception as exc:  # a failed batch fails its requests, never the batcher
                logger.exception("local generation failed")
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(BackendError(f"local generation failed: {exc}"))
                continue
            for p, result in zip(live, results, strict=True):
                if not p.future.done():
                    p.future.set_result(result)

    # -- decoding (worker thread) --------------------------------------------------------
    def _decode_batch(
        self, requests: list[GenerationRequest], stop: threading.Event | None = None
    ) -> list[GenerationResult]:
        import torch

        with self.lock, torch.inference_mode():
            was_training = self.model.training
            self.model.eval()
            try:
                return self._decode(requests, stop)
            finally:
                if was_training:
                    self.model.train()

    def _decode(self, requests: list[GenerationRequest], stop: threading.Event | None = None) -> list[GenerationResult]:
        import torch

        n = len(requests)
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(requests):
            input_ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attention[i, width - len(r.prompt_ids) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        shared = self._shared_prefill(requests)
        generators = []
        for r in requests:
            if r.sampling.seed is not None:  # the request's own (a TokenModel sends each call its own)
                g = torch.Generator(device="cpu")
                g.manual_seed(int(r.sampling.seed) % (2**63))
                generators.append(g)
            else:
                generators.append(None)
        stops = [set(r.stop_token_ids) for r in requests]
        budgets = [r.max_tokens for r in requests]
        out_ids: list[list[int]] = [[] for _ in requests]
        out_lp: list[list[float]] = [[] for _ in requests]
        finished = [False] * n
        finish = [FINISH_LENGTH] * n
        seen = [set(r.prompt_ids) for r in requests]

        # Only the last position's logits are needed: never materialise [batch, prompt, vocab].
        if shared is not None:
            output, attention, positions = shared
        else:
            output = self.model(
                input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
            )
        past = output.past_key_values
        logits = output.logits[:, -1, :]
        last_pos = positions[:, -1]
        rows = list(range(n))  # the request in each row of the batch: finished ones leave it once a quarter is done
        row_requests, row_generators, row_seen = requests, generators, seen
        for _ in range(max(budgets)):
            raw_logits = logits.float().cpu()
            raw = torch.log_softmax(raw_logits, dim=-1)
            active = [j for j, i in enumerate(rows) if not finished[i]]
            chosen = _choose(raw_logits, active, row_requests, row_generators, row_seen)
            for j in active:
                i, token = rows[j], chosen[j]
                out_ids[i].append(token)
                out_lp[i].append(float(raw[j, token]))
                seen[i].add(token)
                if token in stops[i]:
                    finished[i], finish[i] = True, FINISH_STOP
                elif len(out_ids[i]) >= budgets[i]:
                    finished[i] = True
            if all(finished) or (stop is not None and stop.is_set()):
                break
            next_tokens = [self.pad_token_id if finished[i] else chosen[j] for j, i in enumerate(rows)]
            live = [j for j, i in enumerate(rows) if not finished[i]]
            if len(live) <= len(rows) * 3 // 4 and _compactable(past):
                index = torch.tensor(live, dtype=torch.long, device=self.device)
                past.batch_select_indices(index)
                attention, last_pos = attention[index], last_pos[index]
                rows, next_tokens = [rows[j] for j in live], [next_tokens[j] for j in live]
                row_requests = [requests[i] for i in rows]
                row_generators, row_seen = [generators[i] for i in rows], [seen[i] for i in rows]
                self.compactions += 1
            step = torch.tensor(next_tokens, dtype=torch.long, device=self.device).unsqueeze(-1)
            attention = torch.cat([attention, attention.new_ones((len(rows), 1))], dim=-1)
            last_pos = last_pos + 1
            output = self.model(
                input_ids=step,
                attention_mask=attention,
                position_ids=last_pos.unsqueeze(-1),
                past_key_values=past,
                use_cache=True,
            )
            past = output.past_key_values
            logits = output.logits[:, -1, :]
        self.batches += 1
        self.tokens_generated += sum(len(x) for x in out_ids)
        return [
            GenerationResult(
                token_ids=out_ids[i],
                logprobs=out_lp[i] if r.sampling.logprobs else None,
                finish_reason=finish[i],
                server=self.describe(),
            )
            for i, r in enumerate(requests)
        ]

    def _shared_prefill(self, requests: list[GenerationRequest]) -> tuple[Any, Any, Any] | None:
        """(prefill output, attention mask, positions) with the prompts' common prefix run once, or
        None where there is none worth sharing or this model was found not to support it."""
        k = _common_prefix(requests)
        if k < _MIN_SHARED_PREFIX or self.shares_prefix is False:
            return None
        if self.shares_prefix is None:
            window = _sliding_window(self.model)
            if window:  # the tails' left padding would sit inside the prefix's window: not the full prefill's
                logger.info("%s: sliding-window attention (%s); prompts are prefilled in full", self.describe(), window)
                self.shares_prefix = False
                return None
            self.shares_prefix = self._shared_prefill_matches(requests[:2], k)
            if not self.shares_prefix:
                return None
        return self._prefill_sharing(requests, k)

    def _prefill_sharing(self, requests: list[GenerationRequest], k: int) -> tuple[Any, Any, Any]:
        import torch

        n = len(requests)
        prefix = torch.tensor([requests[0].prompt_ids[:k]], dtype=torch.long, device=self.device)
        cache = self.model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
        cache.batch_repeat_interleave(n)
        width = max(len(r.prompt_ids) - k for r in requests)
        rest = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        rest_attention = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(requests):
            tail = r.prompt_ids[k:]
            rest[i, width - len(tail) :] = torch.tensor(tail, dtype=torch.long)
            rest_attention[i, width - len(tail) :] = 1
        rest, rest_attention = rest.to(self.device), rest_attention.to(self.device)
        attention = torch.cat([torch.ones((n, k), dtype=torch.long, device=self.device), rest_attention], dim=-1)
        positions = k + (rest_attention.cumsum(-1) - 1).clamp(min=0)
        output = self.model(
            input_ids=rest, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        return output, attention, positions

    def _shared_prefill_matches(self, requests: list[GenerationRequest], k: int) -> bool:
        """Once per backend: the shared prefill's next-token logits against a full prefill's."""
        import torch

        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, r in enumerate(requests):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attention[i, width - len(r.prompt_ids) :] = 1
        ids, attention = ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        full = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=1)
        full_logits = full.logits[:, -1].float()
        try:
            shared_logits = self._prefill_sharing(requests, k)[0].logits[:, -1].float()
        except (AttributeError, TypeError, ValueError, NotImplementedError, RuntimeError) as exc:
            if is_out_of_memory(exc):  # a passing OOM says nothing about the model
                raise
            logger.info("%s: prompts' common prefix cannot be prefilled once (%s: %s); prefilling in full",
                        self.describe(), type(exc).__name__, exc)  # fmt: skip
            return False
        gap = float((full_logits - shared_logits).abs().max())
        ok = gap <= 1e-3 * (1.0 + float(full_logits.abs().max()))
        if not ok:
            logger.info("%s: a shared-prefix prefill differs from the full one (max logit difference %.3g); "
                        "prefilling in full", self.describe(), gap)  # fmt: skip
        return ok


_MIN_SHARED_PREFIX = 16


def _sliding_window(model: Any) -> str | None:
    """What makes ``model`` attend through a sliding window (None when it does not): Mistral-style
    ``sliding_window``, Qwen2's ``use_sliding_window``, per-layer ``layer_types`` (Gemma 2/3, Cohere 2)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        sliding = [t for t in layer_types if "sliding" in str(t)]
        return f"{len(sliding)} of {len(layer_types)} layers" if sliding else None
    window = getattr(config, "sliding_window", None)
    return f"window {window}" if window else None


def _compactable(cache: Any) -> bool:
    """Whether finished rows can leave ``cache``: a ``DynamicCache`` whose layers are all plain key/value
    layers (exactly ``DynamicLayer`` / ``DynamicSlidingWindowLayer``: transformers 5's hybrid layers
    subclass ``DynamicLayer`` but hold convolution / recurrent states its row selection leaves alone).
    Other caches keep every row to the end of the batch."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    plain = (DynamicLayer, DynamicSlidingWindowLayer)
    return type(cache) is DynamicCache and all(type(layer) in plain for layer in cache.layers)


def _common_prefix(requests: list[GenerationRequest]) -> int:
    """Tokens every prompt starts with, short of each prompt's last token (it must be prefilled with
    the prompt's own tail to give that prompt's next-token logits)."""
    if len(requests) < 2:
        return 0
    first = requests[0].prompt_ids
    limit = min(len(r.prompt_ids) for r in requests) - 1
    k = 0
    while k < limit and all(r.prompt_ids[k] == first[k] for r in requests):
        k += 1
    return k


def _choose(
    raw_logits: Any, rows: list[int], requests: list[GenerationRequest], generators: list[Any], seen: list[set[int]]
) -> dict[int, int]:
    """Next token of each active row. Rows that share their sampling settings are processed together
    and drawn by inverse CDF with one uniform number per row, taken from the row's own generator when
    it has a seed (so a seeded request samples the same tokens whatever batch it lands in). Rows with
    a repetition penalty are sampled one by one."""
    import torch

    chosen: dict[int, int] = {}
    groups: dict[tuple[float, float, int, float], list[int]] = {}
    for i in rows:
        s = requests[i].sampling
        if s.repetition_penalty == 1.0:
            groups.setdefault((s.temperature, s.top_p, s.top_k, s.min_p), []).append(i)
        else:
            chosen[i] = _sample(raw_logits[i], s, generators[i], seen[i])
    for (temperature, top_p, top_k, min_p), members in groups.items():
        logits = raw_logits[members]
        if temperature == 0:
            picks = torch.argmax(logits, dim=-1)
        else:
            logits = logits / temperature
            if 0 < top_k < logits.shape[-1]:
                kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            if min_p > 0:
                probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
            if top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
                drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > top_p
                probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
            cdf = torch.cumsum(probs / probs.sum(dim=-1, keepdim=True), dim=-1)
            uniform = torch.cat([torch.rand(1, generator=generators[i]) for i in members]).unsqueeze(-1)
            picks = torch.searchsorted(cdf, uniform * cdf[:, -1:]).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
        for i, token in zip(members, picks.tolist(), strict=True):
            chosen[i] = int(token)
    return chosen


def _sample(raw_logits: Any, sampling: Any, generator: Any, seen: set[int]) -> int:
    """Sample one token id from a row of raw logits with the request's processing."""
    import torch

    logits = raw_logits.clone()
    if sampling.repetition_penalty != 1.0 and seen:
        idx = torch.tensor(sorted(seen), dtype=torch.long)
        vals = logits[idx]
        logits[idx] = torch.where(vals > 0, vals / sampling.repetition_penalty, vals * sampling.repetition_penalty)
    if sampling.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < logits.numel():
        kth = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.min_p > 0:
        probs = probs.masked_fill(probs < sampling.min_p * probs.max(), 0.0)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        drop = cumulative - sorted_probs > sampling.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))
