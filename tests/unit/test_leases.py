"""Session leases in one process: exclusivity, proofs of death that read no clock, fencing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pisub.core.fsio import private_mkdir
from pisub.core.locks import try_lock
from pisub.core.procs import start_ticks
from pisub.protocol import encode_pretty
from pisub.store.leases import (
    LeaseHeld,
    StaleLease,
    acquire,
    break_lease,
    fenced,
    lease_key,
    lease_paths,
    proven_dead,
    reclaim_if_dead,
    release,
    unleased,
)

RUN_A = "a" * 8 + "-0000-4000-8000-" + "a" * 12
RUN_B = "b" * 8 + "-0000-4000-8000-" + "b" * 12


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "runs").mkdir()
    return tmp_path


def _session(home: Path) -> Path:
    session = home / "runs" / RUN_A / "session.jsonl"
    session.parent.mkdir(parents=True, exist_ok=True)
    session.write_text("")
    return session


def test_one_owner_at_a_time_and_the_generation_always_grows(home: Path) -> None:
    leases, session = home / "leases", _session(home)
    first = acquire(leases, session, RUN_B, RUN_A)
    assert first.generation == 1 and first.pid_start_ticks == start_ticks(os.getpid())
    with pytest.raises(LeaseHeld, match=RUN_B):
        acquire(leases, session, RUN_A, None)
    assert release(leases, first)
    second = acquire(leases, session, RUN_A, None)
    assert second.generation == 2
    assert not release(leases, first), "an old owner's token releases nothing"


def test_a_dead_owner_is_reclaimed_by_its_start_ticks(home: Path) -> None:
    leases, session = home / "leases", _session(home)
    owner = acquire(leases, session, RUN_B, None)
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    owner.pid = int(child.stdout)  # an exited process: proven dead
    owner.pid_start_ticks = 1
    lp = lease_paths(leases, session)
    lp.owner.write_bytes(encode_pretty(owner))
    assert proven_dead(owner, leases)
    assert reclaim_if_dead(leases, session, RUN_B)
    assert not lp.owner.exists()


def test_a_live_owner_is_never_reclaimed_whatever_its_recorded_times_say(home: Path) -> None:
    """Wall-clock start times move with the clock: a live owner is alive by its start ticks, and
    while its run's runner.lock is held it is alive even if the ticks do not match."""
    leases, session = home / "leases", _session(home)
    owner = acquire(leases, session, RUN_B, None)
    owner.pid_start_time = 1.0  # as if the clock had been stepped since
    assert not proven_dead(owner, leases)
    owner.pid_start_ticks = -1  # even a mismatch is not proof while the run's lock is held
    run_dir = home / "runs" / RUN_B
    run_dir.mkdir()
    fd = try_lock(run_dir / "runner.lock")
    assert fd is not None
    try:
        owner.pid = 999_999_999
        assert not proven_dead(owner, leases)
    finally:
        os.close(fd)
    assert proven_dead(owner, leases)


def test_unreadable_records_fail_closed(home: Path) -> None:
    leases, session = home / "leases", _session(home)
    private_mkdir(leases)
    lp = lease_paths(leases, session)
    os.mkfifo(lp.owner)  # neither readable nor a lease: it must not count as free (nor hang)
    with pytest.raises(LeaseHeld, match="unreadable"):
        acquire(leases, session, RUN_A, None)
    lp.owner.unlink()
    lp.generation.write_text("not a number")
    with pytest.raises(LeaseHeld, match="generation"):
        acquire(leases, session, RUN_A, None)


def test_writes_are_fenced_off_once_the_lease_is_broken(home: Path) -> None:
    leases, session = home / "leases", _session(home)
    owner = acquire(leases, session, RUN_B, None)
    with fenced(leases, owner):
        pass
    with pytest.raises(LeaseHeld), unleased(leases, session):
        pass
    break_lease(leases, lease_paths(leases, session).owner)
    with pytest.raises(StaleLease), fenced(leases, owner):
        pass
    with unleased(leases, session) as generation:
        assert generation == 1


def test_a_session_file_with_an_undecodable_name_has_a_lease_key() -> None:
    assert lease_key("/tmp/s.jsonl") != lease_key(os.fsdecode(b"/tmp/s-\xff.jsonl"))
