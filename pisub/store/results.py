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


def truncate_output(text: str, full_output: Path | None, limits: MaxOutput | None = None) -> tuple[str, bool]:
    """Cut ``text`` to ``limits`` (the run's ``maxOutput``; default :data:`RESULT_MAX_BYTES` /
    :data:`RESULT_MAX_LINES`), head kept.

    Returns the text (with a marker naming the full output when cut) and whether it was cut.
    """
    max_bytes = limits.bytes if limits is not None else RESULT_MAX_BYTES
    max_lines = limits.lines if limits is not None else RESULT_MAX_LINES
    data = text.encode("utf-8")
    lines = text.split("\n")
    if len(data) <= max_bytes and len(lines) <= max_lines:
        return text, False
    kept = "\n".join(lines[:max_lines])
    kept_bytes = kept.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")
    shown = kept_bytes.count("\n") + 1
    where = f" - full output at {full_output}" if full_output else ""
    marker = (
        f"\n[TRUNCATED: showing first {shown} of {len(lines)} lines, "
        f"{len(kept_bytes.encode('utf-8'))} of {len(data)} bytes{where}]"
    )
    return kept_bytes + marker, True


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
