"""Capped child logs with an in-memory tail."""

from __future__ import annotations

import os
from pathlib import Path

from pisub.core.fsio import open_append, write_all
from pisub.core.redact import redact

OVERLAP = 4096
"""Bytes kept beyond the shown tail, so redaction sees a secret that straddles the cut whole."""


class StreamSink:
    """One child stream: a log file capped at ``cap`` bytes and the last ``tail_size`` bytes.

    Bytes past the cap are counted but not written; ``truncated`` says so. When the log cannot
    be written (full disk) the bytes are still counted and kept in the tail, the log is left as
    it is (``write_error`` says why) and ``truncated`` is set.

    The tail is returned redacted (:meth:`tail_text`), and it is redacted **before** it is cut:
    :data:`OVERLAP` more bytes are kept than shown, so a secret that straddles the cut is
    recognised whole and never leaks as a headless fragment.
    """

    def __init__(self, path: Path | None, cap: int, tail_size: int) -> None:
        """``path`` None: no log file (a run without artifacts), only the count and the tail."""
        self.path = path
        self.cap = cap
        self.tail_size = tail_size
        self.total = 0
        self.written = 0
        self.truncated = False
        self.write_error: OSError | None = None
        self._tail = bytearray()
        self._fd = open_append(path) if path is not None else -1

    def feed(self, data: bytes) -> bool:
        """Take a chunk; True when this chunk made the log hit its cap."""
        self.total += len(data)
        self._tail += data
        keep = self.tail_size + OVERLAP
        if len(self._tail) > keep:
            del self._tail[: len(self._tail) - keep]
        if self.path is None:  # no log kept: nothing is cut
            return False
        room = self.cap - self.written
        newly = False
        if room > 0 and self._fd >= 0 and self.write_error is None:
            part = data[:room]
            try:
                write_all(self._fd, part)
            except OSError as exc:
                self.write_error = exc
                self.truncated = newly = True
                return newly
            self.written += len(part)
            if len(part) < len(data):
                self.truncated = newly = True
        elif data and not self.truncated:
            self.truncated = newly = True
        return newly

    def tail_text(self) -> str:
        """The last ``tail_size`` bytes as redacted text, with a note when earlier bytes were dropped."""
        text = redact(bytes(self._tail).decode("utf-8", "replace"))
        if self.total <= self.tail_size:
            return text
        cut = len(text) - self.tail_size
        if cut > 0:
            text = text[cut:]
            nl = text.find("\n")
            text = text[nl + 1 :] if 0 <= nl < 200 else text
        dropped = max(0, self.total - self.tail_size)
        where = f"; full output in {self.path}" if self.path is not None else ""
        return f"[... {dropped} earlier bytes not shown{where}]\n" + text

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
