"""The pool <-> worker wire format: length-prefixed JSON frames that cannot execute code.

A frame is ``MAGIC`` (4 bytes), the payload length (4 bytes, big-endian) and a UTF-8 JSON array
``[kind, *fields]``. Tools run inside the worker and may write to (or read from) its descriptors;
the format is chosen so that such bytes are at worst *unreadable*: never unpickled, never code.
A bad magic, an oversized length, invalid JSON or a message of the wrong shape is a
:class:`WireError`, and the side that sees it treats the other as broken.

Episodes travel as :meth:`Episode.to_dict` with each segment's token ids and log-probs packed
(:func:`pack_episode`): base64 of native int64 / float64 arrays (both ends run on one host). Written
and parsed as JSON numbers, those few hundred numbers were most of the pool's cost per episode.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import struct
from array import array
from typing import Any

from ..episode import Episode, Segment

MAGIC = b"ABw1"
_HEADER = struct.Struct(">4sI")
HEADER_SIZE = _HEADER.size
DEFAULT_MAX_FRAME = 512 * 2**20
"""Largest payload accepted (an episode with a long context and its messages is a few MB)."""

# kind -> number of fields after the kind
TO_WORKER = {"run": 1, "stop": 1}
TO_POOL = {"ready": 1, "done": 2, "heartbeat": 3, "fatal": 1}


class WireError(Exception):
    """Bytes on a pool/worker channel that are not a well-formed frame of the protocol."""


def encode(message: list[Any] | tuple[Any, ...], *, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """One frame. Raises ``TypeError``/``ValueError`` for values JSON cannot hold (the caller decides)."""
    payload = json.dumps(list(message), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(payload) > max_frame:
        raise ValueError(f"message of {len(payload)} bytes exceeds the {max_frame}-byte frame limit")
    return _HEADER.pack(MAGIC, len(payload)) + payload


def check(message: Any, kinds: dict[str, int]) -> list[Any]:
    """``message`` if it is ``[kind, *fields]`` with a known kind and its number of fields."""
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise WireError(f"not a protocol message: {_preview(message)}")
    arity = kinds.get(message[0])
    if arity is None or len(message) != arity + 1:
        raise WireError(f"unknown message or wrong arity: {_preview(message)}")
    return message


class FrameDecoder:
    """Incremental decoder for a non-blocking reader: feed bytes, get whole messages."""

    def __init__(self, kinds: dict[str, int], *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._kinds = kinds
        self._max = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[list[Any]]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER_SIZE:
            size = _parse_header(bytes(self._buf[:HEADER_SIZE]), self._max)
            end = HEADER_SIZE + size
            if len(self._buf) < end:
                break
            payload = bytes(self._buf[HEADER_SIZE:end])
            del self._buf[:end]
            out.append(check(_parse_payload(payload), self._kinds))
        if len(self._buf) >= 4 and bytes(self._buf[:4]) != MAGIC:  # fail fast on junk shorter than a header
            raise WireError(f"bad frame header {bytes(self._buf[:HEADER_SIZE])!r}")
        return out


def read_frame(fd: int, kinds: dict[str, int], *, max_frame: int = DEFAULT_MAX_FRAME) -> list[Any] | None:
    """Blocking read of one message from ``fd``; ``None`` at end of stream."""
    header = _read_exact(fd, HEADER_SIZE)
    if header is None:
        return None
    size = _parse_header(header, max_frame)
    payload = _read_exact(fd, size)
    if payload is None:
        raise WireError("stream ended inside a frame")
    return check(_parse_payload(payload), kinds)


def write_all(fd: int, data: bytes) -> None:
    """Blocking write of all of ``data`` (``OSError`` when the other side is gone)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            if got:
                raise WireError("stream ended inside a frame")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _parse_header(header: bytes, max_frame: int) -> int:
    magic, size = _HEADER.unpack(header)
    if magic != MAGIC:
        raise WireError(f"bad frame header {header!r}")
    if size > max_frame:
        raise WireError(f"frame of {size} bytes exceeds the {max_frame}-byte limit")
    return size


def _parse_payload(payload: bytes) -> Any:
    try:
        return json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"unparseable frame payload ({type(exc).__name__}: {exc})") from None


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def pack_episode(episode: Episode) -> dict[str, Any]:
    """``episode.to_dict()`` with every segment's numbers packed (see the module's docstring)."""
    data = episode.to_dict()
    data["segments"] = [_pack_segment(segment) for segment in episode.segments]
    return data


def unpack_episode(data: dict[str, Any]) -> Episode:
    """The episode of :func:`pack_episode`'s record; ``ValueError``/``TypeError``/``KeyError`` when the
    record is not one (the pool makes that episode an ``infra_error``)."""
    segments = data.get("segments")
    if not isinstance(segments, list):
        raise ValueError("episode record without a segment list")
    return Episode.from_dict({**data, "segments": [_unpack_segment(s) for s in segments]})


def _pack_segment(segment: Segment) -> dict[str, Any]:
    packed = {
        "kind": segment.kind.value,
        "call": segment.call,
        "token_ids": _b64(array("q", segment.token_ids)),
        "logprobs": None if segment.logprobs is None else _b64(array("d", segment.logprobs)),
    }
    return packed


def _unpack_segment(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"segment record of type {type(data).__name__}")
    token_ids = _unb64(data.get("token_ids"), "q")
    logprobs = data.get("logprobs")
    logprobs = None if logprobs is None else _unb64(logprobs, "d")
    if logprobs is not None and len(logprobs) != len(token_ids):
        raise ValueError(f"segment with {len(token_ids)} tokens and {len(logprobs)} log-probs")
    return {"kind": data.get("kind"), "call": data.get("call"), "token_ids": token_ids, "logprobs": logprobs}


def _b64(values: array) -> str:
    return base64.b64encode(values.tobytes()).decode("ascii")


def _unb64(text: Any, typecode: str) -> list[Any]:
    if not isinstance(text, str):
        raise ValueError(f"packed numbers of type {type(text).__name__}")
    values = array(typecode)
    try:
        values.frombytes(base64.b64decode(text, validate=True))
    except binascii.Error as exc:
        raise ValueError(f"packed numbers are not base64: {exc}") from None
    return values.tolist()
