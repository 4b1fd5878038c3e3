"""Framing of pi's RPC stream: stdout split into bounded JSON lines, commands written to
stdin with ids and their responses matched back to a handler."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from pisub.children.process import PipeWriter

MAX_LINE = 16 * 1024 * 1024
"""Longest stdout line read from pi; a longer one is skipped and reported."""

READ_CHUNK = 256 * 1024

Json = dict[str, Any]
ResponseHandler = Callable[[Json], None]
_decode = msgspec.json.Decoder().decode


class LineReader:
    """Splits a byte stream on ``\\n`` only, bounding each line to ``max_line`` bytes."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._skipping = False
        self.oversized = 0

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The complete lines that ``data`` finishes."""
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            if self._skipping:
                self._skipping = False
            else:
                self._buf += data[start:nl]
                line = bytes(self._buf)
                if line.strip():
                    yield line
            self._buf.clear()
            start = nl + 1
        if not self._skipping:
            self._buf += data[start:]
            if len(self._buf) > self.max_line:
                self._buf.clear()
                self._skipping = True
                self.oversized += 1


def decode_object(line: bytes) -> Json | None:
    """The JSON object on ``line``, or None when it is not one (bad JSON, nested too deep,
    another JSON value)."""
    try:
        obj = _decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


class RpcChannel:
    """pi's stdin as an RPC channel: each command gets an id (``pisub-<n>``) and the handler
    of its response waits under that id."""

    def __init__(self) -> None:
        self.stdin: PipeWriter | None = None
        self._next_id = 0
        self._handlers: dict[str, ResponseHandler] = {}

    def send(self, command: Json, on_response: ResponseHandler | None = None) -> str:
        """Send one command (dropped while no stdin is attached); its id."""
        self._next_id += 1
        cid = f"pisub-{self._next_id}"
        if on_response is not None:
            self._handlers[cid] = on_response
        line = json.dumps({"id": cid, **command}, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n"
        if self.stdin is not None:
            self.stdin.write(line)
        return cid

    def handler_of(self, response: Json) -> ResponseHandler | None:
        """The handler waiting for ``response`` (taken: a response is answered once), if any."""
        cid = response.get("id")
        return self._handlers.pop(cid, None) if isinstance(cid, str) else None

    def close(self) -> None:
        """No more commands: pi sees end of file once what is queued is written."""
        if self.stdin is not None:
            self.stdin.close()

    def abort(self) -> None:
        """Drop what is still queued for pi."""
        if self.stdin is not None:
            self.stdin.abort()
