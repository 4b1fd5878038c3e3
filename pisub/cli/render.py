"""Human and JSON output of the CLI; all printing happens here.

Every human line goes through :func:`out` or :func:`err`, which pass it through the one terminal
filter (:func:`pisub.termsafe.printable`) as ONE line: text a child, a model, a task, an agent
file or a workflow script produced never reaches the terminal with a control character, an
escape sequence, a bidi control or an undecodable byte in it, and a newline or tab in a value
cannot end the line and fake another. A block of lines (a log, a result, a transcript, a
table) is :func:`out_block`; its table cells and one-line fields are escaped on their own first
with :func:`one_line` (:func:`cell`), so a newline in an agent's description cannot break a row.
``--json`` output is JSON; ``logs --raw`` (in cli/runs.py) is the one byte-exact human output."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from pisub.protocol.codec import encode, parse_iso
from pisub.protocol.placement import Placement
from pisub.protocol.result import Result
from pisub.protocol.status import Status
from pisub.termsafe import printable


def out(text: str) -> None:
    """Print ONE line through the terminal filter: control characters (newlines and tabs
    too), escape sequences, bidi controls and undecodable bytes shown escaped — a value in it
    (an agent's description, a lane's ``by``, an error) cannot end the line and fake another.
    A block of several lines is :func:`out_block`."""
    sys.stdout.write(printable(text.removesuffix("\n"), one_line=True) + "\n")


def out_block(text: str) -> None:
    """Print a block of lines (a log, a result, a transcript, a system prompt, or lines built
    with :func:`cell` / :func:`one_line` fields and tables) through the terminal filter:
    newlines and tabs stay, every other control character, escape sequence, bidi control and
    undecodable byte is shown escaped."""
    text = printable(text)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def err(text: str) -> None:
    """Print one line on stderr (control characters and newlines escaped)."""
    sys.stderr.write(printable(text.rstrip("\n"), one_line=True) + "\n")


def json_line(obj: object) -> None:
    """One JSON object on one line (the documented ``--json`` output), always valid UTF-8."""
    json_lines([obj])


def json_lines(objs: Iterable[object]) -> None:
    """One JSON object per line, written at once (``list`` over many runs)."""
    sys.stdout.buffer.write(b"".join(_json(obj) + b"\n" for obj in objs))
    sys.stdout.flush()


def _json(obj: object) -> bytes:
    try:
        return encode(obj)
    except UnicodeEncodeError:  # a file name that is not UTF-8: escape it, as out() does
        return encode(_printable_tree(msgspec.to_builtins(obj)))


def _printable_tree(value: object) -> object:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable_tree(v) for v in value]
    if isinstance(value, dict):
        return {printable(str(k)): _printable_tree(v) for k, v in value.items()}
    return value


def one_line(text: object) -> str:
    """A field shown inside a line (a table cell, a status line): newlines escaped too. Every
    value put into a line of a block printed with :func:`out_block` goes through it."""
    return printable(str(text), one_line=True)


cell = one_line


def age(iso: str | None) -> str:
    if not iso:
        return "-"
    try:
        secs = max(0.0, time.time() - parse_iso(iso))
    except ValueError:
        return "?"
    if secs < 60:
        return f"{secs:.0f}s ago"
    if secs < 3600:
        return f"{secs / 60:.0f}m ago"
    if secs < 86400:
        return f"{secs / 3600:.1f}h ago"
    return f"{secs / 86400:.1f}d ago"


def status_text(st: Status, placement: Placement | None = None) -> str:
    """A run's status as a block of lines; every value in a line is escaped with ``cell``."""
    runner = f"runner pid {st.pid}" if st.pid else "no runner yet"
    lines = [
        f"run      {cell(st.run_id)}",
        f"agent    {cell(st.agent)} ({cell(st.runner)})",
        f"state    {cell(st.state)}  ({runner})",
        f"started  {cell(st.started_at)}  ({age(st.started_at)})",
    ]
    if placement is not None and placement.backend != "local":
        lines.append(f"placed   {cell(placement_text(placement, st))}")
    if st.ended_at:
        lines.append(f"ended    {cell(st.ended_at)}  ({age(st.ended_at)})")
    if st.parent_run_id:
        key = f" as {cell(st.key)}" if st.key else ""
        lines.append(
            f"parent   {cell(st.parent_run_id)}{key}  (depth {st.depth}, root {cell(st.root_run_id)})"
        )
    if st.runner == "workflow":
        lines.append(children_table(st))
    for step in st.steps if st.runner != "workflow" else []:
        extra = f"exit {step.exit_code}" if step.exit_code is not None else f"pid {step.pid}"
        trunc = ", log truncated" if step.output_truncated else ""
        work = (
            f"  turns {step.turn_count}  tools {step.tool_count}"
            if step.turn_count or step.tool_count
            else ""
        )
        lines.append(
            f"child {step.index}  {cell(step.status)}  {extra}  output {step.output_bytes} B{trunc}{work}"
            f"  last activity {age(step.last_activity_at)}"
        )
        if step.current_tool:
            lines.append(f"         running tool: {cell(step.current_tool)}")
    if st.group:
        lines.append(f"group    {cell(st.group)}")
    if st.session_file:
        lines.append(f"session  {cell(st.session_file)}")
    if st.error:
        lines.append(f"error    {cell(st.error.code)}: {cell(st.error.message)}")
    return "\n".join(lines)


