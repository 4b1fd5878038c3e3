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

import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from pisub.protocol.codec import encode, parse_iso

if TYPE_CHECKING:  # (annotations only: a command loads the records it reads)
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


STATE_HUES: dict[str, str] = {
    "complete": "green",
    "ok": "green",
    "healthy": "green",
    "failed": "red",
    "BAD": "red",
    "problems found": "red",
    "stopped": "yellow",
    "paused": "yellow",
    "skipped": "yellow",
    "running": "cyan",
    "starting": "cyan",
    "queued": "cyan",
    "pending": "cyan",
}
"""Each state word's colour (green ended well, red failed, yellow stopped or paused, cyan still
to come or going) for every view (``top`` too); a state not named here (a newer one) is shown
uncoloured."""

_SGR_OF = {"red": "31", "green": "32", "yellow": "33", "cyan": "36"}
STATE_COLOURS: dict[str, str] = {state: _SGR_OF[hue] for state, hue in STATE_HUES.items()}
""":data:`STATE_HUES` as SGR colour codes."""

_SGR = re.compile(r"\x1b\[3[1-6]m|\x1b\[0m")
"""Exactly the sequences :func:`paint` writes: the only ones :func:`out_painted` lets through."""


def colour_wanted() -> bool:
    """Colour on stdout: only on a terminal, never when ``NO_COLOR`` is set (to anything but
    empty, https://no-color.org) or ``TERM`` is ``dumb``; ``--json`` never asks."""
    import os

    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stdout.isatty()
    except (ValueError, OSError):
        return False


def paint(text: str, state: str, colour: bool) -> str:
    """``text`` (already escaped: a :func:`cell`) in ``state``'s colour when ``colour``."""
    code = STATE_COLOURS.get(state)
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def out_painted(text: str) -> None:
    """:func:`out_block` for a block that :func:`paint` coloured: everything but the colour
    sequences paint writes goes through the terminal filter, so a value that holds one still
    shows it escaped (it was escaped by :func:`cell` first)."""
    parts = _SGR.split(text)
    codes = _SGR.findall(text)
    shown = printable(parts[0]) + "".join(c + printable(p) for c, p in zip(codes, parts[1:], strict=True))
    sys.stdout.write(shown if shown.endswith("\n") else shown + "\n")


def terminal_width() -> int | None:
    """How wide the table may be: the terminal's width (``COLUMNS`` first); None when stdout is
    not a terminal and ``COLUMNS`` is unset (a pipe gets every character)."""
    import os
    import shutil

    try:
        tty = sys.stdout.isatty()
    except (ValueError, OSError):
        tty = False
    if not tty and not os.environ.get("COLUMNS", "").isdigit():
        return None
    return max(40, shutil.get_terminal_size((80, 24)).columns)


def json_line(obj: object) -> None:
    """One JSON object on one line (the documented ``--json`` output), always valid UTF-8."""
    json_lines([obj])


def json_lines(objs: Iterable[object]) -> None:
    """One JSON object per line, written at once (``list`` over many runs)."""
    items = list(objs)
    try:
        data = _encode_lines(items)
    except UnicodeEncodeError:  # one of them needs escaping (see _json)
        data = b"".join(_json(obj) + b"\n" for obj in items)
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


_encode_lines = msgspec.json.Encoder().encode_lines


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


