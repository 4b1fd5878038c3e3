"""Groups with a parallel limit and a queue, as ``pisub group`` manages them (``spec/queue.md``).

>>> pisub.group_add("gpu", limit=2)                             # doctest: +SKIP
>>> pisub.launch("coder", "fix it", group="gpu", priority=5)    # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pisub.errors import InvalidInput, PisubError
from pisub.protocol.queue import DEFAULT_GROUP, GroupConfig, check_group_name, check_limit
from pisub.runs.queue import GroupView as GroupView  # (what the CLI shows)
from pisub.runs.queue import Verdict, holder_verdict, promote, view
from pisub.store import groups
from pisub.store.paths import Home, open_home, open_home_to_read

if TYPE_CHECKING:
    from pisub.api.client import Run


def _config(home: Home, name: str) -> GroupConfig | None:
    """The group's settings (a ``group.json`` that cannot be read: None, it is rewritten)."""
    try:
        return groups.load_config(home, name)
    except PisubError:
        return None


def group_add(name: str, *, limit: int | None = None, home: Path | None = None) -> GroupView:
    """Create group ``name`` (``limit``: runs at once; None: no limit).

    Raises:
        InvalidInput: a bad name or limit, or the group exists.
    """
    check_group_name(name, "name")
    if limit is not None:
        check_limit(limit, "limit")
    h = open_home(home)
    with groups.locked(h, name, create=True) as directory:
        if groups.exists(h, name):
            raise InvalidInput(f"group {name!r} exists; change its limit: pisub group set-limit {name} N")
        groups.save_config(directory, GroupConfig(v=1, name=name, limit=limit))
    return view(h, name)


def group_set_limit(name: str, limit: int, *, home: Path | None = None) -> GroupView:
    """Set group ``name``'s parallel limit (a raised limit admits the next runs at once).

    Raises:
        InvalidInput: a bad name or limit; no such group (``default`` is created).
    """
    check_group_name(name, "name")
    check_limit(limit, "limit")
    return _change(name, home, lambda c: GroupConfig(v=1, name=name, limit=limit, paused=c.paused))


def group_pause(name: str, *, home: Path | None = None) -> GroupView:
    """Admit no run of group ``name`` until :func:`group_resume` (admitted runs go on)."""
    check_group_name(name, "name")
    return _change(name, home, lambda c: GroupConfig(v=1, name=name, limit=c.limit, paused=True))


def group_resume(name: str, *, home: Path | None = None) -> GroupView:
    """Admit runs of group ``name`` again (at once, as many as its free slots)."""
    check_group_name(name, "name")
    return _change(name, home, lambda c: GroupConfig(v=1, name=name, limit=c.limit, paused=False))


def _change(name: str, home: Path | None, change: object) -> GroupView:
    h = open_home(home)
    if name != DEFAULT_GROUP and not groups.dir_exists(h, name):
        raise InvalidInput(f"no group {name!r}; create it: pisub group add {name} --limit N")
    with groups.locked(h, name, create=name == DEFAULT_GROUP) as directory:
        current = _config(h, name) or GroupConfig(v=1, name=name)
        assert callable(change)
        groups.save_config(directory, change(current))
    promote(h, name)
    return view(h, name)


def group_list(*, home: Path | None = None) -> list[GroupView]:
    """Every group (``default`` first, then by name): its limit, runs holding a slot, runs
    waiting, whether it is paused."""
    h = open_home_to_read(home)  # (no home: only the default group, empty)
    names = set(groups.list_groups(h)) | {DEFAULT_GROUP}
    ordered = [DEFAULT_GROUP, *sorted(names - {DEFAULT_GROUP})]
    return [view(h, name) for name in ordered]


def group_rm(name: str, *, home: Path | None = None) -> None:
    """Remove group ``name`` (refused while a run waits or runs in it; ``default`` goes back to
    no limit).

    Raises:
        InvalidInput: a bad name, no such group, runs in it.
    """
    check_group_name(name, "name")
    h = open_home(home)
    with groups.locked(h, name) as directory:
        if not groups.exists(h, name):
            raise InvalidInput(f"no group {name!r}")
        live = [e for e in groups.entries(directory) if holder_verdict(h, directory, e) is not Verdict.GONE]
        if live:
            shown = ", ".join(e.run_id[:8] for e in live[:5])
            raise InvalidInput(
                f"group {name!r} has {len(live)} run(s) waiting or running ({shown}); "
                "stop them (pisub stop RUN) or let them end first"
            )
        for entry in groups.entries(directory):
            groups.remove(directory, entry)
        for leftover in (groups.CONFIG, groups.UNCONFIGURED):
            with contextlib.suppress(OSError):
                os.unlink(directory / leftover)
    with contextlib.suppress(OSError):  # the lock file last (best effort: a racing launch re-creates it)
        os.unlink(directory / groups.LOCK)
        os.rmdir(directory)


def queue_place(run: Run) -> tuple[int, int] | None:
    """A queued run's place in its group's queue (1-based) and how many wait there; None when
    it does not wait in a group."""
    from pisub.runs.queue import position

    group = run.status().group
    return position(run.home, group, run.id) if group is not None else None
