"""Shared plumbing of the examples' ``prepare_*_data.py`` scripts.

Each script turns a source dataset into rows that :meth:`StrandsEnv.from_dict` reads, then
:func:`write_dataset` writes every split as ``<out>/<split>.jsonl`` (lossless for nested fields) and
registers it with rLLM's ``DatasetRegistry`` when rLLM is installed (what the ``train_*.py`` scripts
load); with ``--verl-out DIR`` :func:`write_verl_dataset` also writes ``DIR/<split>.parquet`` in verl's
``RLHFDataset`` format for the verl-native route (``train_*_verl.sh``). Sources are Hugging Face
datasets (``--cache-dir``; ``--limit`` streams only the rows needed) or, with ``--sample``, the small
raw files shipped next to the script, in the hub rows' format (math, DeepCoder), so the conversion
code that runs offline is the one that runs on the real data. The RAG sample is the exception: its
questions name supporting passages of the shipped corpus by id.

``agentboost prepare`` does the same for any rows and any environment (:func:`prepare_dataset`): every row
is checked to build its environment first (:func:`check_rows`), then both routes' files are written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

Converter = Callable[[dict[str, Any], int], dict[str, Any] | None]
VERL_OUT_AUTO = "<out-dir>/verl"
VERL_AGENT_NAME = "strands_agent"
"""verl's agent-loop name for every row (``agentboost.integration.verl_agent_loop.AGENT_LOOP_NAME``)."""


def add_common_arguments(parser: argparse.ArgumentParser, *, default_out: str) -> None:
    parser.add_argument("--out-dir", default=default_out, help=f"where the split files go (default {default_out})")
    parser.add_argument("--limit", type=int, default=None,
                        help="keep at most N rows per source split (streamed: only those rows are read)")  # fmt: skip
    parser.add_argument("--cache-dir", default=None, help="Hugging Face datasets cache directory")
    parser.add_argument("--sample", action="store_true", help="use the small raw sample shipped with the example")
    parser.add_argument("--register", choices=["auto", "yes", "no"], default="auto",
                        help="register with rLLM's DatasetRegistry (auto: when rLLM is installed)")  # fmt: skip
    add_verl_argument(parser)


def add_verl_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verl-out", nargs="?", const=VERL_OUT_AUTO, default=None, metavar="DIR",
                        help="also write DIR/{train,test}.parquet for the verl route (train_*_verl.sh); "
                             "without DIR: <out-dir>/verl")  # fmt: skip


def verl_out_dir(args: argparse.Namespace) -> Path | None:
    """Where ``--verl-out`` asked the parquet files to go (``None``: not asked)."""
    if args.verl_out is None:
        return None
    return Path(args.out_dir) / "verl" if args.verl_out == VERL_OUT_AUTO else Path(args.verl_out)


def hub_rows(
    name: str, *, split: str, config: str | None = None, cache_dir: str | None = None, limit: int | None = None
) -> Iterable[dict]:
    """Rows of a Hugging Face dataset: the whole split downloaded once into the datasets cache, or, with
    ``limit``, streamed (only the rows the conversion reads are fetched; nothing is cached)."""
    from datasets import load_dataset

    if limit is not None:
        return load_dataset(name, config, split=split, streaming=True)
    return load_dataset(name, config, split=split, cache_dir=cache_dir)


def file_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None


def convert_rows(
    source: Iterable[dict[str, Any]], convert: Converter, *, limit: int | None = None, desc: str = "rows"
) -> list[dict[str, Any]]:
    """Convert raw rows (dropping the ones ``convert`` rejects, counted and logged) with a progress bar."""
    from tqdm import tqdm

    out: list[dict[str, Any]] = []
    rejected = 0
    for index, raw in enumerate(tqdm(source, desc=desc, unit="row", leave=False)):
        if limit is not None and len(out) >= limit:
            break
        row = convert(raw, index)
        if row is None:
            rejected += 1
        else:
            out.append(row)
    if rejected:
        logger.warning("%s: %d rows rejected by the conversion (kept %d)", desc, rejected, len(out))
    logger.info("%s: %d rows", desc, len(out))
    return out


