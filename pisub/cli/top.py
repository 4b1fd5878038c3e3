"""``pisub top``: a full-screen live table of runs (a workflow's children under it), redrawn when
inotify says the runs directory or a shown run changed — no busy polling; a clock tick a second
keeps the ages right. Keys: arrows or j/k select, enter opens the run's live log (q or esc
back), s steers (a prompt line; the receipt is shown), i interrupts, x stops (after a y/n
confirmation), q quits. Runs that appear, end, are removed, or cannot be read are shown as
they are; nothing of that ends the view.

Rows keep their place: top-level runs newest first by start time (never by state), a
workflow's children under it in their place in the workflow (step order: a queued call that
starts stays on its row). The cursor starts on the newest run and follows its
run (not its line); a run that appears while keys are pressed waits until none was pressed for
``HOLD_S``; new rows replace the old ones only right before a redraw, so a key acts on the run
the screen shows highlighted, and a prompt (steer, stop) on the run it was opened on.

Every string shown goes through :func:`_clean` — the one terminal filter
(:func:`pisub.termsafe.printable`) — and reaches the terminal as text between this view's own
SGR sequences (:mod:`pisub.cli.top_screen`: no markup language in between; ``[link=...]`` in a
tool name is shown as it is). A redraw writes only the lines that changed."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import heapq
import os
import select
import sys
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pisub.api.views import FleetRow, Home, fleet_of, last_line, transcript
from pisub.cli.render import STATE_HUES as STATE_STYLES
from pisub.cli.top_reader import POLL_MIN_S, RUN_ID, Reader
from pisub.errors import PisubError
from pisub.protocol.status import Status

if TYPE_CHECKING:
    from pisub.cli.top_screen import Line

MAX_ROWS = 300
REDRAW_MIN_S = 0.2
TICK_S = 1.0
CELL_CHARS = 60
KEY_CHARS = 12
"""At most this much of a workflow child's key in the run column."""
AGENT_CHARS = 16
"""At most this much of an agent's name in the agent column."""
WATCH_MAX = 512
"""At most this many run directories watched (inotify watches are a per-user resource)."""
HOLD_S = 2.0
"""New rows wait until no key was pressed for this long: nothing moves while a person navigates."""
WIDE = 120
"""From this width on, the table also shows activity, turns, tools and the last output line."""
HELP = "j/k move · enter log · s steer · i interrupt · x stop · q quit · newest first"
LOG_HELP = "q/esc/enter back to the table · the log follows the run"


@dataclass
class Row:
    fleet: FleetRow
    depth: int
    spark: str = ""
    status: Status | None = None
    """The run's status (None for a workflow's call that has no run yet)."""

    @property
    def ident(self) -> str:
        """What the selection follows: a workflow child's parent and key (the same before and
        after its run starts), else its run id."""
        f = self.fleet
        if f.parent_run_id is not None and f.key is not None:
            return f"{f.parent_run_id}/{f.key}"
        return f.run_id or f"{f.parent_run_id}/?"


@dataclass
class TopState:
    rows: list[Row] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    selected: int = 0
    mode: str = "table"
    """``table``, ``log``, ``steer`` (typing a message) or ``confirm`` (stopping)."""
    typed: str = ""
    message: str = HELP
    log: list[str] = field(default_factory=list)
    target: Row | None = None
    """The run a prompt, a confirmation or the log view is about (fixed when it opened)."""
    held: int = 0
    """New rows not shown yet (a key was pressed less than ``HOLD_S`` ago)."""

    @property
    def current(self) -> Row | None:
        return self.rows[self.selected] if 0 <= self.selected < len(self.rows) else None


@dataclass
class Order:
    """Where the runs go — the newest top-level run first, by start time (never by state, so
    that a run's place does not change when it ends), a workflow's children right under it in
    their place in the workflow (:func:`_in_plan_order`): the newest top-level runs (those
    that can be shown) and each run's children (by id). It changes only when a run appears or
    leaves, or its parent, key or start time changes
    (:attr:`pisub.cli.top_reader.Reader.shape`) — not when a state does."""

    tops: list[str]
    children: dict[str, list[str]]


