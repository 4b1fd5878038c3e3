"""The zygote (issue 29): a workflow's children's warm runners are forks of one process that
imported once (``pisub/backends/zygote.py``, ``pisub/runner/zygote.py``). Each fork is an
ordinary warm runner — its own session, no child of the launcher, handed its run through the
warm hand-off — and a zygote that is gone or killed never loses a start (the start falls back
to an ordinary warm runner). Nothing of it outlives its launcher."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import pisub
from pisub.backends.warm import Warm
from pisub.backends.zygote import Zygote
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for, wait_no_processes


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _session(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])


def _gone(pid: int) -> bool:
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return not pid_alive(pid)
    return done == pid or not pid_alive(pid)


@pytest.fixture
def zygote(home: Path) -> Iterator[Zygote]:
    made = Zygote.start()
    assert made is not None
    yield made
    made.dismiss()


def test_a_zygote_forks_warm_runners_each_in_a_session_of_its_own(zygote: Zygote) -> None:
    made = [zygote.make() for _ in range(3)]
    assert all(isinstance(w, Warm) for w in made)
    warms = [w for w in made if isinstance(w, Warm)]
    try:
        for warm in warms:
            assert warm.alive()
            assert warm.owner == os.getpid()
        # each a session leader's group of its own: not the zygote's, not ours, not each other's
        sessions = {warm.pid for warm in warms}
        assert len(sessions) == 3 and zygote.pid not in sessions and os.getsid(0) not in sessions
    finally:
        for warm in warms:
            warm.dismiss()
    for warm in warms:
        assert not warm.alive()


def test_a_warm_runner_of_the_zygote_outlives_the_zygote_and_exits_when_its_launcher_lets_go(
    zygote: Zygote,
) -> None:
    warm = zygote.make()
    assert isinstance(warm, Warm)
    zygote.dismiss()
    assert _gone(zygote.pid)
    assert warm.alive()  # not the zygote's: it waits for its run
    warm.sock.close()  # its launcher lets go without a handoff: it exits by itself
    wait_for(lambda: not _members(warm.pid), timeout=30, what="the unused warm runner to exit")


def _members(pgid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and pid_alive(int(name)):
            try:
                if int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    found.append(int(name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def test_the_zygote_exits_when_its_launcher_closes_its_end(home: Path) -> None:
    zygote = Zygote.start()
    assert zygote is not None
    zygote.sock.close()
    wait_for(lambda: _gone(zygote.pid), timeout=30, what="the zygote to exit")


def test_a_killed_zygote_makes_nothing_and_says_so_once(zygote: Zygote) -> None:
    os.kill(zygote.pid, signal.SIGKILL)
    assert zygote.make() is None
    assert zygote.broken
    assert zygote.make() is None  # the caller starts its runner the ordinary way


def test_a_zygote_that_speaks_nonsense_is_given_up(home: Path) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fake = Zygote(pid=os.getpid() + 10**7, sock=ours)  # no such process
    theirs.send(b"ready")
    theirs.send(b"nonsense")
    assert fake.make() is None and fake.broken
    theirs.close()


def _runner_pids(run: pisub.Run) -> list[int]:
    return [s.pid for s in (pisub.Run(c.run_id).status() for c in run.status().steps if c.run_id) if s.pid]


@pytest.mark.parametrize("zygote_on", [True, False])
def test_a_fan_out_runs_its_children_from_the_zygote_and_leaves_nothing(
    home: Path, make_agent: AgentMaker, zygote_on: bool
) -> None:
    make_agent("sleeper", command="sleep", args=["3600"])
    n = 6
    env = {**os.environ, "PISUB_ZYGOTE": "1" if zygote_on else "0"}
    tasks = [arg for _ in range(n) for arg in ("--task", "sleeper=x")]
    launched = pisub_cli("run", "--concurrency", str(n), *tasks, "--json", env=env, check=True)
    run = pisub.Run(json.loads(launched.stdout)["runId"])
    wait_for(
        lambda: [str(s.status) for s in run.status().steps].count("running") == n,
        timeout=120,
        what="every child running",
    )
    runners = _runner_pids(run)
    assert len(runners) == n
    forked = ["pisub.runner.zygote" in _cmdline(pid) for pid in runners]
    assert forked == [zygote_on] * n
    coordinator = run.status().pid
    assert coordinator is not None
    for pid in runners:  # each detached: a session of its own, not the coordinator's
        assert _session(pid) not in (_session(coordinator), pid)
    assert (_zygote_of(coordinator, run.dir) is not None) is zygote_on

    pisub_cli("stop", run.id, check=True)
    run.wait_until_terminal(60)
    assert [str(s.status) for s in run.status().steps] == ["stopped"] * n
    wait_no_processes(home, timeout=30)  # the zygote too


def test_the_coordinator_killed_mid_fan_out_leaves_its_children_to_the_repair_and_no_zygote(
    home: Path, make_agent: AgentMaker
) -> None:
    """kill -9 of the coordinator once some children run: the zygote exits (its launcher's end
    closed), every child that started is a run that goes on under its own runner, every
    journaled start has at most one run, and a stop of each leaves no process."""
    make_agent("sleeper", command="sleep", args=["3600"])
    n = 12
    tasks = [arg for _ in range(n) for arg in ("--task", "sleeper=x")]
    launched = pisub_cli("run", "--concurrency", str(n), *tasks, "--json", check=True)
    run = pisub.Run(json.loads(launched.stdout)["runId"])
    wait_for(
        lambda: [str(s.status) for s in run.status().steps].count("running") >= 3,
        timeout=120,
        what="a few children running",
    )
    coordinator = run.status().pid
    assert coordinator is not None
    zygote = _zygote_of(coordinator, run.dir)
    assert zygote is not None
    os.kill(coordinator, signal.SIGKILL)
    wait_for(lambda: not pid_alive(zygote), timeout=30, what="the zygote to exit")
    run.wait_until_terminal(60)  # the reader's repair
    entries = [json.loads(line) for line in (run.dir / "journal.jsonl").read_text().splitlines()]
    started = [e for e in entries if e.get("t") == "started"]
    assert len({e["key"] for e in started}) == len(started)  # one start per key
    runs_dir = home / "runs"
    for entry in started:  # each journaled start: its run is there and live, or never appeared
        child_dir = runs_dir / entry["runId"]
        if child_dir.is_dir():
            child = pisub.Run(entry["runId"])
            state = child.status().state
            if not state.is_terminal:
                child.send_stop()
                child.wait_until_terminal(60)
    wait_no_processes(home, timeout=30)


def _zygote_of(coordinator: int, run_dir: Path) -> int | None:
    """The coordinator's zygote: its child with the zygote's command line that works in the
    coordinator's run directory (its forks, re-parented to the coordinator too, work in their
    own runs' directories)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except (OSError, IndexError, ValueError):
            continue
        if parent == coordinator and "pisub.runner.zygote" in _cmdline(pid) and cwd == run_dir.resolve():
            return pid
    return None


