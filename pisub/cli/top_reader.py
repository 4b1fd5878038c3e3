"""What ``pisub top`` knows of the runs between refreshes: every run's status, kept; a refresh
reads again only the runs inotify named (a run directory that appeared in or left ``runs/``, a
watched run's directory that changed), and the whole of ``runs/`` — every run's status, as
``pisub list`` reads them, each ended run's inbox checked and late requests answered — at the
start and then at most every :data:`FULL_EVERY` times what one such listing cost, at least
every :data:`FULL_MIN_S`.

Listing 10,000 runs costs ~0.2 CPU-seconds (three ``stat`` calls a run); a refresh after one
new run costs one run's read."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable

from pisub.api.views import Home, Statuses
from pisub.errors import PisubError, RunNotFound
from pisub.protocol.status import Status

FULL_MIN_S = 15.0
"""The whole of ``runs/`` is listed again at least this long after the last listing..."""
FULL_EVERY = 300
"""...and this many times what the last listing took (at most ~0.3 % of a core on listings)."""
POLL_MIN_S = 2.0
"""Without inotify (its per-user limit of instances reached), every run is listed again at
least this long after the last listing..."""
POLL_EVERY = 20
"""...and this many times what the last one took (at most ~5 % of a core)."""
RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Reader:
    """Every run's status (after crash repair) and the runs that could not be read."""

    def __init__(self, home: Home, *, polling: bool = False) -> None:
        self.home = home
        self.polling = polling
        """No inotify: listing every run is the only way to see a change."""
        self.statuses = Statuses(home.root)
        self.known: dict[str, Status] = {}
        self.live: set[str] = set()
        """The runs of :attr:`known` not ended."""
        self.unreadable: dict[str, str] = {}
        """Run (or stray entry of ``runs/``) → the line that says why it could not be read."""
        self.next_full = 0.0
        self.shape = 0
        """Changed whenever a run appeared or left, or a run's parent, key or start time changed
        (what the order of the rows depends on)."""

    def full_due(self, now: float | None = None) -> bool:
        """Whether the whole of ``runs/`` is to be listed again."""
        return (time.monotonic() if now is None else now) >= self.next_full

    def read_all(self) -> None:
        """List every run again (ended runs not read again while their ``status.json`` stays the
        same file; their inboxes checked)."""
        start = time.monotonic()
        problems: list[str] = []
        statuses = self.statuses(problems)
        self.known = {st.run_id: st for st in statuses}
        self.live = {st.run_id for st in statuses if not st.state.is_terminal}
        self.shape += 1
        self.unreadable = {line.split(":", 1)[0]: line for line in problems}
        took = time.monotonic() - start
        least, every = (POLL_MIN_S, POLL_EVERY) if self.polling else (FULL_MIN_S, FULL_EVERY)
        self.next_full = time.monotonic() + max(least, every * took)

    def read(self, names: Iterable[str]) -> None:
        """Read runs ``names`` again (entries of ``runs/``, as a listing names them): a run gone
        is forgotten, one that cannot be read (a symlink or file in its place too) is named."""
        from pisub.api.client import Run

        for name in names:
            if not RUN_ID.fullmatch(name):  # (not a run: ``.creating-<id>``, a listing ignores it)
                continue
            self.unreadable.pop(name, None)
            self.live.discard(name)
            before = _shape(self.known.get(name))
            try:
                status = self.known[name] = Run(name, home=self.home.root).status()
                if not status.state.is_terminal:
                    self.live.add(name)
            except RunNotFound:
                self.known.pop(name, None)
                entry = self.home.runs / name
                if os.path.islink(entry) or (os.path.lexists(entry) and not os.path.isdir(entry)):
                    self.unreadable[name] = f"{name}: not a run directory (a symlink or file in runs/)"
                elif os.path.isdir(entry):
                    self.unreadable[name] = f"{name}: it has no status.json"
            except (PisubError, OSError) as exc:
                self.known.pop(name, None)
                self.unreadable[name] = f"{name}: {exc}"
            if _shape(self.known.get(name)) != before:
                self.shape += 1

    @property
    def problems(self) -> list[str]:
        """The lines about the runs that could not be read."""
        return list(self.unreadable.values())


def _shape(status: Status | None) -> tuple[str | None, ...] | None:
    """What of a run the order of the rows depends on (None: no such run)."""
    if status is None:
        return None
    return (status.parent_run_id, status.key, status.started_at)