def order_of(statuses: Collection[Status]) -> Order:
    known = {st.run_id for st in statuses}
    tops: list[Status] = []
    children: dict[str, list[str]] = {}
    for st in statuses:  # a child whose parent is gone (gc) is shown at the top level
        if st.parent_run_id is not None and st.parent_run_id in known:
            children.setdefault(st.parent_run_id, []).append(st.run_id)
        else:
            tops.append(st)
    # (each top-level run takes a row at least: the newest MAX_ROWS of them are all that can show)
    return Order([st.run_id for st in heapq.nlargest(MAX_ROWS, tops, key=_started)], children)


def rows_of(home: Home, order: Order, known: dict[str, Status], made: Made | None = None) -> list[Row]:
    """The rows of the runs in ``order`` (their statuses as ``known`` has them now); ``made``:
    what the last refresh made of a run, kept for one whose status and directory did not
    change."""
    rows: list[Row] = []
    made = made if made is not None else Made()

    def add(status: Status, depth: int) -> None:
        if len(rows) >= MAX_ROWS:
            return
        own, spark = made.of(home, status)
        rows.append(Row(own[0], depth, spark, status))
        kids = [known[run_id] for run_id in order.children.get(status.run_id, ()) if run_id in known]
        for child in _in_plan_order(status, own[1:], kids):
            if isinstance(child, FleetRow):
                rows.append(Row(child, depth + 1))
            else:
                add(child, depth + 1)

    for run_id in order.tops:
        if len(rows) >= MAX_ROWS:
            break
        if run_id in known:
            add(known[run_id], 0)
    return rows


class Made:
    """A run's fleet rows and the last line it wrote, as made from its status (the same
    object: a status read again is another) and kept until :meth:`forget` (its directory
    changed: the log may have grown)."""

    def __init__(self) -> None:
        self.made: dict[str, tuple[Status, list[FleetRow], str]] = {}

    def of(self, home: Home, status: Status) -> tuple[list[FleetRow], str]:
        kept = self.made.get(status.run_id)
        if kept is not None and kept[0] is status:
            return kept[1], kept[2]
        own, spark = fleet_of([status], live_only=False), last_line(home, status)
        self.made[status.run_id] = (status, own, spark)
        return own, spark

    def forget(self, run_ids: Iterable[str] | None = None) -> None:
        """Make runs ``run_ids`` (None: every run) anew at the next refresh."""
        if run_ids is None:
            self.made.clear()
        for run_id in run_ids or ():
            self.made.pop(run_id, None)


def _started(status: Status) -> tuple[str, str]:
    return (status.started_at or "", status.run_id)


def _in_plan_order(
    parent: Status, waiting: list[FleetRow], children: list[Status]
) -> list[Status | FleetRow]:
    """A run's children in a place that never changes: a workflow's by their step in it (the
    plan's order; a call with no run yet is the row ``waiting`` holds for it, and a call that
    starts takes that same place), then any child no step names, oldest first. A call whose
    run the workflow has not recorded yet is matched by its key, so it does not move either."""
    oldest_first = sorted(children, key=_started)
    if parent.runner != "workflow":
        return list(oldest_first)
    by_id = {child.run_id: child for child in children}
    named = {step.run_id for step in parent.steps}
    unnamed = [child for child in oldest_first if child.run_id not in named]
    placeholders = iter(waiting)
    placed: list[Status | FleetRow] = []
    for step in parent.steps:  # (in index order; ``waiting`` holds the run-less ones in this order)
        if step.run_id is not None:
            if step.run_id in by_id:
                placed.append(by_id[step.run_id])
            continue
        placeholder = next(placeholders, None)
        started = next((c for c in unnamed if step.key is not None and c.key == step.key), None)
        if started is not None:
            unnamed.remove(started)
            placed.append(started)
        elif placeholder is not None:
            placed.append(placeholder)
    return placed + unnamed


