"""``pisub top``'s reader (``pisub.api.views.Statuses``): an ended run is not read again while
its ``status.json`` stays the same file, yet every change is seen and every request written
into a finished run's inbox is still answered; between two listings of every run a refresh
reads only the runs inotify named (``pisub.cli.top_reader``)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

import pisub
from pisub.api.views import Statuses, open_home
from pisub.cli.top import Top
from pisub.cli.top_reader import FULL_MIN_S, POLL_MIN_S
from pisub.core.fsio import atomic_write
from pisub.protocol.codec import encode_pretty
from pisub.protocol.status import RunState, Status
from tests.conftest import AgentMaker, wait_for
from tests.helpers import drop_request


def _status_file(run: pisub.Run) -> Path:
    return run.dir / "status.json"


def test_an_ended_run_is_read_once_and_its_changes_are_seen(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    statuses = Statuses(home)
    first = {st.run_id: st for st in statuses()}
    assert first[run.id].state == RunState.COMPLETE
    assert run.id in statuses.seen
    again = {st.run_id: st for st in statuses()}
    assert again[run.id] is first[run.id]  # the same file: not read again

    # a status replaced (atomically, a new inode) is read again
    changed = msgspec.json.decode(_status_file(run).read_bytes(), type=Status)
    changed.label = "renamed"
    atomic_write(_status_file(run), encode_pretty(changed))
    assert {st.run_id: st for st in statuses()}[run.id].label == "renamed"

    # a status rewritten in place (same inode, another size) is read again
    with open(_status_file(run), "r+b") as fh:
        data = fh.read().replace(b'"renamed"', b'"renamed-again"')
        fh.seek(0)
        fh.write(data)
    assert {st.run_id: st for st in statuses()}[run.id].label == "renamed-again"

    # a run removed is forgotten; a broken status is a problem, not a stale row
    problems: list[str] = []
    _status_file(run).write_bytes(b"{")
    assert run.id not in {st.run_id for st in statuses(problems)}
    assert problems and run.id in problems[0]
    os.unlink(_status_file(run))
    assert run.id not in {st.run_id for st in statuses()}


def test_a_request_into_a_finished_run_is_answered_by_a_reader_that_read_it_before(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    statuses = Statuses(home)
    statuses()
    assert run.id in statuses.seen
    drop_request(run, "by-hand.json", b'{"v":1,"type":"follow_up","message":"late"}')
    assert {st.run_id: st for st in statuses()}[run.id].state == RunState.COMPLETE
    receipt = run.receipt("by-hand")
    assert receipt is not None and receipt.state == "failed"
    assert receipt.reason == "the run finished before the request was consumed"


def _refreshed(top: Top, done: Callable[[], bool], what: str) -> None:
    """Refresh ``top`` as its loop does (the runs inotify named) until ``done()``."""

    def check() -> bool:
        names, everything = top.watch.drain()
        top.changed |= names
        if everything:
            top.reader.next_full = 0.0
        top.refresh()
        return done()

    wait_for(check, timeout=30, what=what)


def _ids(top: Top) -> dict[str, str]:
    return {row.fleet.run_id: row.fleet.state for row in top.state.rows if row.fleet.run_id}


def test_a_refresh_reads_only_the_runs_inotify_named(home: Path, make_agent: AgentMaker) -> None:
    """After the first listing, a run that starts, one that ends and one removed are each read
    (or forgotten) alone — no listing of every run — and an entry of ``runs/`` that is no run
    brings the full listing back, which names it."""
    make_agent("quick", python="print('done')")
    make_agent("sleeper", python="import sys, time\nsys.stdin.read()\ntime.sleep(600)\n")
    old = pisub.launch("quick", "x")
    old.wait(timeout=30)
    top = Top(open_home(home))
    listings: list[int] = []
    read_all = top.reader.read_all

    def counted() -> None:
        listings.append(1)
        read_all()

    top.reader.read_all = counted  # type: ignore[method-assign]
    try:
        top.refresh()
        assert listings == [1] and _ids(top) == {old.id: "complete"}
        live = pisub.launch("sleeper", "y")
        _refreshed(top, lambda: _ids(top).get(live.id) == "running", "the new run, running")
        shape = top.reader.shape
        live.stop()
        _refreshed(top, lambda: _ids(top).get(live.id) == "stopped", "the run, stopped")
        assert top.reader.shape == shape  # a state changed: the rows' order is kept, not rebuilt
        shutil.rmtree(old.dir)
        _refreshed(top, lambda: old.id not in _ids(top), "the removed run, gone")
        assert top.reader.shape > shape
        assert listings == [1], "a refresh listed every run"
        stray = str(uuid.uuid4())
        (home / "runs" / stray).write_bytes(b"")  # a file named as a run
        _refreshed(top, lambda: any(stray in p for p in top.state.problems), "the stray named")
        (home / "runs" / "not-a-run").write_bytes(b"")  # (ignored, as a listing ignores it)
        (home / "runs" / stray).unlink()
        _refreshed(top, lambda: not top.state.problems, "the stray gone")
        assert listings == [1], "a refresh listed every run"
        assert top.reader.next_full - time.monotonic() > FULL_MIN_S - 5  # the next one much later
        top.reader.next_full = 0.0  # due: every run listed again
        top.refresh()
        assert len(listings) == 2 and set(_ids(top)) == {live.id}
    finally:
        top.watch.close()


def test_a_live_run_beyond_the_screen_is_followed(home: Path, make_agent: AgentMaker) -> None:
    """Every live run's directory is watched, not only the first rows', and read again once
    watched."""
    make_agent("sleeper", python="import sys, time\nsys.stdin.read()\ntime.sleep(600)\n")
    live = pisub.launch("sleeper", "y")
    wait_for(lambda: live.status().state == "running", timeout=30)
    top = Top(open_home(home))
    try:
        top.refresh()
        # read before its directory was watched: read again at the next refresh (a change in
        # between would have been missed)
        assert top.changed == {live.id}
        top.refresh()
        assert not top.changed
        top.state.rows = top.state.rows[:0]  # (as if far below the screen)
        assert live.id in top._followed()
    finally:
        top.watch.close()
        live.stop()


def test_the_last_output_line_follows_the_run(home: Path, make_agent: AgentMaker) -> None:
    """A row's last output line is kept between refreshes only while the run's directory did
    not change: a line the run writes later is shown."""
    script = "import sys, time\nsys.stdin.read()\nprint('first', flush=True)\ntime.sleep(1)\n"
    make_agent("talker", python=script + "print('second', flush=True)\ntime.sleep(600)\n")
    live = pisub.launch("talker", "y")
    top = Top(open_home(home))
    try:
        top.refresh()

        def spark() -> str:
            return next((row.spark for row in top.state.rows if row.fleet.run_id == live.id), "")

        _refreshed(top, lambda: spark() == "first", "the first line")
        _refreshed(top, lambda: spark() == "second", "the second line")
    finally:
        top.watch.close()
        live.stop()


def test_without_inotify_every_run_is_listed_every_few_seconds(
    home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-user limit of inotify instances reached (EMFILE): top still starts, says so,
    and lists every run again every few seconds instead of waiting for events."""
    import errno

    import inotify_simple

    def refused() -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(inotify_simple, "INotify", refused)
    make_agent("quick", python="print('done')")
    top = Top(open_home(home))
    assert top.watch.fds == [] and top.state.message.startswith("no inotify (Too many open files)")
    top.refresh()
    assert top.reader.next_full - time.monotonic() <= POLL_MIN_S + 1
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    assert top.watch.drain() == (set(), False)
    top.reader.next_full = 0.0  # (due: as the loop finds it every few seconds)
    top.refresh()
    assert _ids(top) == {run.id: "complete"}
    top.watch.close()