def status_text(st: Status, placement: Placement | None = None, *, colour: bool = False) -> str:
    """A run's status as a block of lines; every value in a line is escaped with ``cell``
    (``colour``: its state painted, print with :func:`out_painted`)."""
    runner = f"runner pid {st.pid}" if st.pid else "no runner yet"
    lines = [
        f"run      {cell(st.run_id)}",
        *([f"label    {cell(st.label)}"] if st.label else []),
        f"agent    {cell(st.agent)} ({cell(st.runner)})",
        *([f"task     {cell(st.task)}"] if st.task else []),
        *([f"cwd      {cell(short_path(st.cwd))}"] if st.cwd else []),
        f"state    {paint(cell(st.state), str(st.state), colour)}  ({runner})",
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
        lines.append(children_table(st, colour=colour))
    for step in st.steps if st.runner != "workflow" else []:
        extra = f"exit {step.exit_code}" if step.exit_code is not None else f"pid {step.pid}"
        trunc = ", log truncated" if step.output_truncated else ""
        work = (
            f"  turns {step.turn_count}  tools {step.tool_count}"
            if step.turn_count or step.tool_count
            else ""
        )
        state = paint(cell(step.status), str(step.status), colour)
        lines.append(
            f"child {step.index}  {state}  {extra}  output {step.output_bytes} B{trunc}{work}"
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
    lines += steering_lines(st)
    return "\n".join(lines)


def placement_text(placement: Placement, st: Status) -> str:
    """``slurm job 12 (cluster c) on node n``."""
    job = f"job {placement.job_id}" if placement.job_id else "job not yet accepted"
    cluster = f" (cluster {placement.cluster})" if placement.cluster else ""
    node = f" on node {st.host}" if st.pid else ""
    return f"{placement.backend} {job}{cluster}{node}"


def children_table(st: Status, *, colour: bool = False) -> str:
    """A workflow's children, one line each (``colour``: states painted)."""
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
        return "children (none)" if st.state.is_terminal else "children (none yet)"
    return "children\n" + _table(rows, paint_column=3 if colour else None)


def host_steps_text(st: Status) -> str:
    """A named resource's workflow's ``runs.host`` steps, one line each."""
    rows = [("KEY", "STATE", "REASON", "EXIT", "COMMAND", "REPORT")]
    for step in st.host_steps:
        rows.append(
            (
                cell(step.key),
                cell(step.state) + (" (replayed)" if step.replayed else ""),
                cell(step.reason_code or "-"),
                str(step.exit_code) if step.exit_code is not None else "-",
                cell((step.command or "")[:60]),
                cell(step.report_path or "-"),
            )
        )
    return "host steps\n" + _table(rows)


def _table(
    rows: Sequence[tuple[str, ...]],
    *,
    paint_column: int | None = None,
    width: int | None = None,
    shrink: Sequence[tuple[int, int]] = (),
    cut_left: Sequence[int] = (),
) -> str:
    """Rows of cells (the first: the headers) as aligned columns, each cell escaped with
    :func:`one_line`. ``paint_column``: that column's cells painted by state (print with
    :func:`out_painted`). ``width``: the columns of ``shrink`` — ``(column, narrowest)``, in
    that order — are narrowed until the table fits, their cells cut with ``…`` (at the start
    for the columns of ``cut_left``: a path's end says most)."""
    rows = [tuple(one_line(value) for value in row) for row in rows]
    widths = [max(columns_of(r[i]) for r in rows) for i in range(len(rows[0]))]
    if width is not None:
        _fit(widths, width, shrink)
    lines = []
    for number, row in enumerate(rows):
        cells = []
        for i, (value, w) in enumerate(zip(row, widths, strict=True)):
            shown = _cut(value, w, left=i in cut_left) if columns_of(value) > w else value
            pad = " " * (w - columns_of(shown))
            cells.append((paint(shown, value, True) if number and i == paint_column else shown) + pad)
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def columns_of(text: str) -> int:
    """How many terminal columns ``text`` takes: a wide (East Asian) character two, a combining
    mark none, any other one."""
    if text.isascii():
        return len(text)
    return sum(_char_columns(c) for c in text)


def _char_columns(char: str) -> int:
    import unicodedata

    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _fit(widths: list[int], width: int, shrink: Sequence[tuple[int, int]]) -> None:
    """Narrow the columns of ``shrink`` (in order, each down to its narrowest) until the
    columns and their two-space gaps fit ``width`` (or nothing can be narrowed more)."""
    for column, narrowest in shrink:
        excess = sum(widths) + 2 * (len(widths) - 1) - width
        if excess <= 0:
            return
        widths[column] = max(min(narrowest, widths[column]), widths[column] - excess)


def _cut(text: str, width: int, *, left: bool = False) -> str:
    """``text`` in ``width`` columns, cut with ``…`` (``left``: its start cut, at a ``/`` when
    one is left: ``…/proj``)."""
    if width <= 1:
        return "…"[:width]
    if not left:
        return _within(text, width - 1) + "…"
    end = _within(text[::-1], width - 1)[::-1]
    slash = end.find("/")
    return "…" + (end[slash:] if 0 < slash < len(end) - 1 else end)


def _within(text: str, width: int) -> str:
    """The longest start of ``text`` that takes at most ``width`` columns."""
    used = 0
    for at, char in enumerate(text):
        used += _char_columns(char)
        if used > width:
            return text[:at]
    return text


def short_path(path: str | None) -> str:
    """``path`` with the home directory shown as ``~``."""
    import os

    if not path:
        return "-"
    home = os.path.expanduser("~").rstrip("/")
    if home and (path == home or path.startswith(home + "/")):
        return "~" + path[len(home) :]
    return path


WIDE = 100
"""From this width on, ``list`` shows when each run ended too, and ``fleet`` turns and tools."""


def fleet_text(rows: Sequence[Any], *, width: int | None = None, colour: bool = False) -> str:
    """The fleet view: one line per live run or workflow child (``width``: fitted to it, as
    :func:`list_text`); the key, tool and label columns only when a row has one, the turns and
    tools only from :data:`WIDE` columns."""
    keyed = any(row.key for row in rows)
    busy = width is None or width >= WIDE
    tooled = any(row.current_tool for row in rows)
    labelled = any(getattr(row, "label", None) for row in rows)
    columns: list[tuple[str, Callable[[Any], str]]] = [
        ("RUN", lambda r: r.run_id[:8] if r.run_id else "-"),
        *([("KEY", lambda r: r.key or "-")] if keyed else []),
        ("AGENT", lambda r: r.agent),
        ("STATE", lambda r: r.state),
        ("AGE", lambda r: age(r.started_at).removesuffix(" ago")),
        *([("TURNS", lambda r: str(r.turns)), ("TOOLS", lambda r: str(r.tools))] if busy else []),
        ("LAST", lambda r: age(r.last_activity_at)),
        ("STEERS", _steers),
        *([("TOOL", lambda r: (r.current_tool or "")[:40])] if tooled else []),
        *([("LABEL", lambda r: r.label or "")] if labelled else []),
        ("CWD", lambda r: short_path(r.cwd) if r.cwd else ""),
        ("TASK", lambda r: r.task or ""),
    ]
    if not rows:
        return "no live runs"
    table = [tuple(name for name, _ in columns), *(tuple(show(row) for _, show in columns) for row in rows)]
    last = len(columns) - 1
    shrink = [(last, 16), (last - 1, 12), *([(last - 2, 12)] if labelled else []), (last, 8)]
    if tooled:
        shrink.insert(2, (last - 2 - labelled, 8))
    state = 3 if keyed else 2
    return _table(
        table, paint_column=state if colour else None, width=width, shrink=shrink, cut_left=(last - 1,)
    )


def _steers(row: Any) -> str:
    failed = f" ({row.steers_failed} failed)" if row.steers_failed else ""
    return f"{row.steers_delivered}/{row.steers_requested}{failed}"


def retained_text(children: Sequence[Any]) -> str:
    """``pisub children list``: one line per finished child, newest first."""
    rows = [("RUN", "KEY", "PARENT", "AGENT", "STATE", "ENDED", "RESUME")]
    for c in children:
        resume = "resumable" if c.resumable else f"not resumable: {c.reason}"
        parent = (c.parent_run_id or "-")[:8]
        rows.append((c.run_id[:8], c.key or "-", parent, c.agent, c.state, age(c.ended_at), resume))
    return "no finished children" if len(rows) == 1 else _table(rows)


def list_text(statuses: Iterable[Status], *, width: int | None = None, colour: bool = False) -> str:
    """``pisub list``: one line per run — id, state, agent, when it started (and ended, when
    the table is wide enough), its parent, label, cwd and the head of its task, fitted to
    ``width`` (the task column takes what is left, cut with ``…``; None: nothing is cut)."""
    statuses = list(statuses)
    ended = width is None or width >= WIDE
    parents = any(st.parent_run_id for st in statuses)
    labelled = any(st.label for st in statuses)
    rows = [
        (
            "RUN",
            "STATE",
            "AGENT",
            "STARTED",
            *(("ENDED",) if ended else ()),
            *(("PARENT",) if parents else ()),
            *(("LABEL",) if labelled else ()),
            "CWD",
            "TASK",
        )
    ]
    for st in statuses:
        parent = st.parent_run_id[:8] + (f" {st.key}" if st.key else "") if st.parent_run_id else ""
        rows.append(
            (
                st.run_id[:8],
                str(st.state),
                st.agent,
                age(st.started_at),
                *((age(st.ended_at),) if ended else ()),
                *((parent,) if parents else ()),
                *((st.label or "",) if labelled else ()),
                short_path(st.cwd),
                st.task or "",
            )
        )
    if len(rows) == 1:
        return "no runs"
    last = len(rows[0]) - 1
    shrink = [(last, 20), (last - 1, 12), *([(last - 2, 12)] if labelled else []), (last, 8)]
    return _table(rows, paint_column=1 if colour else None, width=width, shrink=shrink, cut_left=(last - 1,))


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
    colour = colour_wanted()
    lines = []
    for check in report.checks:
        mark = "ok" if check.ok else "BAD"
        name, detail = one_line(check.name), one_line(check.detail)
        lines.append(f"{paint(mark, mark, colour)}{' ' if check.ok else ''}  {name:<{width}} {detail}")
        if not check.ok and check.fix:
            lines.append(f"{'':>{width + 3}}fix: {one_line(check.fix)}")
    verdict = "healthy" if report.healthy else "problems found"
    lines.append(paint(verdict, verdict, colour))
    out_painted("\n".join(lines))
    raise typer.Exit(0 if report.healthy else 1)


STEERING_SHOWN = 3
"""How many of a run's last requests ``pisub status`` shows."""

_STATE_WORDS = {
    "delivered": "delivered",
    "queued": "waiting in pi's queue",
    "pending": "not yet taken by the child",
    "scheduled": "kept for the next resume",
    "recovered": "delivered to a resumed run",
    "partial": "delivered to some children",
    "failed": "failed",
    "rejected": "rejected",
}


def steering_lines(st: Status) -> list[str]:
    """The steering of a run in words (nothing when it had none): the counts, then its last
    :data:`STEERING_SHOWN` requests, each with its state and message."""
    ledger = st.steering
    if not ledger.requested and not ledger.recent:
        return []
    waiting = ledger.requested - ledger.delivered - ledger.failed - ledger.rejected - ledger.carried
    counts = [
        f"{n} {what}"
        for n, what in (
            (ledger.delivered, "delivered"),
            (max(0, waiting), "waiting"),
            (ledger.carried, "carried to the next resume"),
            (ledger.failed, "failed"),
            (ledger.rejected, "rejected"),
        )
        if n
    ]
    plural = "" if ledger.requested == 1 else "s"
    lines = [f"steering {ledger.requested} request{plural}" + (f": {', '.join(counts)}" if counts else "")]
    for entry in ledger.recent[-STEERING_SHOWN:]:
        words = _STATE_WORDS.get(str(entry.state), str(entry.state))
        if entry.state == "scheduled" and not st.state.is_terminal:  # a queued run, or a child to come
            words = "held for its child's start" if st.runner == "workflow" else "held until it starts"
        if entry.replacement_run_id and entry.state in ("delivered", "recovered"):
            words = f"delivered by resume {entry.replacement_run_id[:8]}"  # a carried steer
        what = entry.type.replace("_", "-")
        message = f'  "{cell(entry.preview)}"' if entry.preview else ""
        lines.append(f"         {what} {words}{message}  ({age(entry.updated_at)})")
    return lines
