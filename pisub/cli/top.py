"""``pisub top``: a full-screen live table of runs (a workflow's children under it), redrawn when
inotify says the runs directory or a shown run changed — no busy polling; a clock tick a second
keeps the ages right. Keys: arrows or j/k select, enter opens the run's live log (q or esc
back), s steers (a prompt line; the receipt is shown), i interrupts, x stops (after a y/n
confirmation), q quits. Runs that appear, end, are removed, or cannot be read are shown as
they are; nothing of that ends the view.

Every string shown goes through :func:`_text` — the one terminal filter
(:func:`pisub.termsafe.printable`), then a rich ``Text`` (never a str cell, which rich would
read as markup: ``[link=...]`` in a tool name would become an OSC 8 hyperlink)."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import select
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pisub.api.views import FleetRow, Home, fleet_of, last_line, transcript
from pisub.errors import PisubError
from pisub.protocol.status import Status

MAX_ROWS = 300
REDRAW_MIN_S = 0.2
TICK_S = 1.0
CELL_CHARS = 60


@dataclass
class Row:
    fleet: FleetRow
    depth: int
    spark: str = ""


@dataclass
class TopState:
    rows: list[Row] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    selected: int = 0
    mode: str = "table"
    """``table``, ``log``, ``steer`` (typing a message) or ``confirm`` (stopping)."""
    typed: str = ""
    message: str = "arrows/j/k select · enter log · s steer · i interrupt · x stop · q quit"
    log: list[str] = field(default_factory=list)

    @property
    def current(self) -> Row | None:
        return self.rows[self.selected] if 0 <= self.selected < len(self.rows) else None


def collect(home: Home) -> tuple[list[Row], list[str]]:
    """Every run as a row — live ones first, then the newest ended ones — with a workflow's
    children (and queued calls) right under it; the runs that could not be read."""
    from pisub.api.client import list_runs

    problems: list[str] = []
    statuses = list(list_runs(home=home.root, children=True, problems=problems))
    known = {st.run_id for st in statuses}
    by_parent: dict[str | None, list[Status]] = {}
    for st in statuses:  # a child whose parent is gone (gc) is shown at the top level
        parent = st.parent_run_id if st.parent_run_id in known else None
        by_parent.setdefault(parent, []).append(st)
    tops = sorted(by_parent.get(None, []), key=lambda s: (s.state.is_terminal, _negated(s.started_at or "")))
    rows: list[Row] = []

    def add(status: Status, depth: int) -> None:
        if len(rows) >= MAX_ROWS:
            return
        own = fleet_of([status], live_only=False)
        rows.append(Row(own[0], depth, last_line(home, status)))
        rows.extend(Row(queued, depth + 1) for queued in own[1:])
        for child in sorted(by_parent.get(status.run_id, []), key=lambda s: s.started_at or ""):
            add(child, depth + 1)

    for status in tops:
        add(status, 0)
    return rows, problems


def _negated(stamp: str) -> str:
    return "".join(chr(0x10FFFF - ord(c)) for c in stamp)


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


def _text(text: str, style: str = "", *, lines: bool = False, limit: int | None = None) -> Any:
    """``text`` as rich ``Text`` that reaches the terminal as shown: control characters, escape
    sequences, bidi controls and undecodable bytes escaped, rich markup taken literally; at most
    ``limit`` characters once escaped (a cell of escapes must not squeeze the others away)."""
    from rich.text import Text

    from pisub.termsafe import printable

    return Text(printable(text, one_line=not lines)[:limit], style=style)


def render(state: TopState, height: int) -> Any:
    """The screen: the table (or the selected run's log) and a status line."""
    from rich.console import Group
    from rich.table import Table

    footer = _text(state.message, "bold")
    if state.mode == "steer":
        footer = _text(f"steer {_short(state.current)}> {state.typed}", "bold yellow")
    elif state.mode == "confirm":
        footer = _text(f"stop {_short(state.current)}? y/n", "bold red")
    if state.mode == "log":
        lines = state.log[-max(1, height - 3) :]
        body = "\n".join(_text(line).plain for line in lines)
        return Group(
            _text(f"log of {_short(state.current)} (q back)", "bold"), _text(body, lines=True), footer
        )
    table = Table(expand=True, box=None, header_style="bold")
    for column in ("run", "agent", "state", "age", "turns", "tools", "tool", "active", "steers"):
        table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=len(column))
    # the output takes the room the others leave: a reply streaming into one long line must not
    # squeeze the other columns away
    table.add_column("output", no_wrap=True, overflow="ellipsis", ratio=1)
    first = max(0, state.selected - (height - 6))
    for index, row in enumerate(state.rows[first : first + max(1, height - 5)], start=first):
        f = row.fleet
        name = (
            ("  " * row.depth) + (f.run_id[:8] if f.run_id else "(queued)") + (f" {f.key}" if f.key else "")
        )
        style = "reverse" if index == state.selected else ""
        steers = f"{f.steers_delivered}/{f.steers_requested}" + (
            f" !{f.steers_failed}" if f.steers_failed else ""
        )
        cells = (
            name,
            f.agent,
            f.state,
            _age(f.started_at),
            str(f.turns),
            str(f.tools),
            f.current_tool or "",
            _age(f.last_activity_at),
            steers,
            row.spark,
        )
        table.add_row(*(_text(cell, limit=CELL_CHARS) for cell in cells), style=style)
    parts: list[Any] = [table]
    if not state.rows:
        parts.append(_text("no runs yet (pisub run ...)"))
    room = max(3, height - 6 - min(len(state.rows), max(1, height - 5)))
    shown = state.problems if len(state.problems) <= room else state.problems[: room - 1]
    parts += [_text(f"unreadable run {p}", "red") for p in shown]
    if len(shown) < len(state.problems):
        more = len(state.problems) - len(shown)
        parts.append(_text(f"... and {more} more unreadable runs (pisub list names them all)", "red"))
    return Group(*parts, footer)


