"""The fence a runner's writes pass: checked before a write starts and again right before its
rename, so that a runner paused in the middle of a write (its fsync) cannot land it after waking."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pisub.protocol import RunState, Status, now_iso
from pisub.store import fencing
from pisub.store.paths import RunPaths
from pisub.store.runs import load_status, write_status


class Fenced(Exception):
    pass


@pytest.fixture(autouse=True)
def no_gate() -> Iterator[None]:
    yield
    fencing.install(None)


def _status(paths: RunPaths, state: RunState) -> Status:
    at = now_iso()
    return Status(
        v=1,
        run_id=paths.run_id,
        state=state,
        agent="a",
        runner="x",
        host="h",
        started_at=at,
        updated_at=at,
    )


def test_a_lease_lost_during_the_write_stops_its_rename(bare_run: RunPaths) -> None:
    write_status(bare_run, _status(bare_run, RunState.RUNNING))
    checks: list[int] = []

    def gate() -> None:
        checks.append(1)
        if len(checks) == 2:  # the lease lapsed while the file was being written and synced
            raise Fenced

    fencing.install(gate)
    with pytest.raises(Fenced):
        write_status(bare_run, _status(bare_run, RunState.FAILED))
    assert load_status(bare_run).state == RunState.RUNNING
    assert sorted(p.name for p in bare_run.root.iterdir() if p.name.startswith(".")) == []  # no temp left
