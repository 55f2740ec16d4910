"""Load dataset rows (JSONL, JSON, parquet) for rollouts and evaluation.

Rows of rLLM's verl parquet files (``{"prompt": ..., "extra_info": <row>}``) are unwrapped to the
original row, which is what ``StrandsEnv.from_dict`` reads. Rows are JSON values whatever the file
format (they travel to worker processes and into the evaluator's store as JSON): parquet timestamps
and dates become ISO strings, decimals strings, binary values UTF-8 text (base64 when not UTF-8).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_rows(path: str | Path, *, limit: int | None = None) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix in (".jsonl", ".jsonl.gz"):
        rows = _read_jsonl(path)
    elif suffix == ".json":
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of rows")
        rows = data
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = [_json_native(row) for row in pq.read_table(path).to_pylist()]
    else:
        raise ValueError(f"{path}: unsupported dataset format {suffix!r} (use .jsonl, .json or .parquet)")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i} is not an object")
        out.append(_unwrap(row))
        if limit is not None and len(out) >= limit:
            break
    return out


def _json_native(value: Any) -> Any:
    """``value`` with the non-JSON types parquet yields turned into JSON ones (see module doc)."""
    import base64
    import datetime
    import decimal

    if isinstance(value, dict):
        return {str(k): _json_native(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_native(v) for v in value]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(bytes(value)).decode("ascii")
    return value


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
    return rows


def _unwrap(row: dict[str, Any]) -> dict[str, Any]:
    extra = row.get("extra_info")
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError:
            extra = None
    if isinstance(extra, dict) and "reward_model" in row:
        return dict(extra)
    return row


def task_id_of(row: dict[str, Any], index: int) -> str:
    for key in ("task_id", "uid", "id", "index"):
        if key in row and row[key] is not None:
            return str(row[key])
    return f"row-{index}"
