"""Warm runners (:mod:`pisub.backends.warm`): a runner started before its run exists takes the run
over a socket; every failure before its acknowledgement falls back to a cold start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import pisub
from pisub.backends import warm
from pisub.protocol import RunState
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for
from tests.helpers import stop_and_end

ECHO_ENV = """
import os, sys, time
sys.stdin.read()
print("odd:", os.environb.get(b"PISUB_TEST_ODD"))
print("run:", os.environ.get("PISUB_RUN_ID"), flush=True)
time.sleep(60)
"""


@pytest.fixture(autouse=True)
def _empty_pool() -> Iterator[None]:
    """Each test starts and ends without a warm runner of this process."""
    _drain()
    yield
    _drain()


def _drain() -> None:
    while _FAKES:
        fake = _FAKES.pop()
        fake.communicate(timeout=10)
    while (left := warm.take()) is not None:
        left.discard()


def _with(path: Path, needle: str) -> str | None:
    text = path.read_text() if path.exists() else ""
    return text if needle in text else None


def _impatient(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Launchers wait only ``seconds`` for a warm runner's acknowledgement."""
    real = warm._receive
    monkeypatch.setattr(warm, "_receive", lambda sock, timeout: real(sock, seconds))


def _warm_started(pid: int | None) -> bool:
    assert pid is not None
    return "--warm-fd" in psutil.Process(pid).cmdline()


def _warm_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "pisub.runner" in cmd and "--warm-fd" in cmd and proc.status() != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def test_the_command_line_hands_its_run_to_a_warm_runner(home: Path, make_agent: AgentMaker) -> None:
    make_agent("env", python=ECHO_ENV)
    environb = {k.encode(): v.encode() for k, v in os.environ.items()} | {b"PISUB_TEST_ODD": b"\xff\xfe ok"}
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "run", "--agent", "env", "--json", "x"],
        capture_output=True,
        env=environb,
        timeout=60,
        check=True,
    )
    run_id = json.loads(proc.stdout)["runId"]
    run = pisub.Run(run_id)
    status = run.status()
    assert _warm_started(status.pid), "the command line started its runner cold"
    assert os.readlink(f"/proc/{status.pid}/cwd") == str(home / "runs" / run_id)
    assert os.readlink(f"/proc/{status.pid}/fd/2") == str(home / "runs" / run_id / "runner.log")
    log = home / "runs" / run_id / "output-0.log"
    output = wait_for(lambda: _with(log, "run:"), 30, what="the child's output")
    assert "odd: b'\\xff\\xfe ok'" in output  # the launcher's environment, bytes and all
    assert f"run: {run_id}" in output
    stop_and_end(run)


