"""The index of live runs (``<home>/index/live/``): it may name too many runs, never too few."""

from __future__ import annotations

import os
import shutil
import signal
import stat
from pathlib import Path

import pytest

import pisub
from pisub.core.locks import is_held
from pisub.protocol import RunState
from pisub.store.paths import open_home
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for
from tests.helpers import stop_and_end

SLEEP = "import time; time.sleep(60)"


def _live(home: Path) -> set[str]:
    folder = home / "index" / "live"
    return set(os.listdir(folder)) if folder.is_dir() else set()


def _running_ids(home: Path) -> set[str]:
    return {st.run_id for st in pisub.list_runs(state=RunState.RUNNING)}


def test_a_run_is_indexed_from_its_creation_to_its_end(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python=SLEEP)
    make_agent("quick", python="print('done')")
    run = pisub.launch("sleeper", "x")
    assert run.id in _live(home)
    entry = home / "index" / "live" / run.id
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "index").stat().st_mode) == 0o700
    quick = pisub.launch("quick", "x")
    quick.wait(30)  # (returns once the result exists: the terminal status follows it)
    wait_for(lambda: quick.id not in _live(home))  # removed after the terminal status
    stop_and_end(run)
    wait_for(lambda: _live(home) == set())


def test_a_lost_or_partial_index_never_hides_a_run(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python=SLEEP)
    make_agent("quick", python="print('done')")
    for _ in range(3):
        pisub.launch("quick", "x").wait(30)
    run = pisub.launch("sleeper", "x")
    (home / "index" / "live.ok").unlink(missing_ok=True)
    os.unlink(home / "index" / "live" / run.id)  # lost with the stamp: the readers scan
    assert _running_ids(home) == {run.id}
    assert (home / "index" / "live.ok").exists() and _live(home) == {run.id}  # rebuilt
    for path in sorted((home / "index").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (home / "index").rmdir()
    assert _running_ids(home) == {run.id}
    assert _live(home) == {run.id}
    shutil.rmtree(home / "index" / "live")  # the folder alone, live.ok left
    other = pisub.launch("sleeper", "x")  # makes the folder anew, and says the index is lost
    assert _running_ids(home) == {run.id, other.id}
    assert _live(home) == {run.id, other.id}
    stop_and_end(run)
    stop_and_end(other)


def test_stale_entries_are_dropped_and_creations_in_progress_kept(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    done = pisub.launch("quick", "x")
    done.wait(30)
    pisub.list_runs()  # a first full listing writes live.ok
    live = home / "index" / "live"
    (live / done.id).touch()  # a finished run named: stale
    gone = "0b0e5ab5-0000-4000-8000-000000000001"
    (live / gone).touch()  # names no run at all
    creating = "0b0e5ab5-0000-4000-8000-000000000002"
    (live / creating).touch()
    (home / "runs" / f".creating-{creating}").mkdir()  # a launcher is creating it right now
    assert _running_ids(home) == set()
    assert _live(home) == {creating}


def test_a_dead_runner_found_through_the_index_is_repaired_and_unindexed(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("sleeper", python=SLEEP)
    run = pisub.launch("sleeper", "x")
    pid = run.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid) and not is_held(run.dir / "runner.lock"))
    assert _running_ids(home) == set()
    assert run.status().state == RunState.FAILED
    assert _live(home) == set()


def test_something_planted_at_the_index_folder_is_set_aside(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python=SLEEP)
    open_home(home)
    (home / "index").mkdir(mode=0o700)
    (home / "index" / "live.ok").touch()
    target = home / "elsewhere"
    target.mkdir()
    (home / "index" / "live").symlink_to(target)
    run = pisub.launch("sleeper", "x")
    assert (home / "index" / "live").is_dir() and not (home / "index" / "live").is_symlink()
    assert list(target.iterdir()) == []  # nothing written through the symlink
    assert [p.name.startswith("live.bad-") for p in (home / "index").iterdir()].count(True) == 1
    assert _running_ids(home) == {run.id}  # live.ok was removed with it: scanned, then rebuilt
    shutil.rmtree(home / "index" / "live")
    (home / "index" / "live").write_text("")  # a file this time (the index is lost: scanned)
    again = pisub.launch("sleeper", "x")
    assert _running_ids(home) == {run.id, again.id}
    stop_and_end(run)
    stop_and_end(again)


def test_list_state_running_reads_only_the_indexed_runs(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python=SLEEP)
    make_agent("quick", python="print('done')")
    finished = pisub.launch("quick", "x")
    finished.wait(30)
    run = pisub.launch("sleeper", "x")
    pisub.list_runs()
    # A finished run whose status cannot be read would be reported by a full scan; the index
    # never sends the reader there.
    (home / "runs" / finished.id / "status.json").write_text("{")
    proc = pisub_cli("list", "--state", "running", "--json", check=True)
    assert run.id in proc.stdout and "unreadable" not in proc.stderr
    proc = pisub_cli("list", "--json")
    assert finished.id in proc.stderr  # the full listing names it
    stop_and_end(run)


def test_something_planted_at_index_itself_is_set_aside(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python=SLEEP)
    open_home(home)
    (home / "index").write_text("not a folder")
    run = pisub.launch("sleeper", "x")
    assert (home / "index" / "live" / run.id).is_file()
    assert [p.name for p in home.iterdir() if p.name.startswith("index.bad-")] != []
    shutil.rmtree(home / "index")
    os.mkfifo(home / "index")
    again = pisub.launch("sleeper", "x")
    assert _running_ids(home) == {run.id, again.id}
    stop_and_end(run)
    stop_and_end(again)


@pytest.mark.skipif(os.geteuid() == 0, reason="permissions do not bind root (the unprivileged pass runs it)")
def test_an_index_that_cannot_be_written_fails_the_launch_naming_it(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("sleeper", python=SLEEP)
    run = pisub.launch("sleeper", "x")
    (home / "index" / "live").chmod(0o500)
    try:
        proc = pisub_cli("run", "--agent", "sleeper", "x")
        assert proc.returncode == 1 and "[IO_ERROR]" in proc.stderr, proc.stderr
        assert "index" in proc.stderr and "Traceback" not in proc.stderr
        assert {p.name for p in (home / "runs").iterdir()} == {run.id}  # nothing half made
    finally:
        (home / "index" / "live").chmod(0o700)
    stop_and_end(run)


@pytest.mark.skipif(os.geteuid() == 0, reason="permissions do not bind root (the unprivileged pass runs it)")
def test_runs_that_cannot_be_listed_are_never_reported_as_none(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python=SLEEP)
    run = pisub.launch("sleeper", "x")
    pisub.list_runs()
    (home / "runs").chmod(0o100)  # names can be looked up, not listed
    try:
        proc = pisub_cli("list", "--state", "running", "--json")
        assert run.id in proc.stdout or "[IO_ERROR]" in proc.stderr, (proc.stdout, proc.stderr)
        (home / "runs").chmod(0o000)  # not even looked up: named on stderr as unreadable
        proc = pisub_cli("list", "--state", "running", "--json")
        assert run.id in proc.stdout + proc.stderr, (proc.stdout, proc.stderr)
    finally:
        (home / "runs").chmod(0o700)
    stop_and_end(run)
