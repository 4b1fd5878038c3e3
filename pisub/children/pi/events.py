"""Interpretation of pi's events: their texts, tool calls, usage, and what of them
``events.jsonl`` keeps. pi's events are checked before use: nothing here trusts a field's type."""

from __future__ import annotations

import json
import re
import time

import msgspec

from pisub.children.base import Progress
from pisub.children.pi.framing import Json
from pisub.protocol.result import Usage

MAX_TOKENS = 2**53
"""Token counts above this are ignored (they would not survive JSON readers)."""
MAX_COST = 1e12
"""Costs above this (or not finite) are ignored."""
PREVIEW_CHARS = 120
PREVIEW_DEPTH = 4
MAX_TOOLS_RUNNING = 1000
"""Tool calls tracked as running at most (a hostile stream of starts stays bounded)."""

_PREVIEW_KEYS = ("command", "path", "file_path", "pattern", "query", "url")
_KIND_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""What a pi event's ``type`` must look like to name an ``events.jsonl`` type (``pi.<type>``)."""


def text_of(value: object) -> str | None:
    """``value`` when it is a string, else None."""
    return value if isinstance(value, str) else None


def event_kind(obj: Json) -> str:
    """The event's ``type`` when it may name an ``events.jsonl`` type, else ``unknown``."""
    kind = text_of(obj.get("type")) or ""
    return kind if _KIND_RE.fullmatch(kind) else "unknown"


def message_text(message: Json) -> str:
    """The text parts of an agent message, joined (parts that are not text are skipped)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        text
        for p in content
        if isinstance(p, dict) and p.get("type") == "text" and (text := text_of(p.get("text"))) is not None
    )


def queue_texts(data: Json) -> list[str]:
    """The messages pi lists as queued (``steering`` then ``followUp``) in a ``queue_update``
    or a ``clear_queue`` response's data."""
    queues = [q for key in ("steering", "followUp") if isinstance(q := data.get(key), list)]
    return [t for q in queues for t in q if isinstance(t, str)]


def tool_preview(name: str, args: object) -> str:
    """``<name> <args preview>`` for a tool call, e.g. ``bash echo hi`` (bounded in size and
    depth, whatever the model sent)."""
    text = ""
    if isinstance(args, dict):
        text = next((v for k in _PREVIEW_KEYS if isinstance(v := args.get(k), str)), "")
    if not text and args is not None:
        text = compact(args, PREVIEW_CHARS + 1)
    text = " ".join(text[: PREVIEW_CHARS * 4].split())
    if len(text) > PREVIEW_CHARS:
        text = text[: PREVIEW_CHARS - 1] + "…"
    return f"{name[:PREVIEW_CHARS]} {text}".rstrip()


def compact(value: object, limit: int, depth: int = PREVIEW_DEPTH) -> str:
    """A short JSON-like rendering of ``value``: at most about ``limit`` characters, nesting
    deeper than ``depth`` shown as ``…`` (never recursion-limited, whatever the input)."""
    if isinstance(value, str):
        return json.dumps(value[:limit], ensure_ascii=False)
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)[:limit] if not isinstance(value, int) or abs(value) < 10**30 else "…"
    if depth <= 0 or not isinstance(value, dict | list):
        return "…"
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
    parts: list[str] = []
    used = 2
    for key, item in items:
        if used >= limit:
            parts.append("…")
            break
        head = f"{json.dumps(str(key)[:limit], ensure_ascii=False)}:" if isinstance(value, dict) else ""
        part = head + compact(item, limit - used, depth - 1)
        parts.append(part)
        used += len(part) + 1
    inner = ",".join(parts)
    return ("{" + inner + "}") if isinstance(value, dict) else ("[" + inner + "]")


def tool_started(progress: Progress, ev: Json) -> str:
    """Count a ``tool_execution_start`` into ``progress``; the call's preview."""
    name = text_of(ev.get("toolName")) or "?"
    preview = tool_preview(name, ev.get("args"))
    progress.tools += 1
    progress.current_tool = preview
    call = text_of(ev.get("toolCallId")) or f"#{progress.tools}"
    if len(progress.tools_running) < MAX_TOOLS_RUNNING:
        progress.tools_running[call[:200]] = (name[:200], time.monotonic())
    return preview