def test_the_api_keeps_one_spare_and_uses_it(
    home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PISUB_WARM")  # the default: spares (the suite turns them off)
    make_agent("sleeper", command="sleep", args=["30"])
    first = pisub.launch("sleeper", "x")
    assert len(warm._pool) == 1, "no spare kept after a launch"
    spare = warm._pool[0]
    wait_for(lambda: _alive(spare.pid), 10, what="the spare to start")
    second = pisub.launch("sleeper", "x")
    assert spare not in warm._pool
    assert _warm_started(second.status().pid)
    for run in (first, second):
        stop_and_end(run)


def test_warm_off_and_no_spares(home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch) -> None:
    make_agent("sleeper", command="sleep", args=["30"])
    off = {**os.environ, "PISUB_WARM": "0"}
    run_id = pisub_cli("run", "--agent", "sleeper", "x", env=off, check=True).stdout.strip()
    assert not _warm_started(pisub.Run(run_id).status().pid)
    stop_and_end(pisub.Run(run_id))
    monkeypatch.setenv("PISUB_WARM", "1")
    run = pisub.launch("sleeper", "x")
    assert _warm_started(run.status().pid)
    assert warm._pool == [], "PISUB_WARM=1 keeps no spare"
    stop_and_end(run)


def test_a_dead_warm_runner_means_a_cold_start(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", command="sleep", args=["30"])
    warm.prestart()
    (waiting,) = warm._pool
    wait_for(lambda: _alive(waiting.pid), 10, what="the warm runner to start")
    os.killpg(waiting.pid, signal.SIGKILL)
    wait_for(lambda: not waiting.alive(), 10, what="the warm runner to die")
    run = pisub.launch("sleeper", "x")
    assert run.status().state == RunState.RUNNING
    assert not _warm_started(run.status().pid)
    stop_and_end(run)


FAKE = """
import os, socket, sys
sock = socket.socket(fileno=int(sys.argv[2]))
data, anc, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(8))
if sys.argv[1] == "late":
    import time; time.sleep(float(sys.argv[3]))
if sys.argv[1] in ("ack", "late", "go"):
    try:
        sock.send(b'{"got": true}')
        told = sock.recv(64)
    except OSError:
        told = b""
    print("go" if told == b'{"go": true}' else "dropped", flush=True)
os._exit(0)
"""


_FAKES: list[subprocess.Popen[bytes]] = []


def _fake_warm(how: str, *extra: str, stdout: int | None = None) -> warm.Warm:
    """A process that takes the handoff and exits: before (``quit``) or after (``ack``) its
    acknowledgement."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fd = theirs.fileno()
    proc = subprocess.Popen([sys.executable, "-c", FAKE, how, str(fd), *extra], pass_fds=(fd,), stdout=stdout)
    _FAKES.append(proc)
    theirs.close()
    return warm.Warm(pid=proc.pid, sock=ours, owner=os.getpid())


def test_a_warm_runner_gone_before_its_acknowledgement_leaves_the_run_to_a_cold_one(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("sleeper", command="sleep", args=["30"])
    warm._pool.append(_fake_warm("quit"))
    run = pisub.launch("sleeper", "x")
    assert run.status().state == RunState.RUNNING
    assert not _warm_started(run.status().pid)
    stop_and_end(run)


def test_a_warm_runner_gone_after_go_fails_the_launch_cleanly(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", command="sleep", args=["30"])
    warm._pool.append(_fake_warm("go", stdout=subprocess.DEVNULL))
    with pytest.raises(pisub.PisubError) as caught:
        pisub.launch("sleeper", "x")
    assert caught.value.code == "SUBAGENT_FAILED"
    (status,) = pisub.list_runs()
    assert status.state == RunState.FAILED  # never left "starting"


def test_a_late_acknowledgement_never_makes_a_second_runner(
    home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_agent("sleeper", command="sleep", args=["30"])
    _impatient(monkeypatch, 0.2)
    said = subprocess.PIPE
    fake = _fake_warm("late", "0.6", stdout=said)
    warm._pool.append(fake)
    run = pisub.launch("sleeper", "x")  # gave up on it after 0.2 s: started cold
    assert not _warm_started(run.status().pid)
    proc = _FAKES[-1]
    assert proc.stdout is not None
    assert proc.stdout.read().strip() == b"dropped"  # acknowledged late, told nothing: it drops the run
    stop_and_end(run)


def test_an_idle_warm_runner_ends_with_its_launcher(home: Path) -> None:
    code = "from pisub.backends import warm; warm.prestart(); print(warm._pool[0].pid, flush=True)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    pgid = int(proc.stdout)  # the warm runner leads its own session: its pid
    wait_for(lambda: not _alive(pgid), 20, what=f"the idle warm runner {pgid} to end")


def _alive(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in _warm_processes():
        try:
            if os.getpgid(proc.pid) == pgid and pid_alive(proc.pid):
                found.append(proc)
        except ProcessLookupError:
            pass
    return found


def test_a_forked_launcher_does_not_use_its_parents_warm_runner(home: Path) -> None:
    warm.prestart()
    (parents,) = warm._pool
    pid = os.fork()
    if pid == 0:
        taken = warm.take()
        os._exit(0 if taken is None else 1)
    _, code = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(code) == 0
    assert warm._pool == [parents]


def test_a_handoff_that_is_not_one_is_ignored() -> None:
    assert warm._parse(b"not json", [5, 6]) is None
    assert warm._parse(json.dumps({"run_dir": 1, "env": {}}).encode(), [5, 6]) is None
    assert warm._parse(json.dumps({"run_dir": "/x", "env": {}}).encode(), [5]) is None
    assert warm._parse(json.dumps({"run_dir": "/x", "env": {"A": "\u0100"}}).encode(), [5, 6]) is None
    good = warm._parse(json.dumps({"run_dir": "/x", "env": {"A": "\xff"}}).encode(), [5, 6])
    assert good is not None and good.env == {b"A": b"\xff"} and (good.lock_fd, good.log_fd) == (5, 6)


def test_a_stopped_warm_runner_is_ended_when_the_launch_falls_back(
    home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_agent("sleeper", command="sleep", args=["30"])
    _impatient(monkeypatch, 0.3)
    warm.prestart()
    (waiting,) = warm._pool
    wait_for(lambda: _alive(waiting.pid), 10, what="the warm runner to start")
    os.killpg(waiting.pid, signal.SIGSTOP)  # stuck: it will never answer
    run = pisub.launch("sleeper", "x")
    assert not _warm_started(run.status().pid)
    wait_for(lambda: not _alive(waiting.pid), 10, what="the stopped warm runner to be ended")
    stop_and_end(run)


def test_completion_never_creates_the_home(tmp_path: Path) -> None:
    home = tmp_path / "nowhere" / "home"
    env = {**os.environ, "PISUB_HOME": str(home), "_PISUB_COMPLETE": "complete_bash"}
    env |= {"COMP_WORDS": "pisub status ", "COMP_CWORD": "2"}
    subprocess.run([sys.executable, "-m", "pisub"], env=env, capture_output=True, timeout=30)
    env |= {"COMP_WORDS": "pisub run --agent ", "COMP_CWORD": "3"}
    subprocess.run([sys.executable, "-m", "pisub"], env=env, capture_output=True, timeout=30)
    assert not (tmp_path / "nowhere").exists()