def _age(stamp: str | None) -> str:
    if not stamp:
        return "-"
    try:
        when = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "?"
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    seconds = max(0, int((dt.datetime.now(dt.UTC) - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _clean(text: str, limit: int | None = None) -> str:
    """``text`` as it may reach the terminal: control characters, escape sequences, bidi
    controls and undecodable bytes escaped, on one line; at most ``limit`` characters once
    escaped (a cell of escapes must not squeeze the others away)."""
    from pisub.termsafe import printable

    return printable(text, one_line=True)[:limit]


def _line(text: str, style: str = "") -> Line:
    """One screen line: escaped (cut at the screen's edge by :func:`screen`, never wrapped)."""
    return ((_clean(text), style),)


def steering_words(status: Status | None) -> str:
    """The run's control requests in words: ``steering: 1 queued, 1 delivered, 1 failed``
    (queued: asked for and not answered yet); empty when it had none."""
    if status is None or status.steering.requested == 0:
        return ""
    ledger = status.steering
    waiting = max(0, ledger.requested - ledger.delivered - ledger.failed - ledger.rejected - ledger.carried)
    counts = (
        ("queued", waiting),
        ("delivered", ledger.delivered),
        ("carried to the next resume", ledger.carried),
        ("failed", ledger.failed),
    )
    words = [f"{n} {word}" for word, n in (*counts, ("rejected", ledger.rejected)) if n]
    return "steering: " + ", ".join(words)


def _task(row: Row) -> str:
    """A run's label when it has one, else the head of its task."""
    if row.status is None:
        return ""
    return row.status.label or row.status.task or ""


def _detail(row: Row | None) -> str:
    """The line under the table about the selected run: its id, label, cwd, steering, the tool
    it is in, and the head of its task when the table shows its label."""
    if row is None:
        return ""
    f, st = row.fleet, row.status
    if st is None:
        return f"{f.key or '?'} of {(f.parent_run_id or '?')[:8]}: {f.state}, no run yet ({f.agent})"
    parts = [st.run_id[:8]]
    if st.label:
        parts.append(f"[{st.label}]")
    if st.cwd:
        parts.append(f"in {st.cwd}")
    tool = f"tool {f.current_tool}" if f.current_tool else ""
    task = f"task: {st.task}" if st.label and st.task else ""  # (the table shows the label)
    parts += [words for words in (steering_words(st), tool, task) if words]
    return " · ".join(parts)


def render(state: TopState, height: int, width: int = 80) -> Any:
    """The screen as a rich renderable (what :func:`screen` lays out)."""
    from pisub.cli.top_screen import to_rich

    return to_rich(screen(state, height, width))


def screen(state: TopState, height: int, width: int = 80) -> list[Line]:
    """The screen's lines, each at most ``width`` cells: the table (or the selected run's log)
    and a status line."""
    from pisub.cli.top_screen import cut_line

    lines = _log_lines(state, height, width) if state.mode == "log" else _table_screen(state, height, width)
    return [cut_line(line, width) for line in lines]


def _table_screen(state: TopState, height: int, width: int) -> list[Line]:
    footer = _line(_fitted(state.message, width), "bold")
    if state.mode == "steer":
        footer = _line(f"steer {_short(state.target)}> {state.typed}", "bold yellow")
    elif state.mode == "confirm":
        footer = _line(f"stop {_short(state.target)}? y/n", "bold red")
    fixed, first, room = _window(state, height)
    parts = _table(state, first, room, width)
    if not state.rows:
        parts.append(_line("no runs yet (pisub run ...)"))
    else:
        parts.append(_line(_detail(state.current), "dim"))
    spare = max(1, height - fixed - min(len(state.rows), room))  # the problems take what is left
    shown = state.problems if len(state.problems) <= spare else state.problems[: spare - 1]
    parts += [_line(f"unreadable run {p}", "red") for p in shown]
    if len(shown) < len(state.problems):
        more = len(state.problems) - len(shown)
        parts.append(_line(f"... and {more} more unreadable runs (pisub list names them all)", "red"))
    if state.held:
        parts.append(_line(f"{state.held} new row(s): shown when no key was pressed for {HOLD_S:g} s", "dim"))
    return [*parts, footer]


def _window(state: TopState, height: int) -> tuple[int, int, int]:
    """The table's lines besides its rows, its first row shown and how many rows it shows."""
    fixed = 3 + (1 if state.held else 0)  # the header, the detail line, the footer (the held rows)
    room = max(1, height - fixed - min(len(state.problems), 3))  # rows; at least 3 lines of problems
    return fixed, max(0, state.selected - (room - 1)), room


def clock_words(state: TopState, height: int, width: int) -> tuple[str, ...] | None:
    """What the clock changes on the screen — the ages of the rows shown — and the screen's
    size: a tick redraws only when one changed (None: the view is not the table; every tick
    redraws it)."""
    if state.mode != "table":
        return None
    _, first, room = _window(state, height)
    wide = width >= WIDE
    words = [str(height), str(width)]
    for row in state.rows[first : first + room]:
        words.append(_age(row.fleet.started_at))
        if wide:
            words.append(_age(row.fleet.last_activity_at))
    return tuple(words)


def _fitted(text: str, width: int) -> str:
    """``text`` (escaped) in ``width`` columns, cut after a whole word with ``…`` when longer."""
    from pisub.termsafe import printable

    shown = printable(text, one_line=True)
    if len(shown) <= width:
        return shown
    cut = shown[: max(1, width - 1)]
    space = cut.rfind(" ")
    return (cut[:space] if space > width // 2 else cut).rstrip(" ·—,;:") + "…"


def _table(state: TopState, first: int, room: int, width: int) -> list[Line]:
    """The table's header and its rows ``first`` to ``first + room``: the last columns (the
    label or task, and from :data:`WIDE` columns the output) take the room the others leave —
    a reply streaming into one long line must not squeeze the other columns away."""
    from pisub.cli.top_screen import table

    wide = width >= WIDE
    names = ["run", "agent", "state", "age"] + (["active", "turns", "tools"] if wide else [])
    names += ["label/task"] + (["output"] if wide else [])
    rows = []
    for index, row in enumerate(state.rows[first : first + room], start=first):
        f = row.fleet
        key = f" {f.key[:KEY_CHARS]}" if f.key else ""
        name = ("  " * min(row.depth, 4)) + (f.run_id[:8] if f.run_id else "-".ljust(8)) + key
        cells = [
            (name, ""),
            (f.agent[:AGENT_CHARS], ""),
            (f.state, STATE_STYLES.get(f.state, "")),
            (_age(f.started_at), ""),
        ]
        if wide:
            cells += [(_age(f.last_activity_at), ""), (str(f.turns), ""), (str(f.tools), "")]
        cells.append((_task(row), ""))
        if wide:
            cells.append((row.spark, "dim"))
        style = "reverse" if index == state.selected else ""
        rows.append(([(_clean(cell, CELL_CHARS), colour) for cell, colour in cells], style))
    return table(names, rows, width, [3, 2] if wide else [3])


def _log_lines(state: TopState, height: int, width: int) -> list[Line]:
    """The log view: a header about the run (its id, agent, state and label or task; under it
    its steering and cwd, so that neither is cut away at 80 columns), its log's last lines
    (wrapped at the screen's width; the newest at the bottom) and its own footer."""
    row = state.target
    head = [f"log of {_short(row)}"]
    if row is not None:
        head[0] += "".join(f" · {part}" for part in (row.fleet.agent, row.fleet.state, _task(row)) if part)
        cwd = f"in {row.status.cwd}" if row.status is not None and row.status.cwd else ""
        second = " · ".join(part for part in (steering_words(row.status), cwd) if part)
        head += [second] if second else []
    lines = _wrapped(state.log, max(10, width), max(1, height - 1 - len(head)))
    message = state.message if state.message != HELP else LOG_HELP
    body = [_line(line) for line in lines] or [_line("(nothing written yet)", "dim")]
    return [*(_line(line, "bold") for line in head), *body, _line(_fitted(message, width), "bold")]


def _wrapped(lines: list[str], width: int, room: int) -> list[str]:
    """The last ``room`` screen lines of the log lines, each escaped and cut into screen lines of
    ``width`` characters; when the first one shown continues a line begun above, it begins with
    ``…`` (a line longer than the screen: its end is shown, marked as cut)."""
    from pisub.termsafe import printable

    out: list[str] = []
    for line in reversed(lines):
        shown = printable(line, one_line=True).expandtabs(8)
        rows = [shown[i : i + width] for i in range(0, len(shown), width)] or [""]
        if len(rows) >= room - len(out):
            kept = rows[len(rows) - (room - len(out)) :]
            if len(kept) < len(rows):
                kept[0] = "\u2026" + kept[0][1:]
            return kept + out
        out = rows + out
    return out


def _short(row: Row | None) -> str:
    if row is None or row.fleet.run_id is None:
        return "-"
    return row.fleet.run_id[:8]


class Watch:
    """inotify on the runs directory and on the directories of the runs followed (those shown
    first, the selected one, the live ones: at most :data:`WATCH_MAX`)."""

    def __init__(self, home: Home) -> None:
        from inotify_simple import INotify, flags

        self.flags = flags
        self.mask = (
            flags.CREATE | flags.DELETE | flags.MOVED_TO | flags.MOVED_FROM | flags.MODIFY | flags.CLOSE_WRITE
        )
        self.watched: dict[str, int] = {}
        self.by_wd: dict[int, str] = {}
        self.runs_wd: int | None = None
        self.inotify: INotify | None = None
        self.missing = ""
        """Why there is no inotify (the per-user limit of its instances reached): the reader
        then lists every run every few seconds instead."""
        try:
            self.inotify = INotify()
        except OSError as exc:
            why = exc.strerror or str(exc)
            self.missing = f"no inotify ({why}): every run read again every {POLL_MIN_S:g} s or more"
            return
        with contextlib.suppress(OSError):
            self.runs_wd = self.inotify.add_watch(os.fspath(home.runs), self.mask)

    @property
    def fds(self) -> list[int]:
        return [] if self.inotify is None else [int(self.inotify.fileno())]

    def add(self, home: Home, run_id: str) -> None:
        """Follow run ``run_id``'s directory too (nothing when it is gone or too many are)."""
        if self.inotify is None or run_id in self.watched or len(self.watched) >= WATCH_MAX:
            return
        with contextlib.suppress(OSError):
            wd = self.inotify.add_watch(os.fspath(home.run(run_id).root), self.mask)
            self.watched[run_id], self.by_wd[wd] = wd, run_id

    def follow(self, home: Home, run_ids: list[str]) -> set[str]:
        """Follow exactly ``run_ids`` (the first :data:`WATCH_MAX`); those not followed before."""
        wanted = set(run_ids)
        for run_id in list(self.watched):
            if run_id not in wanted:
                wd = self.watched.pop(run_id)
                self.by_wd.pop(wd, None)
                if self.inotify is not None:
                    with contextlib.suppress(OSError):
                        self.inotify.rm_watch(wd)
        before = set(self.watched)
        for run_id in run_ids:
            self.add(home, run_id)
        return self.watched.keys() - before

    def drain(self) -> tuple[set[str], bool]:
        """The entries of ``runs/`` that changed (runs that appeared or left, and followed runs
        whose directory changed); True too when the events were more than the kernel kept, or
        ``runs/`` itself changed: everything is to be read again."""
        flags = self.flags
        names: set[str] = set()
        everything = False
        for event in self.inotify.read(timeout=0) if self.inotify is not None else ():
            if event.mask & flags.Q_OVERFLOW:
                everything = True
            elif event.wd == self.runs_wd:
                if event.name:
                    names.add(event.name)
                else:  # runs/ itself was removed or moved
                    everything = True
            elif (run_id := self.by_wd.get(event.wd)) is not None:
                names.add(run_id)
                if event.mask & flags.IGNORED:  # its directory is gone
                    self.watched.pop(run_id, None)
                    self.by_wd.pop(event.wd, None)
        return names, everything

    def close(self) -> None:
        if self.inotify is not None:
            self.inotify.close()


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


KEYS = {b"\x1b[A": "up", b"\x1b[B": "down", b"k": "up", b"j": "down", b"\r": "enter", b"\n": "enter"}


def keys_of(data: bytes) -> list[str]:
    """The keys in what the terminal sent (arrows are escape sequences)."""
    found = []
    i = 0
    while i < len(data):
        if data[i : i + 3] in (b"\x1b[A", b"\x1b[B"):
            found.append(KEYS[data[i : i + 3]])
            i += 3
            continue
        if data[i : i + 1] == b"\x1b":
            found.append("esc")
            i += 1 if data[i + 1 : i + 2] != b"[" else 3
            continue
        char = data[i : i + 1]
        found.append(KEYS.get(char, char.decode("utf-8", "replace")))
        i += 1
    return found


class Top:
    """The view's loop: keys and inotify events in, a redraw out (at most every 0.2 s).

    What the screen shows is what the keys act on: the rows are replaced only right before a
    redraw, the selection follows its run (not its place), and a prompt, a confirmation or the
    log view acts on the run it was opened on."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.watch = Watch(home)
        self.state = TopState(message=self.watch.missing or HELP)
        # (``runs/`` not watched — no home yet, or no watch left: every run listed again often)
        self.reader = Reader(home, polling=bool(self.watch.missing) or self.watch.runs_wd is None)
        self.changed: set[str] = set()
        self.made = Made()
        self.order: tuple[int, Order] | None = None
        """Where the runs go, and the reader's shape it was made for."""
        """Entries of ``runs/`` inotify named since the last refresh."""
        self.done = False
        self.started = False
        self.last_key = float("-inf")

    def refresh(self) -> None:
        st = self.state
        chosen = st.current.ident if st.current is not None else None
        self._read()
        if self.order is None or self.order[0] != self.reader.shape:
            self.order = (self.reader.shape, order_of(self.reader.known.values()))
        rows = rows_of(self.home, self.order[1], self.reader.known, self.made)
        st.problems = self.reader.problems
        st.held = 0
        if self.holding() and st.rows:  # the person is navigating: no new row moves the others
            shown = {row.ident for row in st.rows}
            st.held = sum(1 for row in rows if row.ident not in shown)
            rows = [row for row in rows if row.ident in shown]
        st.rows = rows
        idents = [row.ident for row in rows]
        if not self.started:  # the newest run, never the placeholder of a call that has no run
            st.selected = next((i for i, row in enumerate(rows) if row.fleet.run_id), 0)
            self.started = bool(rows)
        elif chosen in idents:
            st.selected = idents.index(chosen)
        st.selected = min(st.selected, max(0, len(rows) - 1))
        if st.target is not None:
            st.target = next((row for row in rows if row.ident == st.target.ident), st.target)
        # a live run read before its directory was watched may have changed since: read again
        self.changed |= self.watch.follow(self.home, self._followed()) & self.reader.live
        if st.mode == "log":
            self._load_log()

    def _read(self) -> None:
        """Every run again when a full listing is due, else the runs inotify named (followed
        before they are read: a change right after the read is not missed)."""
        changed, self.changed = self.changed, set()
        if self.reader.full_due():
            self.reader.read_all()
            self.made.forget()
            return
        self.made.forget(changed)
        for name in changed:
            if RUN_ID.fullmatch(name):
                self.watch.add(self.home, name)
        self.reader.read(changed)

    def _followed(self) -> list[str]:
        """The runs whose directories inotify watches: the selected one (and the one a prompt or
        the log view is about), those on the screen and the first 64 rows, then the live ones."""
        st = self.state
        near = st.rows[max(0, st.selected - 64) : st.selected + 64]
        ids = [row.fleet.run_id for row in (st.current, st.target, *st.rows[:64], *near) if row is not None]
        ids += sorted(self.reader.live)
        return list(dict.fromkeys(run_id for run_id in ids if run_id))

    def holding(self) -> bool:
        """Whether a key was pressed less than ``HOLD_S`` ago."""
        return time.monotonic() - self.last_key < HOLD_S

    def _load_log(self) -> None:
        row = self.state.target
        if row is None or row.fleet.run_id is None:
            self.state.log = []
            return
        if row.status is not None and row.status.runner == "workflow":
            self.state.log = [
                "a workflow: enter on one of its children (the rows under it) for that child's log;",
                f"pisub logs -f {row.fleet.run_id[:8]} interleaves them all",
            ]
            return
        try:
            self.state.log = transcript(self.home, 500, run_id=row.fleet.run_id)
        except (OSError, PisubError) as exc:
            self.state.log = [f"cannot read the log: {exc}"]

    def key(self, key: str) -> None:
        self.last_key = time.monotonic()
        handler = {
            "table": self._table_key,
            "log": self._log_key,
            "steer": self._steer_key,
            "confirm": self._confirm_key,
        }
        handler[self.state.mode](key)

    def _table_key(self, key: str) -> None:
        st = self.state
        if key == "q":
            self.done = True
        elif key == "up":
            st.selected = max(0, st.selected - 1)
        elif key == "down":
            st.selected = min(max(0, len(st.rows) - 1), st.selected + 1)
        elif st.current is None:
            return
        elif st.current.fleet.run_id is None:
            st.message = _not_started(st.current.fleet, key)
        elif key == "s" and (refusal := _not_steerable(st.current)) is not None:
            st.message = refusal  # said before a message is typed, not after
        elif key in ("enter", "s", "x"):
            st.target, st.message = st.current, HELP
            st.mode, st.typed = {"enter": "log", "s": "steer", "x": "confirm"}[key], ""
            if st.mode == "log":
                self.refresh()
        elif key == "i":
            self._control("interrupt", st.current.fleet.run_id)

    def _log_key(self, key: str) -> None:
        if key in ("q", "esc", "enter"):
            self.state.mode, self.state.target = "table", None

    def _steer_key(self, key: str) -> None:
        st = self.state
        if key == "esc":
            st.mode = "table"
        elif key == "enter":
            st.mode = "table"
            if st.typed.strip():
                self._control("steer", _run_id(st.target), st.typed)
        elif key in ("\x7f", "\x08"):
            st.typed = st.typed[:-1]
        elif len(key) == 1 and key.isprintable():
            st.typed += key

    def _confirm_key(self, key: str) -> None:
        st = self.state
        st.mode = "table"
        if key in ("y", "Y"):
            self._control("stop", _run_id(st.target))
        else:
            st.message = "not stopped"

    def _control(self, what: str, run_id: str, message: str = "") -> None:
        from pisub.api.client import Run

        self.state.target = None
        try:
            run = Run(run_id, home=self.home.root)
            if what == "steer":
                run.check_steerable("steer")
                rid = run.send_steer(message, source="pisub top")
            elif what == "interrupt":
                rid = run.interrupt(source="pisub top")
            else:
                rid = run.send_stop(source="pisub top")
            receipt = run.wait_for_receipt(rid, timeout=3)
        except PisubError as exc:  # the code first: an 80-column footer may cut the words
            self.state.message = f"{what} {run_id[:8]}: {exc.code} — {exc.message}"
            return
        state = receipt.state if receipt is not None else "pending"
        why = f": {receipt.reason}" if receipt is not None and receipt.reason else ""
        self.state.message = f"{what} {run_id[:8]}: {state}{why}"

    def run(self) -> None:
        from pisub.cli.render import colour_wanted
        from pisub.cli.top_screen import Painter

        stdin = sys.stdin.fileno()
        self.refresh()
        last_draw = last_collect = 0.0
        dirty, stale = True, False
        clock: tuple[str, ...] | None = None
        with raw_terminal(stdin), Painter(sys.stdout.fileno(), colour_wanted()) as painter:
            while not self.done:
                now = time.monotonic()
                if self.state.held and not self.holding():
                    stale = True  # the keys stopped: show the rows that waited
                if stale and now - last_collect >= REDRAW_MIN_S and now - last_draw >= REDRAW_MIN_S:
                    # new rows only right before a redraw: a key acts on what the screen shows
                    self.refresh()
                    last_collect, stale, dirty = now, False, True
                if dirty and now - last_draw >= REDRAW_MIN_S:
                    width, height = _size()
                    painter.paint(screen(self.state, height, width), height, width)
                    last_draw, dirty = now, False
                    clock = clock_words(self.state, height, width)
                if self.changed:
                    stale = True  # (runs to read again: see refresh)
                if self.reader.full_due(now):
                    stale = True  # (every run listed again, now and then: what inotify cannot see)
                wait = REDRAW_MIN_S if (dirty or stale or self.state.held) else TICK_S
                if not stale:  # (woken for the next full listing too)
                    wait = max(0.01, min(wait, self.reader.next_full - now))
                ready, _, _ = select.select([stdin, *self.watch.fds], [], [], wait)
                if stdin in ready:
                    data = os.read(stdin, 1024)
                    if not data:
                        break
                    for key in keys_of(data):
                        self.key(key)
                    dirty = True
                if ready and ready != [stdin]:
                    names, everything = self.watch.drain()
                    self.changed |= names
                    if everything:
                        self.reader.next_full = 0.0
                    stale = stale or everything or bool(names)
                if not ready:  # the clock tick: a redraw when an age shown moved (or the size)
                    width, height = _size()
                    shown = clock_words(self.state, height, width)
                    dirty = dirty or shown is None or shown != clock
        self.watch.close()


def _size() -> tuple[int, int]:
    """The terminal's columns and lines (``COLUMNS``/``LINES`` when set)."""
    import shutil

    columns, lines = shutil.get_terminal_size()
    return columns, lines


def _not_started(call: FleetRow, key: str) -> str:
    """What a key does on the row of a workflow's call that has no run yet: nothing, and why."""
    if key not in ("enter", "s", "x", "i"):
        return HELP
    what = f"{call.key or 'this call'} has not started ({call.state})"
    if key == "enter":
        return f"{what}: no log yet"
    workflow = (call.parent_run_id or "?")[:8]
    return f"{what}: stop its workflow {workflow} or wait"


def _not_steerable(row: Row) -> str | None:
    """Why ``s`` cannot steer ``row``'s run (a live run of an external CLI: its runner has no
    way to pass it a message — :meth:`~pisub.api.client.Run.check_steerable`'s refusal, short
    for an 80-column footer); None when it may be steered."""
    from pisub.api.client import takes_no_messages

    status = row.status
    if status is None or not takes_no_messages(status.runner, status.state):
        return None
    run8 = status.run_id[:8]
    return f"steer {run8}: NOT_STEERABLE — {status.runner} runs take no messages; x stops it"


def _run_id(row: Row | None) -> str:
    return row.fleet.run_id or "" if row is not None else ""


def run_top(home_root: Path | None = None) -> None:
    """Raises: InvalidInput: stdin or stdout is not a terminal."""
    from pisub.api.views import open_home_to_read
    from pisub.errors import InvalidInput

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise InvalidInput("pisub top needs a terminal; for scripts use pisub fleet --json")
    top = Top(open_home_to_read(home_root))  # it only reads: a home that does not exist is not made
    import termios

    try:
        top.run()
    except (OSError, termios.error) as exc:  # (termios.error is no OSError: its args are (errno, text))
        code = exc.errno if isinstance(exc, OSError) else (exc.args[0] if exc.args else None)
        if code not in TERMINAL_GONE:
            raise
        top.watch.close()  # the terminal went away (its window closed, tmux killed): nothing to say


TERMINAL_GONE = (errno.EIO, errno.ENXIO, errno.EBADF, errno.EPIPE, errno.ENOTTY)
