"""Every write can fail: the runner keeps supervising, says why, loses no receipt, and the
CLI fails in one line without leaving a temp file behind.

The failures are injected into the real runner (and CLI) processes by
``tests/faultinject/sitecustomize.py``: while a control file exists, their writes under the
home fail with the chosen errno — ENOSPC, EDQUOT, EIO, EACCES, ENAMETOOLONG, EROFS — as a
full disk, a quota, a failing disk, a permission change or a read-only remount would make
them. The real-disk variant (a small tmpfs filled to the brim) is in ``test_repros.py``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import pisub
from pisub.protocol import RunState
from tests.conftest import ROOT, AgentMaker, pid_alive, pisub_cli, wait_for
from tests.helpers import drop_request

ERRNOS = ["ENOSPC", "EDQUOT", "EIO", "EACCES", "ENAMETOOLONG", "EROFS"]

WORKER = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
for i in range(10_000):
    print(f"working {i}", flush=True)
    time.sleep(0.05)
"""


@pytest.fixture
def faults(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The control file: while it exists, pisub's writes under the home fail."""
    control = tmp_path / "fault"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "faultinject"), str(ROOT)]))
    monkeypatch.setenv("PISUB_FAULT_FILE", str(control))
    monkeypatch.setenv("PISUB_FAULT_DIR", str(home))
    yield control
    control.unlink(missing_ok=True)


@pytest.mark.parametrize("code", ERRNOS)
def test_runner_supervises_through_failing_writes_and_loses_nothing(
    home: Path, make_agent: AgentMaker, faults: Path, tmp_path: Path, code: str
) -> None:
    pidfile = tmp_path / "child.pid"
    make_agent("worker", command=sys.executable, args=["-c", WORKER, str(pidfile)], timeout=3)
    run = pisub.launch("worker", "x")
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the child's pid"))
    faults.write_text(code)
    drop_request(run, "during-stop-attempt.json", b'{"v":1,"type":"steer","message":"hi"}')
    drop_request(run, "during-garbage.json", b"not json")
    # The runtime limit is enforced from memory although nothing can be written.
    wait_for(lambda: not pid_alive(child), timeout=15, what="the child ended at its timeout")
    assert run.status().state == RunState.RUNNING, "the runner lives, retrying its final writes"
    faults.unlink()
    result = run.wait(timeout=40)
    assert result.state == "failed" and result.details.results[0].exit_code == 124
    receipts = {p.stem: json.loads(p.read_bytes()) for p in (run.dir / "outbox").glob("*.json")}
    assert receipts["during-stop-attempt"]["state"] == "failed"
    assert receipts["during-garbage"]["state"] == "rejected"
    log = (run.dir / "runner.log").read_text()
    assert os.strerror(getattr(__import__("errno"), code)) in log, "the runner said why it could not write"
    events = [json.loads(line) for line in (run.dir / "events.jsonl").read_text().splitlines()]
    assert any(e["type"] == "run.write_failed" for e in events), "and recorded it once it could"
    assert not list((run.dir / "outbox").glob(".*.tmp")), "no temp file left behind"


def test_the_cli_fails_in_one_line_and_leaves_no_temp_file(
    home: Path, make_agent: AgentMaker, faults: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_agent("sleeper", command="sleep", args=["300"])
    run = pisub.launch("sleeper", "x")
    monkeypatch.setenv("PISUB_FAULT_WHO", "cli")
    faults.write_text("ENOSPC")
    # An external CLI's run takes a stop (steer and follow-up are refused before any write).
    for args in (["stop", run.id], ["stop", run.id, "--reason", "again"]):
        proc = pisub_cli(*args)
        assert proc.returncode == 1, proc
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "[IO_ERROR]" in proc.stderr and "No space left on device" in proc.stderr
        assert "free disk space" in proc.stderr, "the line says the fix"
    assert not list((run.dir / "inbox" / "tmp").iterdir()), "no temp file left in inbox/tmp"
    assert not list((run.dir / "inbox" / "new").iterdir())
    faults.unlink()
    assert pisub_cli("stop", run.id).returncode == 0
    assert run.wait(timeout=30).state == "stopped"


def test_a_dead_runner_on_a_full_disk_is_repaired_once_space_returns(
    home: Path, make_agent: AgentMaker, faults: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_agent("sleeper", command="sleep", args=["300"])
    run = pisub.launch("sleeper", "x")
    drop_request(run, "orphan.json", b'{"v":1,"type":"steer","message":"hi"}')
    wait_for(lambda: (run.dir / "outbox" / "orphan.json").exists())
    status = run.status()
    assert status.pid is not None
    os.kill(status.pid, 9)
    wait_for(lambda: not pid_alive(status.pid or 0))
    monkeypatch.setenv("PISUB_FAULT_WHO", "cli")
    faults.write_text("ENOSPC")
    proc = pisub_cli("status", run.id)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "[IO_ERROR]" in proc.stderr
    faults.unlink()
    proc = pisub_cli("status", run.id, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["state"] == "failed"
    assert json.loads((run.dir / "outbox" / "orphan.json").read_bytes())["state"] == "failed"