def write_dataset(name: str, splits: dict[str, list[dict[str, Any]]], out_dir: str | Path, *,
                  register: str = "auto") -> dict[str, Path]:  # fmt: skip
    """Write ``<out_dir>/<split>.jsonl`` per split and register them with rLLM (see module doc)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, rows in splits.items():
        if not rows:
            raise ValueError(f"{name}/{split}: no rows survived the conversion")
        path = out / f"{split}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        tmp.replace(path)
        written[split] = path
        logger.info("wrote %s (%d rows)", path, len(rows))
    if register == "no":
        return written
    try:
        from rllm.data.dataset import DatasetRegistry
    except ImportError:
        if register == "yes":
            raise SystemExit("--register yes: rLLM is not installed (see docs/gpu-rllm.md)") from None
        logger.info("rLLM is not installed: not registered (the .jsonl files work with `agentboost eval`)")
        return written
    for split, rows in splits.items():
        DatasetRegistry.register_dataset(name, rows, split)
        logger.info("registered %s/%s with rLLM's DatasetRegistry", name, split)
    return written


# -- the verl-native route ----------------------------------------------------------------------
def verl_row(task: dict[str, Any], *, system_prompt: str | None = None) -> dict[str, Any]:
    """One row of verl's ``RLHFDataset`` for the ``strands_agent`` loop: the task whole in ``extra_info``
    (what the loop's ``row_task`` hands to ``StrandsEnv.from_dict``, as rLLM does with its rows), the chat
    ``prompt`` verl reads as ``raw_prompt`` (the system prompt the agent gets unless the loop's
    ``agent_args`` name one or an agent factory; the task's user turn), ``data_source`` (verl groups
    validation metrics by it), ``agent_name`` and an unused rule ``reward_model`` (the loop scores)."""
    from .environments.strands_env import PROMPT_KEYS

    keys = (task["prompt_key"],) if isinstance(task.get("prompt_key"), str) else PROMPT_KEYS
    user = next((task[k] for k in keys if isinstance(task.get(k), str) and task[k]), None)
    if user is None:
        raise ValueError(f"task {task.get('task_id')!r} has no prompt field (looked for {list(keys)})")
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": user}
    ]
    answer = task.get("answer")
    return {
        "data_source": str(task.get("data_source") or "strands"),
        "agent_name": VERL_AGENT_NAME,
        "prompt": messages,
        "reward_model": {"style": "rule", "ground_truth": answer if isinstance(answer, str) else ""},
        "extra_info": dict(task),
    }


def write_verl_dataset(
    splits: dict[str, list[dict[str, Any]]], out_dir: str | Path, *, system_prompt: str | None = None
) -> dict[str, Path]:
    """Write ``<out_dir>/<split>.parquet`` of :func:`verl_row` rows, then read each file back and refuse
    (ValueError naming the row and field) one whose tasks did not survive parquet exactly: parquet
    unifies the fields of all rows (a field missing from one row comes back as null) and the types of a
    field (an int next to a float comes back as a float). Heterogeneous fields belong in JSON strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, tasks in splits.items():
        if not tasks:
            raise ValueError(f"{split}: no rows to write")
        rows = [verl_row(task, system_prompt=system_prompt) for task in tasks]
        path = out / f"{split}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        try:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            tmp.unlink(missing_ok=True)
            raise ValueError(f"{split}: the rows cannot be stored as parquet ({exc}); keep fields whose type "
                             "differs between rows as JSON strings") from None  # fmt: skip
        back = pq.read_table(tmp, columns=["extra_info"]).column("extra_info").to_pylist()
        for index, (task, stored) in enumerate(zip(tasks, back, strict=True)):
            changed = sorted({*task, *stored} - {k for k in task if k in stored and _same(stored[k], task[k])})
            if changed:
                tmp.unlink(missing_ok=True)
                raise ValueError(
                    f"{split} row {index} ({task.get('task_id')!r}): field(s) {changed} change in parquet "
                    "(missing in some rows, or of another type than in other rows); store them as JSON strings"
                )
        tmp.replace(path)
        written[split] = path
        logger.info("wrote %s (%d rows, verl RLHFDataset format)", path, len(rows))
    return written


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same JSON types all the way down (``1 == 1.0`` but parquet changed the value)."""
    return json.dumps(a, sort_keys=True, default=repr) == json.dumps(b, sort_keys=True, default=repr)


# -- any rows (``agentboost prepare``) ---------------------------------------------------------------
def check_rows(rows: list[dict[str, Any]], env: Any, env_args: dict[str, Any] | None = None, *,
               what: str = "row") -> None:  # fmt: skip
    """Every row builds its environment as a rollout would: the class imports, ``from_dict`` takes the row
    (with ``env_args``), ``reset()`` resolves its tools and ``initial_prompt()`` finds the user turn; task
    ids are unique. ValueError naming the first row that does not, and why."""
    from .data import task_id_of
    from .utils.refs import resolve

    try:
        env_cls = resolve(env)
    except (ImportError, ValueError) as exc:
        raise ValueError(f"--env {env}: {exc}") from None
    if not callable(getattr(env_cls, "from_dict", None)):
        raise ValueError(f"--env {env}: {env_cls!r} is not an environment class (no from_dict)")
    seen: dict[str, int] = {}
    for index, row in enumerate(rows):
        task_id = task_id_of(row, index)
        if task_id in seen:
            raise ValueError(f"{what} rows {seen[task_id]} and {index} have the same task id {task_id!r}")
        seen[task_id] = index
        built = None
        try:
            built = env_cls.from_dict({**row, **(env_args or {})})
            built.reset()
            built.initial_prompt()
        except Exception as exc:  # the row's own error, whatever it is: named, never a traceback
            detail = f"{type(exc).__name__}: {exc}"
            raise ValueError(
                f"{what} row {index} ({task_id!r}) does not build its environment {env}: {detail[:500]}"
            ) from None
        finally:
            if built is not None:
                with contextlib.suppress(Exception):
                    built.close()


def check_disjoint(train: list[dict[str, Any]], held_out: list[dict[str, Any]]) -> None:
    """ValueError when a task id (given in the rows: ``task_id``, ``uid``, ``id`` or ``index``) is both a
    training and a held-out row: the evaluation would measure what was trained on."""
    from .data import task_id_of

    def explicit(rows: list[dict[str, Any]]) -> set[str]:
        return {task_id_of(row, -1) for row in rows if task_id_of(row, -1) != "row--1"}

    both = sorted(explicit(train) & explicit(held_out))
    if both:
        raise ValueError(f"task id {both[0]!r} is both a training and a held-out row ({len(both)} such ids)")


def split_rows(
    rows: list[dict[str, Any]], fraction: float, *, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, held_out)``: a seeded ``fraction`` of the rows held out (at least one when there are two or
    more and ``fraction > 0``; none otherwise), both in their original order."""
    import random

    if fraction <= 0 or len(rows) < 2:
        return list(rows), []
    held = min(len(rows) - 1, max(1, round(len(rows) * fraction)))
    order = list(range(len(rows)))
    random.Random(f"eval-split:{seed}").shuffle(order)
    chosen = set(order[:held])
    return [r for i, r in enumerate(rows) if i not in chosen], [r for i, r in enumerate(rows) if i in chosen]


def prepare_dataset(
    train: list[dict[str, Any]],
    test: list[dict[str, Any]],
    out_dir: str | Path,
    *,
    env: str,
    env_args: dict[str, Any] | None = None,
    system_prompt: str | None = None,
    name: str | None = None,
    register: str = "auto",
) -> dict[str, Path]:
    """Any rows -> both GPU routes' datasets, after :func:`check_rows` on every row:

    * ``<out>/{train,test}.jsonl``, registered with rLLM's ``DatasetRegistry`` as ``name`` when rLLM is
      installed (the rLLM route; :func:`write_dataset`);
    * ``<out>/verl/{train,test}.parquet`` (the verl route; :func:`write_verl_dataset`, read back and
      refused if parquet would change a task);
    * ``<out>/prepare.json``: the environment, its arguments and the counts (what the launch script needs).

    Everything is written into a temporary directory first and moved into place at the end: a failure
    leaves ``out_dir`` as it was."""
    import shutil
    import tempfile

    if not train:
        raise ValueError("no training rows")
    check_rows(train, env, env_args, what="--data")
    check_rows(test, env, env_args, what="held-out")
    check_disjoint(train, test)
    if not test:
        raise ValueError("no held-out rows: give --eval-data or an --eval-fraction above 0 with two rows or more")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: a file, not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_verl_dataset({"train": train, "test": test}, staging / "verl", system_prompt=system_prompt)
        write_dataset(name or out.name, {"train": train, "test": test}, staging, register="no")
        record = {"env_class": env, "env_args": dict(env_args or {}), "system_prompt": system_prompt,
                  "rows": {"train": len(train), "test": len(test)}, "name": name or out.name}  # fmt: skip
        (staging / "prepare.json").write_text(json.dumps(record, indent=2))
        out.mkdir(parents=True, exist_ok=True)
        (out / "verl").mkdir(exist_ok=True)
        written = {}
        for relative in ("verl/train.parquet", "verl/test.parquet", "train.jsonl", "test.jsonl", "prepare.json"):
            (staging / relative).replace(out / relative)
            written[relative] = out / relative
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if register != "no":
        write_dataset(name or out.name, {"train": train, "test": test}, out, register=register)
    return written
