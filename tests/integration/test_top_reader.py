"""``pisub top``'s reader (``pisub.api.views.Statuses``): an ended run is not read again while
its ``status.json`` stays the same file, yet every change is seen and every request written
into a finished run's inbox is still answered."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

import pisub
from pisub.api.views import Statuses
from pisub.core.fsio import atomic_write
from pisub.protocol.codec import encode_pretty
from pisub.protocol.status import RunState, Status
from tests.conftest import AgentMaker
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