def _short(row: Row | None) -> str:
    if row is None or row.fleet.run_id is None:
        return "-"
    return row.fleet.run_id[:8]


class Watch:
    """inotify on the runs directory and on each shown run's directory."""

    def __init__(self, home: Home) -> None:
        from inotify_simple import INotify, flags

        self.inotify = INotify()
        self.flags = flags
        self.mask = (
            flags.CREATE | flags.DELETE | flags.MOVED_TO | flags.MOVED_FROM | flags.MODIFY | flags.CLOSE_WRITE
        )
        self.watched: dict[str, int] = {}
        with contextlib.suppress(OSError):
            self.inotify.add_watch(os.fspath(home.runs), self.mask)

    @property
    def fd(self) -> int:
        return int(self.inotify.fileno())

    def follow(self, home: Home, run_ids: list[str]) -> None:
        wanted = set(run_ids)
        for run_id in list(self.watched):
            if run_id not in wanted:
                with contextlib.suppress(OSError):
                    self.inotify.rm_watch(self.watched.pop(run_id))
        for run_id in wanted - set(self.watched):
            with contextlib.suppress(OSError):
                self.watched[run_id] = self.inotify.add_watch(os.fspath(home.run(run_id).root), self.mask)

    def drain(self) -> bool:
        return bool(self.inotify.read(timeout=0))

    def close(self) -> None:
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
    """The view's loop: keys and inotify events in, a redraw out (at most every 0.2 s)."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.state = TopState()
        self.watch = Watch(home)
        self.done = False

    def refresh(self) -> None:
        chosen = self.state.current.fleet.run_id if self.state.current is not None else None
        self.state.rows, self.state.problems = collect(self.home)
        ids = [r.fleet.run_id for r in self.state.rows]
        if chosen in ids:
            self.state.selected = ids.index(chosen)
        self.state.selected = min(self.state.selected, max(0, len(self.state.rows) - 1))
        self.watch.follow(self.home, [i for i in ids[:64] if i is not None])
        if self.state.mode == "log":
            self._load_log()

    def _load_log(self) -> None:
        row = self.state.current
        if row is None or row.fleet.run_id is None:
            self.state.log = []
            return
        try:
            self.state.log = transcript(self.home, 500, run_id=row.fleet.run_id)
        except (OSError, PisubError) as exc:
            self.state.log = [f"cannot read the log: {exc}"]

    def key(self, key: str) -> None:
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
        elif key == "enter" and st.current is not None and st.current.fleet.run_id:
            st.mode = "log"
            self._load_log()
        elif key == "s" and st.current is not None and st.current.fleet.run_id:
            st.mode, st.typed = "steer", ""
        elif key == "i" and st.current is not None and st.current.fleet.run_id:
            self._control("interrupt", st.current.fleet.run_id)
        elif key == "x" and st.current is not None and st.current.fleet.run_id:
            st.mode = "confirm"

    def _log_key(self, key: str) -> None:
        if key in ("q", "esc", "enter"):
            self.state.mode = "table"

    def _steer_key(self, key: str) -> None:
        st = self.state
        if key == "esc":
            st.mode = "table"
        elif key == "enter":
            st.mode = "table"
            if st.typed.strip() and st.current is not None and st.current.fleet.run_id:
                self._control("steer", st.current.fleet.run_id, st.typed)
        elif key in ("\x7f", "\x08"):
            st.typed = st.typed[:-1]
        elif len(key) == 1 and key.isprintable():
            st.typed += key

    def _confirm_key(self, key: str) -> None:
        st = self.state
        st.mode = "table"
        if key in ("y", "Y") and st.current is not None and st.current.fleet.run_id:
            self._control("stop", st.current.fleet.run_id)
        else:
            st.message = "not stopped"

    def _control(self, what: str, run_id: str, message: str = "") -> None:
        from pisub.api.client import Run

        try:
            run = Run(run_id, home=self.home.root)
            if what == "steer":
                rid = run.send_steer(message, source="pisub top")
            elif what == "interrupt":
                rid = run.send_interrupt(source="pisub top")
            else:
                rid = run.send_stop(source="pisub top")
            receipt = run.wait_for_receipt(rid, timeout=3)
        except PisubError as exc:
            self.state.message = f"{what} {run_id[:8]}: {exc.message} [{exc.code}]"
            return
        state = receipt.state if receipt is not None else "pending"
        why = f": {receipt.reason}" if receipt is not None and receipt.reason else ""
        self.state.message = f"{what} {run_id[:8]}: {state}{why}"

    def run(self) -> None:
        from rich.console import Console
        from rich.live import Live

        console = Console()
        stdin = sys.stdin.fileno()
        self.refresh()
        last_draw = last_collect = 0.0
        dirty, stale = True, False
        with raw_terminal(stdin), Live(console=console, screen=True, auto_refresh=False) as live:
            while not self.done:
                now = time.monotonic()
                if stale and now - last_collect >= REDRAW_MIN_S:  # what changed, at most 5 times a second
                    self.refresh()
                    last_collect, stale, dirty = now, False, True
                if dirty and now - last_draw >= REDRAW_MIN_S:
                    live.update(render(self.state, console.size.height), refresh=True)
                    last_draw, dirty = now, False
                wait = REDRAW_MIN_S if (dirty or stale) else TICK_S
                ready, _, _ = select.select([stdin, self.watch.fd], [], [], wait)
                if stdin in ready:
                    data = os.read(stdin, 1024)
                    if not data:
                        break
                    for key in keys_of(data):
                        self.key(key)
                    dirty = True
                if self.watch.fd in ready and self.watch.drain():
                    stale = True
                if not ready:
                    dirty = True  # the clock tick: ages move
        self.watch.close()


def run_top(home_root: Path | None = None) -> None:
    """Raises: InvalidInput: stdin or stdout is not a terminal."""
    from pisub.api.views import open_home
    from pisub.errors import InvalidInput

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise InvalidInput("pisub top needs a terminal; for scripts use pisub fleet --json")
    top = Top(open_home(home_root))
    import termios

    try:
        top.run()
    except (OSError, termios.error) as exc:  # (termios.error is no OSError: its args are (errno, text))
        code = exc.errno if isinstance(exc, OSError) else (exc.args[0] if exc.args else None)
        if code not in TERMINAL_GONE:
            raise
        top.watch.close()  # the terminal went away (its window closed, tmux killed): nothing to say


TERMINAL_GONE = (errno.EIO, errno.ENXIO, errno.EBADF, errno.EPIPE, errno.ENOTTY)
