"""The tiny model that the real-vLLM tests and benchmarks serve, and the scripted episodes it replays.

A Qwen2 of the real models' shape in miniature: hidden 256, 4 attention heads of 64 (2 key-value heads),
2 layers, fp32, tied embeddings, the real Qwen vocabulary (151,936 rows, as Qwen2.5 and Qwen3 have) and the
real Qwen2.5 tokenizer (:mod:`agentboost.offline.tokenizer_builder`). Random weights call no tool and never
stop, so the model is warm-started on a few scripted episodes (:data:`SCRIPTS`: tool calls with the Qwen2.5
template, thinking and tool calls with Qwen3's, an ``<|endoftext|>`` ending, a tool whose result overflows
the server's context) until greedy decoding replays each of them token for token with a margin; elsewhere it
samples as a random model does. Both templates render client-side over one vocabulary, so one server serves
every script.

Built offline and deterministically (seeded), cached by a fingerprint of everything it is made from::

    python -m agentboost.testing.served_model OUT_DIR
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from strands import tool

logger = logging.getLogger(__name__)

VOCAB_SIZE = 151_936
"""Rows of the embedding (Qwen2.5's and Qwen3's): more than either tokenizer has ids, as in the real models."""
SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
MAX_POSITIONS = 4096
SEED = 0
MARGIN = 3.0
"""Each scripted token's logit must beat every other by this much (greedy replays it on any fp32 engine)."""
MAX_STEPS = 400
_CHECK_EVERY = 10
LEARNING_RATE = 3e-3
_BUILD_VERSION = 1
_MANIFEST = "agentboost_served_model.json"
BIG_PAGE_WORDS = 2500
"""Words (one token each) of the page ``fetch_page`` returns: more than the servers' 2048-token window."""


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


