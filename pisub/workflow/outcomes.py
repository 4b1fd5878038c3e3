"""What a workflow's child call returns: from the child run's result to a :class:`ChildResult`,
and the child's output saved to a file (``output=PATH``, ``output_mode="file-only"``)."""

from __future__ import annotations

import os
from pathlib import Path

from pisub.errors import printable
from pisub.fsio import atomic_write
from pisub.protocol.result import ErrorCode, ErrorInfo, Result, SingleResult, Usage
from pisub.protocol.workflow import ChildCall, ChildResult, OutputMode


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
        atomic_write(path, data, mode=0o666 & ~umask)
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


def as_single(outcome: ChildResult, exit_code_if_none: int = 1) -> SingleResult:
    """One entry of the workflow's ``details.results``."""
    return SingleResult(
        agent=outcome.agent,
        task=outcome.task,
        exit_code=outcome.exit_code if outcome.exit_code is not None else exit_code_if_none,
        usage=outcome.usage,
        error=outcome.error.message if outcome.error is not None and not outcome.ok else None,
        session_file=outcome.session_file,
        output=outcome.output,
        key=outcome.key,
        run_id=outcome.run_id,
        state=outcome.state,
    )
