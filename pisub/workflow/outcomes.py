"""What a workflow's child call returns: from the child run's result to a :class:`ChildResult`,
and the child's output saved to a file (``output=PATH``, ``output_mode="file-only"``)."""

from __future__ import annotations

import os
from pathlib import Path

from pisub.core.fsio import atomic_write
from pisub.core.redact import redact
from pisub.protocol.result import ErrorCode, ErrorInfo, Result, SingleResult, Usage
from pisub.protocol.workflow import ChildCall, ChildResult, OutputMode
from pisub.termsafe import printable


def from_result(key: str, call: ChildCall, run_id: str | None, result: Result) -> ChildResult:
    """The outcome of ``key``'s child run from its ``result.json``."""
    single = result.details.results[0] if result.details.results else None
    return ChildResult(
        key=key,
        ok=result.state == "complete",
        state=result.state,
        output=(single.output or "") if single is not None else "",
        run_id=run_id,
        exit_code=single.exit_code if single is not None else None,
        error=result.details.error if result.state != "complete" else None,
        usage=single.usage if single is not None else Usage(),
        agent=call.agent,
        task=call.task,
        session_file=single.session_file if single is not None else None,
        acceptance=single.acceptance if single is not None else None,
    )


def failure(
    key: str,
    call: ChildCall,
    message: str,
    *,
    code: str = ErrorCode.SUBAGENT_FAILED,
    run_id: str | None = None,
) -> ChildResult:
    """The outcome of a child that could not be started or was never started."""
    return ChildResult(
        key=key,
        ok=False,
        state="failed",
        run_id=run_id,
        error=ErrorInfo(code=code, message=message),
        agent=call.agent,
        task=call.task,
    )


def not_started(key: str, call: ChildCall, state: str, why: str) -> ChildResult:
    """A call that never got a run: ``stopped`` (its workflow ended first) or ``skipped``."""
    return ChildResult(
        key=key,
        ok=False,
        state=state,  # type: ignore[arg-type]
        error=ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=why),
        agent=call.agent,
        task=call.task,
    )


def save_output(outcome: ChildResult, call: ChildCall, cwd: Path, umask: int) -> ChildResult:
    """Save a complete child's output to ``call.output`` (relative to its ``cwd``); with
    ``file-only`` its returned output becomes a pointer to the file. A failed child, or a file
    that cannot be written, keeps its output inline (the latter with an ``IO_ERROR``)."""
    if call.output is None or not outcome.ok:
        return outcome
    path = Path(os.path.abspath(cwd / call.output))
    data = outcome.output.encode("utf-8")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
        os.chmod(path, 0o666 & ~umask)  # the launcher's umask, not the runner's 077
    except OSError as exc:
        why = f"could not save the output to {printable(str(path))}: {exc.strerror or exc}"
        outcome.error = ErrorInfo(code="IO_ERROR", message=why)
        return outcome
    outcome.output_reference = str(path)
    if call.output_mode == OutputMode.FILE_ONLY:
        outcome.output = pointer(path, data)
    return outcome


def pointer(path: Path, data: bytes) -> str:
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return f"Output saved to: {path} ({_size(len(data))}, {lines} lines). Read this file if needed."


def _size(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < 1024 * 1024:
        return f"{nbytes / 1024:.1f} KB"
    return f"{nbytes / (1024 * 1024):.1f} MB"


MAX_RESULTS_BYTES = 4 * 1024 * 1024
"""The children's outputs in a workflow's ``details.results``, all together (each child's whole
result stays in its own run)."""

MIN_CHILD_OUTPUT_BYTES = 4 * 1024
MAX_TASK_CHARS = 4000


def as_single(outcome: ChildResult, output_bytes: int = MAX_RESULTS_BYTES) -> SingleResult:
    """One entry of the workflow's ``details.results``, redacted, its output cut to
    ``output_bytes`` (with a marker naming the child's run, where it is whole)."""
    error = outcome.error.message if outcome.error is not None and not outcome.ok else None
    return SingleResult(
        agent=outcome.agent,
        task=redact(outcome.task[: MAX_TASK_CHARS * 4])[:MAX_TASK_CHARS],
        exit_code=outcome.exit_code if outcome.exit_code is not None else 1,
        usage=outcome.usage,
        error=redact(error[:20_000])[:4000] if error is not None else None,
        session_file=outcome.session_file,
        output=cut(redact(outcome.output), output_bytes, outcome.run_id),
        key=outcome.key,
        run_id=outcome.run_id,
        state=outcome.state,
        acceptance=outcome.acceptance,
    )


def results_of(outcomes: list[ChildResult]) -> list[SingleResult]:
    """The workflow's ``details.results``: every child's outputs together within
    :data:`MAX_RESULTS_BYTES`."""
    share = max(MIN_CHILD_OUTPUT_BYTES, MAX_RESULTS_BYTES // max(1, len(outcomes)))
    return [as_single(outcome, share) for outcome in outcomes]


def cut(text: str, limit: int, run_id: str | None = None) -> str:
    """``text`` cut to ``limit`` bytes of UTF-8, with a marker saying where it is whole."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    where = f"; whole in run {run_id} (pisub result {run_id})" if run_id else ""
    kept = data[:limit].decode("utf-8", "ignore")
    return f"{kept}\n[TRUNCATED: {limit} of {len(data)} bytes{where}]"
