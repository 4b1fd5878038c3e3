"""A warm runner nobody uses leaves nothing behind: a refused command has no process left when
it returns, and a launcher killed outright takes its idle warm runner with it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import AgentMaker, pid_alive, pisub_cli, processes_of, wait_for


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--agent", "nope", "task"],  # refused after the CLI's imports (an unknown agent)
        ["run", "--agent", "sleepy", "--timeout", "-3", "task"],  # refused by the argument checks
        ["run", "task", "--no-such-option"],  # refused by the parser
    ],
)
def test_a_refused_launch_leaves_no_process_when_it_returns(
    home: Path, make_agent: AgentMaker, args: list[str]
) -> None:
    make_agent("sleepy", command="sleep", args=["600"])
    proc = pisub_cli(*args)
    assert proc.returncode != 0
    assert processes_of(home) == []  # at once: the spare it started first is gone, not going


KILLED = """
import sys
from pisub.backends import warm
warm.prestart()
print(warm._pool[0].pid, flush=True)
sys.stdin.read()
"""


def test_a_killed_launchers_idle_warm_runner_ends_at_once(home: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", KILLED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    pgid = int(launcher.stdout.readline())
    wait_for(lambda: _group(pgid), what="the warm runner to start")
    launcher.send_signal(signal.SIGKILL)  # no exit handler runs: only its closed socket tells
    launcher.communicate()  # (its pipes closed)
    # well before its idle limit (60 s): it notices the socket close, mid-import or waiting
    wait_for(lambda: not _group(pgid), timeout=15, what=f"the warm runner {pgid} to end")


def _group(pgid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        try:
            live = "--warm-fd" in cmd and psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE
            if live and pid_alive(proc.pid) and os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    return found


PRELOAD = """
import socket, sys
from pisub.backends import warm
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
if sys.argv[1] == "arrived":
    ours.send(b"x")  # the handoff (or the launcher's close) is there before the first import
warm.preload(theirs.fileno())
print(sum(name in sys.modules for name in warm.PRELOAD))
"""


def test_a_warm_runner_stops_preloading_when_its_run_arrives() -> None:
    def loaded(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", PRELOAD, mode], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    from pisub.backends import warm

    assert loaded("waiting") == len(warm.PRELOAD)
    assert loaded("arrived") == 0