@tool
def mul(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a * b


@tool
def fetch_page(url: str) -> str:
    """Fetch a web page.

    Args:
        url: the page's address
    """
    return " ".join(["word"] * BIG_PAGE_WORDS)


TOOLS = {"add": add, "mul": mul, "fetch_page": fetch_page}


@dataclass(frozen=True)
class Script:
    """One episode the served model replays greedily: the task, the agent, the chat template and the replies."""

    name: str
    tokenizer: str
    """The offline tokenizer family whose chat template renders it (``qwen2.5``, ``qwen3``)."""
    prompt: str
    replies: tuple[str, ...]
    """The model's turns as text; each ends with the template's end-of-turn token unless ``end_token`` says."""
    tools: tuple[str, ...] = ()
    system_prompt: str | None = "Use the tools."
    answer: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    end_token: str | None = None
    """The last reply's end token when it is not the end-of-turn token (e.g. ``<|endoftext|>``)."""
    learned: int | None = None
    """How many replies the model learns (the rest the scripted run needs but a server never reaches)."""


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


SCRIPTS: dict[str, Script] = {
    script.name: script
    for script in (
        Script(
            "qwen2.5-tools", "qwen2.5", "What is (2+3) + 4*5?",
            (_call("add", a=2, b=3) + "\n" + _call("mul", a=4, b=5), _call("add", a=5, b=20), "The answer is 25."),
            tools=("add", "mul"), answer="The answer is 25.",
        ),
        Script(
            "qwen3-thinking", "qwen3", "What is (6+1) * 3?",
            ("<think>\nFirst 6 + 1.\n</think>\n\n" + _call("add", a=6, b=1),
             "<think>\nNow times 3.\n</think>\n\n" + _call("mul", a=7, b=3),
             "<think>\nDone.\n</think>\n\nThe answer is 21."),
            tools=("add", "mul"), answer="The answer is 21.",
        ),
        Script(
            "qwen2.5-endoftext", "qwen2.5", "Say hello.", ("Hello!",), system_prompt=None, answer="Hello!",
            end_token="<|endoftext|>",
        ),
        Script(
            "qwen2.5-big-page", "qwen2.5", "Read the page at https://example.com/big.",
            (_call("fetch_page", url="https://example.com/big"), "It is long."), tools=("fetch_page",), learned=1,
        ),
    )
}  # fmt: skip
"""Every episode the served model replays (the tests run them against the real server)."""


def exact_answer(task: dict[str, Any], episode: Any) -> float:
    """Reward: 1.0 when the final text is the task's ``answer``."""
    return float(episode.final_text.strip() == str(task.get("answer")))


def template_for(script: Script) -> Any:
    from ..chat.template import ChatTemplate
    from ..offline.tokenizer_builder import load_tokenizer

    return ChatTemplate(load_tokenizer(script.tokenizer), template_kwargs=dict(script.template_kwargs))


async def run_script(
    script: Script, backend: Any, template: Any = None, settings: Any = None, *, episode_id: str | None = None
) -> Any:
    """Run ``script``'s task with a real Strands agent against ``backend`` (the scripted replies' backend,
    or a server of the served model): the episode record."""
    from ..agents.strands_agent import StrandsAgent
    from ..environments.strands_env import StrandsEnv
    from ..rollout import run_episode

    env = StrandsEnv({"prompt": script.prompt, "answer": script.answer}, tools=[TOOLS[t] for t in script.tools],
                     reward_fn=exact_answer)  # fmt: skip
    agent = StrandsAgent(system_prompt=script.system_prompt)
    template = template if template is not None else template_for(script)
    return await run_episode(env, agent, backend, template, settings, episode_id=episode_id)


def scripted_backend(script: Script, template: Any) -> Any:
    """A backend answering ``script``'s replies in order (canonical BPE ids, then the end token)."""
    from ..backends.scripted import ScriptedBackend

    completions = []
    for i, reply in enumerate(script.replies):
        end = script.end_token if script.end_token and i == len(script.replies) - 1 else None
        end_id = template.tokenizer.convert_tokens_to_ids(end) if end else template.info.eot_token_id
        completions.append([*template.encode(reply), end_id])
    return ScriptedBackend(completions)


def greedy_settings(**budget: Any) -> Any:
    """Greedy sampling (the replies replay exactly) with log-probs, and a budget the scripts fit in."""
    from ..rollout import RolloutSettings
    from ..types import Budget, SamplingParams

    return RolloutSettings(
        sampling=SamplingParams(temperature=0.0), budget=Budget(**{"max_total_tokens": 8192, **budget})
    )


def reference_episode(script: Script, template: Any = None) -> Any:
    """``script`` run against its scripted replies: what a server of the served model must reproduce."""
    template = template if template is not None else template_for(script)
    return asyncio.run(run_script(script, scripted_backend(script, template), template, greedy_settings()))


def _fingerprint() -> str:
    parts = [_BUILD_VERSION, VOCAB_SIZE, SHAPE, MAX_POSITIONS, SEED, MARGIN, MAX_STEPS, LEARNING_RATE, BIG_PAGE_WORDS,
             [asdict(s) for s in SCRIPTS.values()]]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def default_dir() -> Path:
    from ..offline.tokenizer_builder import _cache_root

    return _cache_root() / "served-model" / _fingerprint()


def is_current(out_dir: str | Path) -> bool:
    """Whether ``out_dir`` holds a build of this module's current definition."""
    try:
        manifest = json.loads((Path(out_dir) / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("fingerprint") == _fingerprint()


def training_rows() -> list[tuple[str, list[int], list[int]]]:
    """(script name, token ids, positions of the model's tokens) of every script's reference episode."""
    rows = []
    for script in SCRIPTS.values():
        episode = reference_episode(script)
        ids = episode.prompt_ids + episode.response_ids
        start = len(episode.prompt_ids)
        positions = [start + i for i, m in enumerate(episode.response_mask) if m]
        if script.learned is not None:
            last = episode.calls[script.learned - 1]
            ids = ids[: last.context_tokens + last.completion_tokens]
            positions = [p for p in positions if p < len(ids)]
        rows.append((script.name, ids, positions))
    return rows


def build_served_model(out_dir: str | Path | None = None, *, force: bool = False) -> Path:
    """Build (or reuse, when current) the served model directory; returns its path."""
    out = Path(out_dir) if out_dir is not None else default_dir()
    if is_current(out) and not force:
        return out
    import torch

    from ..offline.tiny_model import build_tiny_qwen2, save_model
    from ..offline.tokenizer_builder import load_tokenizer

    started = time.monotonic()
    tokenizer = load_tokenizer("qwen2.5")
    rows = training_rows()
    model, tokenizer = build_tiny_qwen2(
        tokenizer=tokenizer, vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_POSITIONS, seed=SEED, **SHAPE
    )
    steps, worst = _warm_start(model, rows)
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    model.generation_config.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model.generation_config.bos_token_id = None
    staging = out.with_name(out.name + f".partial-{os.getpid()}")
    save_model(model, tokenizer, staging)
    manifest = {"fingerprint": _fingerprint(), "warm_start_steps": steps, "worst_margin": worst,
                "scripts": sorted(SCRIPTS), "seconds": round(time.monotonic() - started, 1),
                "torch": torch.__version__}  # fmt: skip
    (staging / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(out)
    logger.info("served model in %s: %d warm-start steps, worst margin %.2f, %.0f s", out, steps, worst,
                manifest["seconds"])  # fmt: skip
    return out


def _warm_start(model: Any, rows: Sequence[tuple[str, list[int], list[int]]]) -> tuple[int, float]:
    """Teach the model its scripts: teacher forcing on the scripted tokens, the embedding (tied to the output
    head) kept as initialised, each position's final hidden state pulled towards its next token's embedding
    (cosine), which needs no 151,936-way softmax. Every :data:`_CHECK_EVERY` steps the margins are measured
    over the whole vocabulary; done when each scripted token wins by :data:`MARGIN` (~100 steps, ~25 s of one
    core). Returns (steps, worst margin)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic, and light beside whatever else runs
    try:
        torch.manual_seed(SEED)
        embedding = model.get_input_embeddings().weight
        with torch.no_grad():  # Qwen2 zeroes the pad token's row (<|endoftext|>), which could never win
            pad = model.config.pad_token_id
            if pad is not None:
                embedding[pad] = torch.randn(embedding.shape[1]) * model.config.initializer_range
        head = model.get_output_embeddings().weight
        head.requires_grad_(False)
        model.train()
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
        inputs = [torch.tensor([ids]) for _, ids, _ in rows]
        where = [torch.tensor(positions) - 1 for _, _, positions in rows]  # the states that predict each token
        targets = torch.cat([torch.tensor(ids)[torch.tensor(positions)] for _, ids, positions in rows])
        directions = torch.nn.functional.normalize(head[targets], dim=1)
        worst = float("-inf")
        for step in range(MAX_STEPS + 1):
            hidden = torch.cat(
                [model.model(input_ids=x).last_hidden_state[0, at] for x, at in zip(inputs, where, strict=True)]
            )
            if step % _CHECK_EVERY == 0:
                with torch.no_grad():
                    logits = hidden @ head.T
                    chosen = logits.gather(1, targets[:, None])[:, 0]
                    worst = float((chosen - logits.scatter(1, targets[:, None], float("-inf")).max(dim=1).values).min())
                logger.debug("warm start step %d: worst margin %.2f", step, worst)
                if worst >= MARGIN:
                    model.eval()
                    return step, worst
            if step == MAX_STEPS:
                break
            loss = 1 - torch.nn.functional.cosine_similarity(hidden, directions, dim=1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        raise RuntimeError(
            f"the served model did not learn its scripts in {MAX_STEPS} steps (worst margin {worst:.2f})"
        )
    finally:
        torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentboost.testing.served_model", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", nargs="?", default=None, help="where to write it (default: the cache)")
    parser.add_argument("--force", action="store_true", help="rebuild even if a current build is there")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    path = build_served_model(args.out_dir, force=args.force)
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
