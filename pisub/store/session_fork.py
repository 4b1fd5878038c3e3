"""A forked pi session: the parent's transcript copied for a child, less what cannot be replayed.

A signed Anthropic ``thinking`` block (pi keeps its signature as ``thinkingSignature``) and a
``redacted_thinking`` block (pi: ``thinking`` with ``redacted: true``, its payload in
``thinkingSignature``) are bound to the conversation that produced them: replayed in a branch,
the provider refuses them. A fork drops them (the child still thinks at its own level, afresh);
unsigned thinking, text and tool calls stay as they are. Every other line is copied byte for
byte — the session is pi's format, not pisub's.
"""

from __future__ import annotations

import json
from typing import Any

MAX_PARSED_LINE = 64 * 1024 * 1024
"""A longer line is copied as it is (not parsed)."""


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
    """One session line with the private thinking blocks of its assistant message left out
    (unchanged, byte for byte, when it has none or is not a message)."""
    if len(line) > MAX_PARSED_LINE or b"thinking" not in line.lower():
        return line
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return line
    message = entry.get("message") if isinstance(entry, dict) else None
    if not isinstance(message, dict):
        return line
    content = message.get("content")
    if not isinstance(content, list) or not any(is_private_thinking(b) for b in content):
        return line
    message["content"] = [b for b in content if not is_private_thinking(b)]
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
