"""Building ``result.json``: redaction, truncation and the error code of an outcome."""

from __future__ import annotations

from pathlib import Path

from pisub.core.redact import redact
from pisub.defaults import RESULT_MAX_BYTES, RESULT_MAX_LINES
from pisub.protocol.acceptance import AcceptanceRecord
from pisub.protocol.codec import now_iso
from pisub.protocol.manifest import MaxOutput
from pisub.protocol.result import (
    Details,
    ErrorCode,
    ErrorInfo,
    Result,
    ResultProgress,
    SingleResult,
    TextContent,
    Usage,
)

TERMINAL_STATES = ("complete", "failed", "stopped", "paused")


def truncate_output(
    text: str,
    full_output: Path | None,
    limits: MaxOutput | None = None,
    *,
    whole: tuple[int, int] | None = None,
    kept: int | None = None,
) -> tuple[str, bool]:
    """Cut ``text`` to ``limits`` (the run's ``maxOutput``; default :data:`RESULT_MAX_BYTES` /
    :data:`RESULT_MAX_LINES`), head kept. ``whole``: ``text`` is only the head of a longer
    text of these (lines, bytes), which the marker then gives; ``kept``: ``full_output`` holds
    only the first ``kept`` bytes of it (the marker says so rather than "full output").

    Returns the text (with a marker naming the full output when cut) and whether it was cut.
    """
    max_bytes = limits.bytes if limits is not None else RESULT_MAX_BYTES
    max_lines = limits.lines if limits is not None else RESULT_MAX_LINES
    data = text.encode("utf-8")
    lines = text.split("\n")
    if whole is None and len(data) <= max_bytes and line_count(text) <= max_lines:
        return text, False
    total_lines, total_bytes = whole if whole is not None else (line_count(text), len(data))
    kept_text = "\n".join(lines[:max_lines])
    kept_bytes = kept_text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")
    shown = kept_bytes.count("\n") + 1
    marker = (
        f"\n[TRUNCATED: showing first {shown} of {total_lines} lines, "
        f"{len(kept_bytes.encode('utf-8'))} of {total_bytes} bytes{_where(full_output, kept)}]"
    )
    return kept_bytes + marker, True


def line_count(text: str) -> int:
    """The lines of ``text``: a final newline ends the last line, it does not begin another."""
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def _where(full_output: Path | None, kept: int | None) -> str:
    if full_output is None:
        return ""
    if kept is not None:
        return f" - its first {kept} bytes (the run's output cap) at {full_output}"
    return f" - full output at {full_output}"


REDACT_WINDOW = 1024 * 1024
"""The characters of a workflow's result text that are redacted and may be shown (five times
the :data:`RESULT_MAX_BYTES` shown: redacting costs about 0.25 s a MiB); a longer text is cut
there first, and the marker gives its whole size."""


def cut_result_text(text: str, keep: Path, cap: int) -> tuple[str, ErrorInfo | None]:
    """A workflow's result text (raw: what ``main`` returned, or the failure's) for
    ``result.json``: redacted and cut as a single run's output is (:func:`truncate_output`, the
    default ``maxOutput``). When cut, the text is kept raw in ``keep`` — whole, or its first
    ``cap`` bytes (the run's output cap) when longer — which the marker names (not when it cannot
    be written). Returns the text and, when cut, the ``SUBAGENT_OUTPUT_TRUNCATED`` error."""
    from pisub.core.fsio import atomic_write

    window = text[:REDACT_WINDOW]
    data: bytes | None = None  # (encoded once: the text may be tens of MB)
    whole = None
    if len(window) != len(text):
        data = text.encode("utf-8", "replace")
        whole = (line_count(text), len(data))
    redacted = redact(window)
    shown, cut = truncate_output(redacted, None, whole=whole)
    if not cut:
        return shown, None
    if data is None:
        data = text.encode("utf-8", "replace")
    kept = None
    if len(data) > cap:  # from a whole character
        data = data[:cap].decode("utf-8", "ignore").encode("utf-8")
        kept = len(data)
    where: Path | None = keep
    try:
        atomic_write(keep, data)
    except OSError:
        where = None
    shown, _cut = truncate_output(redacted, where, whole=whole, kept=kept)
    message = "Output truncated" + _where(where, kept).replace(" - ", "; ", 1)
    return shown, ErrorInfo(code=ErrorCode.SUBAGENT_OUTPUT_TRUNCATED, message=message)


def make_result(
    *,
    run_id: str,
    state: str,
    agent: str,
    task: str,
    exit_code: int,
    output: str,
    error: ErrorInfo | None = None,
    usage: Usage | None = None,
    timeout_reason: str | None = None,
    session_file: str | None = None,
    full_output: Path | None = None,
    acceptance: AcceptanceRecord | None = None,
    max_output: MaxOutput | None = None,
    progress: ResultProgress | None = None,
) -> Result:
    """The tool result of a finished run; every returned text is redacted. ``max_output``: how
    much of the output it returns; ``progress``: carried when the run asked for it."""
    assert state in TERMINAL_STATES, state
    text, truncated = truncate_output(redact(output), full_output, max_output)
    if error is not None:
        error = ErrorInfo(code=error.code, message=redact(error.message))
    elif truncated:
        error = ErrorInfo(
            code=ErrorCode.SUBAGENT_OUTPUT_TRUNCATED,
            message=f"Output truncated; full output at {full_output}",
        )
    single = SingleResult(
        agent=agent,
        task=redact(task),
        exit_code=exit_code,
        usage=usage or Usage(),
        error=error.message if error is not None and state != "complete" else None,
        session_file=session_file,
        output=text,
        timeout_reason=timeout_reason if timeout_reason in ("runtime", "idle", "tool") else None,  # type: ignore[arg-type]
        acceptance=acceptance,
        progress=progress,
    )
    content = text if state == "complete" or error is None else _failure_text(error, text)
    return Result(
        v=1,
        state=state,  # type: ignore[arg-type]
        ended_at=now_iso(),
        content=[TextContent(type="text", text=content)],
        details=Details(mode="single", run_id=run_id, results=[single], error=error),
    )


def _failure_text(error: ErrorInfo, output: str) -> str:
    text = f"{error.code}: {error.message}"
    if output.strip():
        text += f"\n\nPartial output:\n{output}"
    return text


def management_result(code: str, message: str) -> Result:
    """The result of a request refused before any run was created (a depth guard): mode
    ``management``, no run id, no child results."""
    error = ErrorInfo(code=code, message=redact(message))
    return Result(
        v=1,
        state="failed",
        ended_at=now_iso(),
        content=[TextContent(type="text", text=f"{error.code}: {error.message}")],
        details=Details(mode="management", error=error),
    )
