"""A fork's copy of a pi session: signed and redacted thinking left out, everything else byte
for byte; hostile lines copied as they are."""

from __future__ import annotations

import json
from pathlib import Path

from pisub.store.runs import copy_private
from pisub.store.session_fork import is_private_thinking, strip_private_thinking
from tests.helpers import REDACTED, SIGNED


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
    source.write_bytes(
        b'{"type":"session"}\n' + _line(signed, {"type": "text", "text": "x"}) + b"\n" + _line(signed)
    )
    dest = tmp_path / "copy.jsonl"
    copy_private(source, dest, line_filter=strip_private_thinking)
    lines = dest.read_bytes().split(b"\n")
    assert lines[0] == b'{"type":"session"}' and b"SIG" not in dest.read_bytes()
    assert json.loads(lines[1])["message"]["content"] == [{"type": "text", "text": "x"}]
    assert json.loads(lines[2])["message"]["content"] == []
    assert oct(dest.stat().st_mode & 0o777) == "0o600"
