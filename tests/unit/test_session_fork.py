"""A fork's copy of a pi session: signed and redacted thinking left out, everything else byte
for byte; hostile lines copied as they are."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pisub.errors import InvalidInput
from pisub.store.session_fork import (
    MAX_SOURCE_BYTES,
    copy_session,
    is_private_thinking,
    strip_private_thinking,
)
from tests.helpers import REDACTED, SIGNED

HEADER = b'{"type":"session","version":3,"id":"s1"}'


def _line(*blocks: object, role: str = "assistant") -> bytes:
    entry = {"type": "message", "id": "a1", "message": {"role": role, "content": list(blocks)}}
    return json.dumps(entry).encode()


def test_signed_and_redacted_thinking_go_the_rest_stays() -> None:
    signed, redacted = SIGNED, REDACTED
    raw = {"type": "redacted_thinking", "data": "opaque"}
    plain = {"type": "thinking", "thinking": "musing", "thinkingSignature": "  "}
    text = {"type": "text", "text": "hi ✓"}
    out = json.loads(strip_private_thinking(_line(signed, plain, text, redacted, raw)))
    assert out["message"]["content"] == [plain, text]
    assert out["id"] == "a1"
    assert [is_private_thinking(b) for b in (signed, redacted, raw, plain, text, "x", None)] == [
        True, True, True, False, False, False, False,
    ]  # fmt: skip


def test_lines_without_private_thinking_are_copied_byte_for_byte() -> None:
    for line in (
        _line({"type": "text", "text": "no thinking here"}),
        _line({"type": "thinking", "thinking": "unsigned"}),
        b'{"type":"session","version":3}',
        b"not json at all, but thinking",
        b'{"message": "thinking"}',
        b'{"message": {"content": "thinking"}}',
        b"[" * 100_000 + b"thinking",  # nested too deeply to parse
        b'["thinking"]',
        b"\xff\xfe thinking",
    ):
        assert strip_private_thinking(line) == line


def test_the_copy_filters_each_line_and_keeps_the_last_without_newline(tmp_path: Path) -> None:
    signed = {"type": "thinking", "thinking": "p", "thinkingSignature": "SIG"}
    source = tmp_path / "s.jsonl"
    source.write_bytes(HEADER + b"\n" + _line(signed, {"type": "text", "text": "x"}) + b"\n" + _line(signed))
    dest = tmp_path / "copy.jsonl"
    copy_session(source, dest)
    lines = dest.read_bytes().split(b"\n")
    assert lines[0] == HEADER and b"SIG" not in dest.read_bytes()
    assert json.loads(lines[1])["message"]["content"] == [{"type": "text", "text": "x"}]
    assert json.loads(lines[2])["message"]["content"] == []
    assert oct(dest.stat().st_mode & 0o777) == "0o600"


def test_a_fork_source_is_checked_before_anything_is_copied(tmp_path: Path) -> None:
    """Any regular file was copied: ``/proc/self/environ`` (the launcher's environment), a
    symlink to a secret; now only a pi session, checked before the copy exists."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"TOKEN=hunter2\n")
    (tmp_path / "x.jsonl").symlink_to(secret)
    not_header = tmp_path / "other.jsonl"
    not_header.write_bytes(b'{"type":"message","id":"m"}\n' + HEADER + b"\n")
    deep = tmp_path / "deep.jsonl"
    deep.write_bytes(b"[" * 100_000 + b"\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "empty.jsonl").write_bytes(b"")
    for given, needle in (
        (Path("/proc/self/environ"), "the system's"),
        (Path("/dev/zero"), "the system's"),
        (tmp_path / "x.jsonl", "not a pi session"),
        (secret, "not a pi session"),
        (not_header, "not a pi session"),
        (deep, "not a pi session"),
        (tmp_path / "empty.jsonl", "not a pi session"),
        (tmp_path / "fifo", "is not a session file"),
        (tmp_path / "dir.jsonl", "is not a session file"),
        (tmp_path / "missing.jsonl", "is not a session file"),
    ):
        dest = tmp_path / "copy.jsonl"
        with pytest.raises(InvalidInput, match=f"fork source: .*{needle}"):
            copy_session(given, dest)
        assert not dest.exists(), given


def test_a_huge_fork_source_is_refused_at_once(tmp_path: Path) -> None:
    """A 3 GiB sparse file of one line hung the launch and took 730 MB: the size is checked
    first (64 MiB), the copy streams."""
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as out:
        out.write(HEADER + b"\n")
        out.truncate(3 * 1024**3)
    started = time.monotonic()
    with pytest.raises(InvalidInput, match="larger than 64 MiB"):
        copy_session(huge, tmp_path / "copy.jsonl")
    assert time.monotonic() - started < 5 and not (tmp_path / "copy.jsonl").exists()
    edge = tmp_path / "edge.jsonl"
    with edge.open("wb") as out:
        out.write(HEADER + b"\n")
        out.truncate(MAX_SOURCE_BYTES)
    copy_session(edge, tmp_path / "copy.jsonl")
    assert (tmp_path / "copy.jsonl").stat().st_size == MAX_SOURCE_BYTES


def test_a_symlink_inside_the_home_is_not_followed(tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    real.write_bytes(HEADER + b"\n")
    (tmp_path / "link.jsonl").symlink_to(real)
    with pytest.raises(InvalidInput, match="a symlink"):
        copy_session(tmp_path / "link.jsonl", tmp_path / "copy.jsonl", follow=False)
    copy_session(tmp_path / "link.jsonl", tmp_path / "copy.jsonl")  # named by the user: resolved
    assert (tmp_path / "copy.jsonl").read_bytes() == HEADER + b"\n"


def test_a_rewritten_line_keeps_every_other_byte() -> None:
    """It was re-encoded: ``1.10`` became ``1.1``, a ``\\ud800`` escape raw invalid UTF-8."""
    line = (
        b'{"type":"message", "cost":1.10,"big":1e400,"message":{"role":"assistant","content":['
        b'{"type":"thinking","thinking":"x","thinkingSignature":"SIG"}, '
        b'{"type":"text","text":"\\ud800 \\u00e9 \xc3\xa9"},'
        b'{"type":"redacted_thinking","data":"D"},{"type":"text","text":"end"}],"n":-0.0}}'
    )
    out = strip_private_thinking(line)
    assert out == (
        b'{"type":"message", "cost":1.10,"big":1e400,"message":{"role":"assistant","content":['
        b'{"type":"text","text":"\\ud800 \\u00e9 \xc3\xa9"},{"type":"text","text":"end"}],"n":-0.0}}'
    )
    out.decode("utf-8")  # valid UTF-8
    only = b'{"message":{"content":[{"type":"thinking","thinking":"p","thinkingSignature":"S"}]}}'
    assert strip_private_thinking(only) == b'{"message":{"content":[]}}'
    twice = b'{"message":{"content":[]},"message":{"content":[{"type":"redacted_thinking"},1]}}'
    assert strip_private_thinking(twice) == b'{"message":{"content":[]},"message":{"content":[1]}}'
