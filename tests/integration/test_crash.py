"""kill -9 of the runner is detected by the next reader, exactly once; a live runner never is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pisub
from pisub.protocol import RunState, Status, decode, encode_pretty
from pisub.store.paths import RunPaths
from pisub.store.runs import write_status
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for
from tests.helpers import SLEEPER, child_pids, run_event_types, wait_runner_dead


def test_kill9_runner_detected_once_by_concurrent_readers(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python=SLEEPER)
    run = pisub.launch("sleeper", "x")
    children = child_pids(run)
    runner_pid = run.status().pid
    assert runner_pid is not None
    os.kill(runner_pid, signal.SIGKILL)
    wait_runner_dead(run, runner_pid)
    readers = [
        subprocess.Popen(
            [sys.executable, "-m", "pisub", "status", run.id, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    states = []
    for reader in readers:
        out, errs = reader.communicate(timeout=60)
        assert reader.returncode == 0, errs
        states.append(json.loads(out)["state"])
    assert states == ["failed"] * 6
    assert run_event_types(run).count("run.repaired") == 1
    result = run.result()
    assert result is not None and result.state == "failed"
    assert result.details.error is not None
    assert f"Runner process {runner_pid} exited or disappeared" in result.details.error.message
    for pid in children:
        assert not pid_alive(pid), f"child process {pid} outlived its crashed runner"
    assert pisub_cli("wait", run.id, "--timeout", "5").returncode == 1


def test_zombie_runner_is_dead(home: Path, make_agent: AgentMaker) -> None:
    """A SIGKILLed runner that nobody has reaped yet (state Z) counts as dead."""
    make_agent("sleeper", python=SLEEPER)
    script = textwrap.dedent("""
        import ctypes, json, os, signal, time
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)   # become a subreaper: the runner is ours, unreaped
        import pisub
        run = pisub.launch("sleeper", "x")
        pid = run.status().pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        state = "?"
        while time.monotonic() < deadline:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                break
            time.sleep(0.01)
        while time.monotonic() < deadline:   # its other threads may still be exiting
            st = run.status()
            if st.state != "running":
                break
            time.sleep(0.01)
        print(json.dumps({"proc": state, "state": st.state, "still_zombie":
              open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report == {"proc": "Z", "state": "failed", "still_zombie": True}


def test_pid_reuse_is_not_trusted(home: Path, make_agent: AgentMaker) -> None:
    """A recorded runner pid that now belongs to another process (other start time) is dead."""
    make_agent("sleeper", python=SLEEPER)
    run = pisub.launch("sleeper", "x")
    child_pids(run)
    status = run.status()
    assert status.pid is not None
    os.kill(status.pid, signal.SIGKILL)
    dead = status.pid
    wait_runner_dead(run, dead)
    impostor = subprocess.Popen(["sleep", "30"])
    try:
        status.pid = impostor.pid  # alive, but started at another time
        (run.dir / "status.json").write_bytes(encode_pretty(status))
        assert run.status().state == RunState.FAILED
    finally:
        impostor.kill()
        impostor.wait()


def test_live_runner_is_never_marked_dead(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python=SLEEPER)
    run = pisub.launch("sleeper", "x")
    child_pids(run)
    for _ in range(20):
        assert run.status().state == RunState.RUNNING
    # Wait until the runner has written the child's activity, so that no coalesced
    # status write of its own replaces the forged one below.
    wait_for(lambda: run.status().steps[0].last_activity_at is not None)
    wait_for(lambda: not (run.dir / "status.json").stat().st_mtime > time.time() - 0.6, what="a quiet status")
    # Even with a pid that proves nothing, the held runner.lock keeps it alive.
    status = decode((run.dir / "status.json").read_bytes(), Status, "status")
    status.pid = 999_999_999
    write_status(RunPaths(run.dir), status)
    assert run.status().state == RunState.RUNNING
    assert run.status().pid == 999_999_999, "the check went through the lock, not the pid"
    assert "run.repaired" not in run_event_types(run)


def test_runner_sigterm_stops_the_run(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleeper", python=SLEEPER)
    run = pisub.launch("sleeper", "x")
    children = child_pids(run)
    pid = run.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    result = run.wait(timeout=30)
    assert result.state == "stopped"
    for child in children:
        assert not pid_alive(child)