def placement_text(placement: Placement, st: Status) -> str:
    """``slurm job 12 (cluster c) on node n``."""
    job = f"job {placement.job_id}" if placement.job_id else "job not yet accepted"
    cluster = f" (cluster {placement.cluster})" if placement.cluster else ""
    node = f" on node {st.host}" if st.pid else ""
    return f"{placement.backend} {job}{cluster}{node}"


def children_table(st: Status) -> str:
    """A workflow's children, one line each."""
    rows = [("#", "KEY", "AGENT", "STATE", "RUN", "TURNS", "TOOLS", "LAST ACTIVITY", "TOOL")]
    for step in st.steps:
        rows.append(
            (
                str(step.index),
                step.key or "-",
                step.agent or "-",
                str(step.status),
                step.run_id[:8] if step.run_id else "-",
                str(step.turn_count),
                str(step.tool_count),
                age(step.last_activity_at),
                (step.current_tool or "")[:40],
            )
        )
    if len(rows) == 1:
        return "children (none yet)"
    return "children\n" + _table(rows)


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    rows = [tuple(one_line(value) for value in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def fleet_text(rows: Sequence[Any]) -> str:
    """The fleet view: one line per live run or workflow child."""
    table = [("RUN", "KEY", "AGENT", "STATE", "AGE", "TURNS", "TOOLS", "LAST", "STEERS", "TOOL")]
    for row in rows:
        failed = f" ({row.steers_failed} failed)" if row.steers_failed else ""
        table.append(
            (
                row.run_id[:8] if row.run_id else "-",
                row.key or "-",
                row.agent,
                row.state,
                age(row.started_at).removesuffix(" ago"),
                str(row.turns),
                str(row.tools),
                age(row.last_activity_at),
                f"{row.steers_delivered}/{row.steers_requested}{failed}",
                (row.current_tool or "")[:40],
            )
        )
    return "no live runs" if len(table) == 1 else _table(table)


def retained_text(children: Sequence[Any]) -> str:
    """``pisub children list``: one line per finished child, newest first."""
    rows = [("RUN", "KEY", "PARENT", "AGENT", "STATE", "ENDED", "RESUME")]
    for c in children:
        resume = "resumable" if c.resumable else f"not resumable: {c.reason}"
        parent = (c.parent_run_id or "-")[:8]
        rows.append((c.run_id[:8], c.key or "-", parent, c.agent, c.state, age(c.ended_at), resume))
    return "no finished children" if len(rows) == 1 else _table(rows)


def list_text(statuses: Iterable[Status]) -> str:
    rows = [("RUN", "STATE", "AGENT", "STARTED", "ENDED", "PARENT")]
    for st in statuses:
        parent = st.parent_run_id[:8] + (f" {st.key}" if st.key else "") if st.parent_run_id else ""
        rows.append((st.run_id[:8], str(st.state), st.agent, age(st.started_at), age(st.ended_at), parent))
    if len(rows) == 1:
        return "no runs"
    return _table(rows)


def result_text(result: Result) -> str:
    """The result's text blocks (a block of lines: print with :func:`out_block`)."""
    return "\n".join(block.text for block in result.content)


def print_report(report: Any, as_json: bool, width: int = 8) -> None:
    """A doctor's report (``pisub doctor``, ``pisub cluster doctor``): one line per check, the fix
    under each problem, then a verdict; or its JSON. Exits 0 when healthy, else 1."""
    import typer

    if as_json:
        checks = [
            {"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix or None} for c in report.checks
        ]
        json_line({"healthy": report.healthy, "checks": checks})
        raise typer.Exit(0 if report.healthy else 1)
    for check in report.checks:
        out(f"{'ok ' if check.ok else 'BAD'}  {check.name:<{width}} {check.detail}")
        if not check.ok and check.fix:
            out(f"{'':>{width + 3}}fix: {check.fix}")
    out("healthy" if report.healthy else "problems found")
    raise typer.Exit(0 if report.healthy else 1)