def tool_ended(progress: Progress, ev: Json) -> None:
    """Take a ``tool_execution_end`` out of ``progress`` (without an id to match: the oldest)."""
    progress.current_tool = None
    running = progress.tools_running
    call = (text_of(ev.get("toolCallId")) or "")[:200]
    if call in running:
        del running[call]
    elif running:
        del running[min(running, key=lambda k: running[k][1])]


class UsageTotals:
    """Running sums over assistant messages."""

    def __init__(self) -> None:
        self.usage = Usage()

    def add(self, message: Json) -> None:
        usage = message.get("usage")
        self.usage.turns += 1
        if not isinstance(usage, dict):
            return
        pairs = (
            ("input", "input"),
            ("output", "output"),
            ("cacheRead", "cache_read"),
            ("cacheWrite", "cache_write"),
        )
        for key, attr in pairs:
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
                setattr(self.usage, attr, min(MAX_TOKENS, getattr(self.usage, attr) + value))
        cost = usage.get("cost")
        total = cost.get("total") if isinstance(cost, dict) else cost
        if isinstance(total, int | float) and not isinstance(total, bool) and 0 <= total <= MAX_COST:
            self.usage.cost = min(MAX_COST, self.usage.cost + float(total))


def failure_of(last_assistant: Json | None) -> str | None:
    """Why pi's last reply says the task failed (``stopReason`` ``error`` / ``aborted``), or None."""
    last = last_assistant or {}
    reason = last.get("stopReason")
    if reason not in ("error", "aborted"):
        return None
    detail = (text_of(last.get("errorMessage")) or reason)[:4000]
    return f"pi {'failed' if reason == 'error' else 'was aborted'}: {detail}"


def slim_event(kind: str, event: Json, line: bytes) -> bytes | None:
    """What of a pi event goes to ``events.jsonl``: the line itself, except the bulk that says
    nothing new — ``role: "system"`` messages (pi 1.x: ~8 KB, the whole system prompt) are left
    out, and ``agent_end`` loses its copy of every message (they are in the session)."""
    message = event.get("message")
    if (
        kind in ("message_start", "message_end")
        and isinstance(message, dict)
        and message.get("role") == "system"
    ):
        return None
    messages = event.get("messages")
    if kind == "agent_end" and isinstance(messages, list):
        slim = {key: value for key, value in event.items() if key != "messages"}
        slim["messageCount"] = len(messages)
        return msgspec.json.encode(slim)
    return line


MAX_UPDATE_LINE = 64 * 1024
"""A ``message_update`` line longer than this is not read for its text (pi's carry one delta
each; the message's end has the whole text)."""


class ReplyStream:
    """The assistant message pi is streaming, written to the output log as its text deltas come
    (``message_update``), so that the log shows the reply while the model writes it; at the
    message's end only what the deltas did not say is written — never the text twice.

    At most ``keep`` characters of the message are remembered (the log's cap: past it nothing
    more is written anyway)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._parts: list[str] = []
        self._size = 0
        self._overflow = False

    def delta(self, event: Json) -> str:
        """The text a ``message_update`` adds to the reply ('' when it adds none: another kind
        of delta, a thinking block, a field of the wrong type)."""
        update = event.get("assistantMessageEvent")
        if not isinstance(update, dict) or update.get("type") != "text_delta":
            return ""
        text = text_of(update.get("delta")) or ""
        if not text:
            return ""
        if self._size + len(text) > self.keep:
            self._overflow = True
        else:
            self._parts.append(text)
        self._size += len(text)
        return text

    def end(self, text: str) -> str | None:
        """The message ended with ``text``: what is left to write of it, its line ended — the
        text past what was streamed (nothing more when pi ended with less, or the log was full;
        the whole text after a line break when pi's final text is not what its deltas said) —
        or None when nothing was streamed. The next message starts afresh."""
        streamed, overflow = "".join(self._parts), self._overflow
        self._parts, self._size, self._overflow = [], 0, False
        if overflow:
            return ""
        if not streamed:
            return None
        if text.startswith(streamed):
            rest = text[len(streamed) :]
        elif streamed.startswith(text):
            rest = ""
        else:
            rest = "\n" + text
        return rest if (streamed + rest).endswith("\n") else rest + "\n"
