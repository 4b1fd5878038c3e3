"""A forked pi session: the parent's transcript copied for a child, less what cannot be replayed.

A signed Anthropic ``thinking`` block (pi keeps its signature as ``thinkingSignature``) and a
``redacted_thinking`` block (pi: ``thinking`` with ``redacted: true``, its payload in
``thinkingSignature``) are bound to the conversation that produced them: replayed in a branch,
the provider refuses them. A fork drops them (the child still thinks at its own level, afresh);
unsigned thinking, text and tool calls stay as they are. Every other line is copied byte for
byte — the session is pi's format, not pisub's.

A fork source is checked before anything is copied: a regular file (a path the user named is
resolved, then opened without following a symlink), not in ``/proc``, ``/sys`` or ``/dev``, at
most :data:`MAX_SOURCE_BYTES`, whose first line is a pi session header.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pisub.core.fsio import write_all
from pisub.errors import InvalidInput

MAX_SOURCE_BYTES = 64 * 1024 * 1024
"""The largest session a fork copies (so also its longest line)."""
MAX_PARSED_LINE = MAX_SOURCE_BYTES
"""A longer line is copied as it is (not parsed)."""
MAX_HEADER_BYTES = 64 * 1024
"""The longest first line (pi's session header) a fork source may have."""
SYSTEM_TREES = ("/proc", "/sys", "/dev")
"""Where no session is: files there are the system's (``/proc/self/environ``...)."""
CHUNK = 1 << 20


def open_session(path: Path, what: str, *, follow: bool = True) -> int:
    """A read-only fd on the pi session file ``path`` (see the module); ``follow``: a symlink
    the caller named is resolved first (else it is refused).

    Raises:
        InvalidInput: naming ``what``: missing, not a regular file, a system file, too large,
            unreadable, or not a pi session.
    """
    real = os.path.realpath(path) if follow else os.path.abspath(path)
    if any(real == tree or real.startswith(tree + "/") for tree in SYSTEM_TREES):
        raise InvalidInput(f"{what}: {path} is not a session file (it is the system's {real})")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise InvalidInput(f"{what}: {path} is not a session file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidInput(f"{what}: {path} is not a session file (a symlink)") from None
        raise InvalidInput(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        _check_session(fd, path, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_session(fd: int, path: Path, what: str) -> None:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"{what}: {path} is not a session file")
    if info.st_size > MAX_SOURCE_BYTES:
        raise InvalidInput(
            f"{what}: {path} is larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB, the most a fork copies"
        )
    try:
        first = os.pread(fd, MAX_HEADER_BYTES + 1, 0).split(b"\n", 1)[0]
    except OSError as exc:
        raise InvalidInput(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if not is_session_header(first):
        raise InvalidInput(f"{what}: {path} is not a pi session (its first line is no session header)")


def is_session_header(line: bytes) -> bool:
    """Whether ``line`` is pi's session header: ``{"type": "session", "id": "...", ...}``."""
    if len(line) > MAX_HEADER_BYTES:
        return False
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(entry, dict) and entry.get("type") == "session" and isinstance(entry.get("id"), str)


def copy_session(source: Path, dest: Path, *, follow: bool = True) -> None:
    """A fork's copy of the session ``source`` (checked first: :func:`open_session`) at ``dest``,
    a new 0600 file, streamed, each line through :func:`strip_private_thinking`.

    Raises:
        InvalidInput: ``source`` is no session to fork, or grew past the limit while copied.
        OSError: ``dest`` cannot be written.
    """
    src = open_session(source, "fork source", follow=follow)
    try:
        dst = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            _copy_lines(src, dst, source)
            os.fsync(dst)
        except BaseException:
            os.unlink(dest)
            raise
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_lines(src: int, dst: int, source: Path) -> None:
    """Each line of ``src`` filtered into ``dst``; a line's pieces are joined once (a long line
    costs its length, not its length squared)."""
    pieces: list[bytes] = []
    total = 0
    while chunk := os.read(src, CHUNK):
        total += len(chunk)
        if total > MAX_SOURCE_BYTES:
            raise InvalidInput(f"fork source: {source} grew past {MAX_SOURCE_BYTES // (1024 * 1024)} MiB")
        *ended, rest = chunk.split(b"\n")
        for part in ended:
            write_all(dst, strip_private_thinking(b"".join([*pieces, part])) + b"\n")
            pieces = []
        pieces.append(rest)
    if any(pieces):
        write_all(dst, strip_private_thinking(b"".join(pieces)))


def is_private_thinking(block: Any) -> bool:
    """Whether a content block is provider-private thinking: signed, or redacted."""
    if not isinstance(block, dict):
        return False
    kind = block.get("type")
    if kind in ("redacted_thinking", "redactedThinking"):
        return True
    if kind != "thinking":
        return False
    signature = block.get("thinkingSignature", block.get("signature"))
    return block.get("redacted") is True or (isinstance(signature, str) and bool(signature.strip()))


def strip_private_thinking(line: bytes) -> bytes:
    """One session line with the private thinking blocks of its assistant message left out:
    only those blocks' text is cut out of the line (the blocks that stay joined by a comma),
    every other byte stays as it was — numbers, escapes, raw UTF-8 — so it is valid UTF-8 when
    the line was (unchanged when it has none or is not a message)."""
    if len(line) > MAX_PARSED_LINE or b"thinking" not in line.lower():
        return line
    try:
        text = line.decode("utf-8")
        entry = json.loads(text)
    except (ValueError, RecursionError):
        return line
    message = entry.get("message") if isinstance(entry, dict) else None
    if not isinstance(message, dict):
        return line
    content = message.get("content")
    if not isinstance(content, list) or not any(is_private_thinking(b) for b in content):
        return line
    try:
        spans = _content_spans(text)
    except (ValueError, RecursionError, IndexError):
        return line
    if len(spans) != len(content):  # cannot happen for JSON json.loads took; never guess
        return line
    kept = [text[a:b] for (a, b), block in zip(spans, content, strict=True) if not is_private_thinking(block)]
    start, end = spans[0][0], spans[-1][1]
    return (text[:start] + ",".join(kept) + text[end:]).encode("utf-8")


_DECODER = json.JSONDecoder()
_SPACE = " \t\n\r"


def _content_spans(text: str) -> list[tuple[int, int]]:
    """Where each element of ``entry.message.content`` is in the JSON object ``text`` (the last
    of duplicate keys, as :func:`json.loads` takes it)."""
    message = _member(text, _skip(text, 0), "message")
    content = _member(text, message, "content")
    return list(_elements(text, content))


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def _member(text: str, at: int, name: str) -> int:
    """Where the value of key ``name`` of the object at ``at`` begins."""
    if text[at] != "{":
        raise ValueError("not an object")
    found, at = -1, _skip(text, at + 1)
    while text[at] != "}":
        key, at = _DECODER.raw_decode(text, at)
        at = _skip(text, at)
        if text[at] != ":":
            raise ValueError("no colon")
        value = _skip(text, at + 1)
        if key == name:
            found = value
        at = _skip(text, _DECODER.raw_decode(text, value)[1])
        if text[at] == ",":
            at = _skip(text, at + 1)
    if found < 0:
        raise ValueError(f"no {name}")
    return found


def _elements(text: str, at: int) -> Iterator[tuple[int, int]]:
    if text[at] != "[":
        raise ValueError("not an array")
    at = _skip(text, at + 1)
    while text[at] != "]":
        end = _DECODER.raw_decode(text, at)[1]
        yield at, end
        at = _skip(text, end)
        if text[at] == ",":
            at = _skip(text, at + 1)
