"""Session leases across real processes: exclusivity, proven-dead reclaim, fail-closed, fencing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pisub.protocol import encode_pretty
from pisub.store.leases import (
    LeaseHeld,
    StaleLease,
    acquire,
    break_lease,
    fenced,
    lease_paths,
    read_owner,
    release,
)
from tests.conftest import wait_for

WORKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from pisub.store.leases import LeaseHeld, acquire
    leases, go_dir, name, rounds = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    print("ready", flush=True)
    for r in range(rounds):
        go = go_dir / f"go-{r}"
        while not go.exists():
            time.sleep(0.001)
        try:
            acquire(leases, go_dir / f"session-{r}.jsonl", f"{name}-{r}", None)
            print(f"won {r}", flush=True)
        except LeaseHeld:
            print(f"lost {r}", flush=True)
    # Winners stay alive (holding their leases) until every worker is done: a lease of an
    # exited worker would rightly be reclaimed by a slower one.
    while not (go_dir / "done").exists():
        time.sleep(0.005)
""")

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pisub.store.leases import acquire
    owner = acquire(Path(sys.argv[1]), Path(sys.argv[2]), "holder", None)
    print(owner.generation, flush=True)
    time.sleep(300)
""")


def _race(tmp_path: Path, processes: int, rounds: int) -> None:
    leases = tmp_path / "leases"
    go_dir = tmp_path / "go"
    go_dir.mkdir()
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(leases), str(go_dir), f"w{n}", str(rounds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    for worker in workers:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
    for r in range(rounds):
        (go_dir / f"go-{r}").touch()
    outcomes = []
    for worker in workers:
        assert worker.stdout is not None
        outcomes.append([worker.stdout.readline().strip() for _ in range(rounds)])
    (go_dir / "done").touch()
    for worker in workers:
        worker.communicate(timeout=60)
    for r in range(rounds):
        winners = sum(f"won {r}" in lines for lines in outcomes)
        losers = sum(f"lost {r}" in lines for lines in outcomes)
        assert (winners, losers) == (1, processes - 1), f"round {r}: {winners} winners"


@pytest.mark.parametrize("processes", [2, 20])
def test_exactly_one_of_many_simultaneous_acquirers_wins(tmp_path: Path, processes: int) -> None:
    _race(tmp_path, processes, rounds=50)


def _holder(leases: Path, session: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(leases), str(session)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip().isdigit()
    return proc


def test_live_owner_is_never_broken(tmp_path: Path) -> None:
    leases, session = tmp_path / "leases", tmp_path / "s.jsonl"
    holder = _holder(leases, session)
    try:
        with pytest.raises(LeaseHeld, match=rf"run holder \(pid {holder.pid} on "):
            acquire(leases, session, "me", None)
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_sigkilled_owner_is_reclaimed(tmp_path: Path, reap: bool) -> None:
    leases, session = tmp_path / "leases", tmp_path / "s.jsonl"
    holder = _holder(leases, session)
    os.kill(holder.pid, signal.SIGKILL)
    if reap:
        holder.wait()
    else:  # not reaped: the owner is a zombie, which is dead
        wait_for(lambda: Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
    owner = acquire(leases, session, "me", None)
    assert owner.generation == 2 and owner.run_id == "me"
    holder.wait()
    assert holder.stdout is not None
    holder.stdout.close()


def _forge(leases: Path, session: Path, **changes: object) -> None:
    owner = acquire(leases, session, "forged", None)
    for key, value in changes.items():
        setattr(owner, key, value)
    lp = lease_paths(leases, session)
    lp.owner.write_bytes(encode_pretty(owner))


def test_forged_owner_with_reused_pid_is_reclaimed(tmp_path: Path) -> None:
    leases, session = tmp_path / "leases", tmp_path / "s.jsonl"
    unrelated = subprocess.Popen(["sleep", "30"])
    try:
        _forge(leases, session, pid=unrelated.pid, pid_start_time=time.time() - 10_000)
        assert acquire(leases, session, "me", None).run_id == "me"
    finally:
        unrelated.kill()
        unrelated.wait()


@pytest.mark.parametrize(
    "changes",
    [{"host": "elsewhere"}, {"boot_id": "00000000-0000-0000-0000-000000000000"}],
    ids=["other-host", "other-boot"],
)
def test_owner_from_another_host_or_boot_is_not_reclaimed(tmp_path: Path, changes: dict[str, object]) -> None:
    leases, session = tmp_path / "leases", tmp_path / "s.jsonl"
    _forge(leases, session, pid=999_999_999, **changes)
    with pytest.raises(LeaseHeld):
        acquire(leases, session, "me", None)


def test_unreadable_owner_fails_closed_and_can_be_broken(tmp_path: Path) -> None:
    leases, session = tmp_path / "leases", tmp_path / "s.jsonl"
    acquire(leases, session, "first", None)
    lp = lease_paths(leases, session)
    lp.owner.write_text("{ not json")
    with pytest.raises(LeaseHeld, match="unreadable"):
        acquire(leases, session, "me", None)
    break_lease(leases, lp.owner)
    assert acquire(leases, session, "me", None).generation == 2


def test_release_needs_the_token_and_generations_fence(tmp_path: Path) -> None:
    leases, session = tmp_path / "leases", tmp_path / "s.jsonl"
    old = acquire(leases, session, "old", None)
    with fenced(leases, old):
        pass
    break_lease(leases, lease_paths(leases, session).owner)  # e.g. a forced break
    new = acquire(leases, session, "new", None)
    assert new.generation == old.generation + 1
    with pytest.raises(StaleLease), fenced(leases, old):
        pass
    assert not release(leases, old), "an old owner cannot release the new owner's lease"
    assert read_owner(lease_paths(leases, session)) == new
    assert release(leases, new)
    assert read_owner(lease_paths(leases, session)) is None
    assert acquire(leases, session, "next", None).generation == new.generation + 1


def test_owner_record_is_complete_and_private(tmp_path: Path) -> None:
    leases, session = tmp_path / "leases", tmp_path / "s.jsonl"
    acquire(leases, session, "me", "src")
    record = json.loads(lease_paths(leases, session).owner.read_text())
    assert set(record) >= {
        "token",
        "generation",
        "runId",
        "sourceRunId",
        "pid",
        "pidStartTime",
        "host",
        "bootId",
        "acquiredAt",
        "sessionFile",
    }
    assert record["sessionFile"] == str(session.resolve())
    assert oct(lease_paths(leases, session).owner.stat().st_mode & 0o777) == "0o600"
    assert not [p for p in leases.iterdir() if p.name.endswith(".tmp")]
