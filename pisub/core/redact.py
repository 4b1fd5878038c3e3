"""Redaction of secrets from everything that leaves a run directory.

The run's own logs and events stay raw in their private files. Every text of a file written
for readers — ``status.json`` (error message, tool preview, recent output, ledger previews),
receipts (reasons) and ``result.json`` — goes through :func:`scrub` (or :func:`redact` when
the result is built) at the one place that writes that file, and the CLI redacts every error
line it prints.
"""

from __future__ import annotations

import os
import re
from functools import cache, lru_cache
from typing import TypeVar

from pisub.protocol.control import Receipt
from pisub.protocol.status import Status

R = TypeVar("R", Status, Receipt)

MASK = "[REDACTED]"
MAX_STACK_LINES = 5
"""Consecutive stack-trace lines kept; the rest of a trace is replaced by a note."""

_NAMED = (
    r"(?:[A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD)[A-Z0-9_]*"
    r"|(?:[a-z0-9]+_)*(?:key|token|secret|password|passwd)(?:_[a-z0-9]+)*)"
)
"""NAME of a ``NAME=value`` assignment whose value is masked: upper-case env-style names
containing KEY/TOKEN/SECRET/PASSWORD, or lower-case names where it is a whole ``_`` word."""

_SECRET_WORD = r"(?:secret|token|password|passwd|credential|api[_-]?key|access[_-]?key|private[_-]?key)"
_QUOTED_NAME = rf"(?i:[A-Za-z0-9_.-]*{_SECRET_WORD}[A-Za-z0-9_.-]*)"
"""A quoted key (JSON, YAML) naming a secret, in any case: ``"SecretAccessKey"``, ``'api_key'``."""
_CAMEL_NAME = (
    r"(?:[a-z][a-z0-9]*)?(?:[A-Z][a-z0-9]*)*"
    r"(?:Key|Token|Secret|Password|Passwd|Credential)(?:[A-Z][a-z0-9]*)*"
)
"""A camelCase or PascalCase name ending or containing a secret word: ``apiKey``, ``SessionToken``."""

_NOT_A_PATH = r"(?<![\w/\\])"
"""Where a secret's name may start: not inside a word, and not a file name at the end of a path
(``/etc/passwd: not a workflow script`` is an error naming a file, not a password)."""

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?i)(authorization\s*:\s*)(?:(?:bearer|basic|token)\s+)?[^\s\"',;]+"), r"\1" + MASK),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1" + MASK),
    (re.compile(r"\bsk-ant-[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), MASK),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),
    (
        re.compile(r"(?i)\b(aws_?secret_?(?:access_?)?key\s*[=:]\s*)[\"']?[A-Za-z0-9/+=]{20,}[\"']?"),
        r"\1" + MASK,
    ),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(rf"{_NOT_A_PATH}({_NAMED})(\s*[=:]\s*)(?:\"[^\"]*\"|'[^']*'|[^\s\"',;]+)"), r"\1\2" + MASK),
    # JSON, YAML and camelCase spellings: "SecretAccessKey": "…", 'api_key': '…', apiToken=…
    (re.compile(rf"([\"']{_QUOTED_NAME}[\"']\s*:\s*)(?:\"(?:[^\"\\]|\\.)*\"|'[^']*')"), r"\1" + f'"{MASK}"'),
    (
        re.compile(rf"{_NOT_A_PATH}({_CAMEL_NAME})(\s*[=:]\s*)(?:\"[^\"]*\"|'[^']*'|[^\s\"',;]+)"),
        r"\1\2" + MASK,
    ),
]

_STACK_LINE = re.compile(r"^\s+at\s+\S|^\s+File \"[^\"]+\", line \d+")
_PY_FRAME = re.compile(r"^\s+File \"")


@cache
def _home_patterns() -> list[tuple[re.Pattern[str], str]]:
    pats: list[tuple[re.Pattern[str], str]] = []
    home = os.path.expanduser("~")
    if home and home not in ("/", "~"):
        pats.append((re.compile(r"(?<![\w./~-])" + re.escape(home.rstrip("/")) + r"(?![\w.-])"), "~"))
    pats.append((re.compile(r"(?<![\w./~-])/home/[A-Za-z0-9._-]+"), "~"))
    pats.append((re.compile(r"(?i)C:\\Users\\[^\\\s]+"), "~"))
    return pats


def redact(text: str) -> str:
    """``text`` with secrets masked, the user's home shortened to ``~`` and long stack
    traces cut to :data:`MAX_STACK_LINES` lines. Idempotent."""
    return _redact_cached(text) if len(text) <= _CACHE_MAX_CHARS else _redact(text)


_CACHE_MAX_CHARS = 2000
"""Short texts (status previews, recent lines, reasons) are rewritten at every status write:
their redaction is remembered."""


@lru_cache(maxsize=4096)
def _redact_cached(text: str) -> str:
    return _redact(text)


def _redact(text: str) -> str:
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    for pattern, repl in _home_patterns():
        text = pattern.sub(repl, text)
    return _cut_stack_traces(text)


def _cut_stack_traces(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    run = 0
    dropped = 0
    after_frame = False
    for line in lines:
        stacky = bool(_STACK_LINE.match(line)) or (after_frame and line.startswith("    "))
        after_frame = bool(_PY_FRAME.match(line))
        if stacky:
            run += 1
            if run > MAX_STACK_LINES:
                dropped += 1
                continue
        else:
            if dropped:
                out.append(f"    [... {dropped} stack lines omitted]")
            run = dropped = 0
        out.append(line)
    if dropped:
        out.append(f"    [... {dropped} stack lines omitted]")
    return "\n".join(out)


def preview(text: str, limit: int = 160) -> str:
    """A redacted one-line preview of at most ``limit`` characters."""
    flat = " ".join(redact(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def scrub(record: R) -> R:
    """Redact, in place, every free text of a status or receipt before it is written for readers."""
    if isinstance(record, Status):
        if record.error is not None:
            record.error.message = redact(record.error.message)
        for step in record.steps:
            if step.current_tool is not None:
                step.current_tool = redact(step.current_tool)
            step.recent_output = [redact(line) for line in step.recent_output]
        for entry in record.steering.recent:
            entry.preview = redact(entry.preview)
    else:
        if record.reason is not None:
            record.reason = redact(record.reason)
        for target in record.targets:
            if target.reason is not None:
                target.reason = redact(target.reason)
    return record