def _open_files(pid: int) -> set[str]:
    """What process ``pid`` (ours) holds open; nothing once it has gone or ended — its pid may
    even be another user's process by then (the CI machine's pids wrap within minutes), and a
    zombie's ``fd`` folder is unreadable to anyone but root (it has closed every file)."""
    fds: list[str] | None = None

    def listed() -> bool:  # (a process of ours is unreadable for a moment while it execs)
        nonlocal fds
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            fds = []
        except PermissionError:
            try:
                if os.stat(f"/proc/{pid}").st_uid == os.getuid() and pid_alive(pid):
                    return False
            except FileNotFoundError:
                pass
            fds = []  # gone, or not ours: its pid was reused
        return True

    wait_for(listed, 10, what=f"process {pid}'s files to be readable")
    assert fds is not None
    targets = set()
    for fd in fds:
        with contextlib.suppress(FileNotFoundError):  # (closed meanwhile)
            targets.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return targets


def test_nothing_its_launcher_left_inheritable_reaches_the_zygote_or_its_runners(home: Path) -> None:
    leaked_r, leaked_w = os.pipe()
    os.set_inheritable(leaked_w, True)  # what a careless caller of pisub might leave
    try:
        zygote = Zygote.start()
        assert zygote is not None
        warm = zygote.make()  # (only once it is ready: its descriptors are closed by then)
        assert isinstance(warm, Warm)
        try:
            for pid in (zygote.pid, *_members(warm.pid)):
                targets = _open_files(pid)
                assert os.readlink(f"/proc/self/fd/{leaked_w}") not in targets, (pid, targets)
        finally:
            warm.dismiss()
            zygote.dismiss()
    finally:
        os.close(leaked_r)
        os.close(leaked_w)


def test_a_zygote_is_ended_once_whatever_asks_again(zygote: Zygote) -> None:
    zygote.dismiss()
    assert zygote.reaped and _gone(zygote.pid)
    zygote.pid = os.getpid()  # were its pid reused, a second dismiss must not touch it
    zygote.dismiss()  # (it would SIGKILL this test otherwise)
