"""pisub doctor and pisub gc."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import pisub
from pisub.children.pi.versions import SUPPORTED, detect_version
from pisub.core.locks import is_held
from pisub.protocol import Status, decode, encode_pretty
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for


@pytest.mark.pi_versions
def test_doctor_healthy_then_finds_a_stuck_run(
    pi_home: Path, make_agent: AgentMaker, pi_bin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(pi_home: pi has a usable model, the scripted one; else doctor says so.)"""
    monkeypatch.setenv("PISUB_PI_BIN", pi_bin)
    make_agent("sleepy", command="sleep", args=["600"])
    run = pisub.launch("sleepy", "x")
    healthy = pisub_cli("doctor")
    assert healthy.returncode == 0, healthy.stdout
    assert "inotify" in healthy.stdout
    assert detect_version(pi_bin) in healthy.stdout and SUPPORTED in healthy.stdout
    pid = run.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid) and not is_held(run.dir / "runner.lock"))
    sick = pisub_cli("doctor")
    assert sick.returncode == 1
    assert run.id in sick.stdout and "fix: pisub status RUN" in sick.stdout
    assert run.status().state == "failed"
    assert pisub_cli("doctor").returncode == 0


def test_doctor_reports_a_missing_pi(home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PISUB_PI_BIN"}
    env["PATH"] = "/usr/bin:/bin"
    proc = pisub_cli("doctor", env=env)
    from pisub.children.pi.versions import installed_pi

    launcher = installed_pi()  # a checkout's own pi is named first (tests/integration/test_first_hour.py)
    hint = f"export PISUB_PI_BIN={launcher}" if launcher else "npm install -g @earendil-works/pi-coding-agent"
    assert proc.returncode == 1 and hint in proc.stdout


def test_gc_removes_old_finished_runs_only(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    make_agent("sleepy", command="sleep", args=["600"])
    old = pisub.launch("quick", "x")
    old.wait(timeout=30)
    status = decode((old.dir / "status.json").read_bytes(), Status, "status")
    status.ended_at = "2020-01-01T00:00:00.000Z"
    (old.dir / "status.json").write_bytes(encode_pretty(status))
    recent = pisub.launch("quick", "y")
    recent.wait(timeout=30)
    live = pisub.launch("sleepy", "z")
    stale_tmp = live.dir / "inbox" / "tmp" / "abandoned.json"
    stale_tmp.write_text("{")
    os.utime(stale_tmp, (time.time() - 40 * 3600,) * 2)
    dry = pisub_cli("gc", "--older-than", "30d", "--dry-run", check=True).stdout
    assert f"would remove run {old.id}" in dry and old.dir.exists()
    done = pisub_cli("gc", "--older-than", "30d", check=True).stdout
    assert f"removed run {old.id}" in done
    assert "kept 1 run(s) that ended less than 30d ago, 1 live run(s)" in done
    assert not old.dir.exists() and recent.dir.exists() and live.dir.exists()
    assert not stale_tmp.exists()
    assert (
        pisub_cli("gc", "--older-than", "0s", check=True).stdout.count("removed run") == 1
    )  # never the live one
    assert live.dir.exists()
    pisub_cli("stop", live.id)
