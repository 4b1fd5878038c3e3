"""Runs of an ordinary user touched by root: no CAP_FOWNER to hide a failure (issue 10, repro 2).

These tests run as root and drive pisub as ``$PISUB_NONROOT_USER`` through the ``unprivileged``
fixture; they skip elsewhere (see tests/nonroot.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, pid_alive, wait_for
from tests.helpers import SLEEPER, child_pids, run_events
from tests.nonroot import Unprivileged

pytestmark = pytest.mark.root  # each drives pisub as another user

FINAL_STATES = ("delivered", "scheduled", "partial", "recovered", "failed", "rejected")


def _launch(user: Unprivileged, agent: str) -> tuple[str, Path, int]:
    """Start a run as the user: its id, directory and runner pid."""
    proc = user.pisub("run", "--agent", agent, "--json", "x", check=True)
    info = json.loads(proc.stdout)
    run_dir = Path(info["runDir"])
    assert run_dir.stat().st_uid == user.uid, "the run must belong to the ordinary user"
    return str(info["runId"]), run_dir, int(info["pid"])


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError as exc:
        return f"<{exc}>"


def test_root_stop_sh_into_a_users_run_is_carried_out(unprivileged: Unprivileged) -> None:
    """Repro 2: root's request file cannot be hard-linked by the user (protected_hardlinks=1)."""
    user = unprivileged
    user.make_agent("sleeper", python=SLEEPER)
    run_id, run_dir, runner = _launch(user, "sleeper")
    pids = child_pids(run_dir)
    assert pid_alive(runner)

    stop = subprocess.Popen(
        ["sh", str(ROOT / "scripts" / "stop.sh"), str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PISUB_WAIT": "30"},
    )
    try:
        # stop.sh answers, or the runner is gone: then stop.sh sees the receipt written just
        # before the runner ended within a moment (it waits no longer for one that never comes).
        wait_for(
            lambda: stop.poll() is not None or not pid_alive(runner), timeout=40, what="stop.sh or the runner"
        )
        wait_for(lambda: stop.poll() is not None, timeout=2, what="stop.sh to answer once the runner ended")
    finally:
        if stop.poll() is None:
            stop.kill()
        out, err = stop.communicate(timeout=10)
    diagnosis = (
        f"stop.sh exited {stop.returncode} (stdout {out.strip()!r}, stderr {err.strip()!r}); the runner is "
        f"{'alive' if pid_alive(runner) else 'gone'}; runner.log:\n{_tail(run_dir / 'runner.log')}"
    )
    assert "Traceback" not in _tail(run_dir / "runner.log"), "the runner died: " + diagnosis
    assert stop.returncode == 0, diagnosis
    assert json.loads(out)["state"] == "delivered", diagnosis

    waited = user.pisub("wait", run_id, "--timeout", "30", "--json", timeout=60)
    assert waited.returncode == 1, waited.stderr  # ended, but not `complete`
    assert json.loads(waited.stdout)["state"] == "stopped", diagnosis
    status = json.loads(user.pisub("status", run_id, "--json", check=True).stdout)
    assert status["state"] == "stopped"
    wait_for(lambda: not any(pid_alive(pid) for pid in [runner, *pids]), what="the runner and child to end")
    receipts = [json.loads(p.read_text()) for p in (run_dir / "outbox").glob("*.json")]
    assert len(receipts) == 1, receipts
    assert receipts[0]["type"] == "stop" and receipts[0]["state"] == "delivered"
    assert receipts[0]["deliveryStatus"] == "delivered"
    assert "run.repaired" not in {event.get("type") for event in run_events(run_dir)}, "the runner died"


def _drop_root_only_request(run_dir: Path, name: str) -> Path:
    """As root, publish a request file only root can read (0600), the way a writer does."""
    tmp = run_dir / "inbox" / "tmp" / name
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b'{"v":1,"type":"stop","source":"root"}\n')
    finally:
        os.close(fd)
    path = run_dir / "inbox" / "new" / name
    os.rename(tmp, path)
    st = path.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    return path


def _pisub_answers(user: Unprivileged, *args: str) -> subprocess.CompletedProcess[str]:
    """``pisub ARGS`` as the user: no hang, no traceback, at most one line on stderr."""
    try:
        proc = user.pisub(*args, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pisub {' '.join(args)} as {user.user} hung for 30 s")
    where = f"pisub {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}"
    assert "Traceback" not in proc.stdout + proc.stderr, where
    assert len(proc.stderr.strip().splitlines()) <= 1, where
    return proc


@pytest.mark.parametrize("ending", ["complete", "runner-killed"])
def test_user_reads_a_run_holding_a_root_only_request(unprivileged: Unprivileged, ending: str) -> None:
    """A root-owned 0600 request in the inbox of a finished (or crashed) run of an ordinary user:
    the user's readers answer it and `status`/`list` still work."""
    user = unprivileged
    if ending == "complete":
        user.make_agent("quick", python="print('done')")
        run_id, run_dir, _ = _launch(user, "quick")
        user.pisub("wait", run_id, "--timeout", "30", check=True)
        expected = "complete"
    else:
        user.make_agent("sleeper", python=SLEEPER)
        run_id, run_dir, runner = _launch(user, "sleeper")
        child_pids(run_dir)
        os.kill(runner, signal.SIGKILL)
        wait_for(lambda: not pid_alive(runner), what="the runner to die")
        expected = "failed"  # repaired by the first reader
    _drop_root_only_request(run_dir, "root-only.json")

    status = _pisub_answers(user, "status", run_id, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == expected, status.stderr
    human = _pisub_answers(user, "status", run_id)
    assert human.returncode == 0 and expected in human.stdout, human.stderr
    listed = _pisub_answers(user, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    states = {row["runId"]: row["state"] for row in map(json.loads, listed.stdout.splitlines())}
    assert states == {run_id: expected}
    table = _pisub_answers(user, "list")
    assert table.returncode == 0 and run_id[:8] in table.stdout, table.stderr

    receipt_path = run_dir / "outbox" / "root-only.json"
    assert receipt_path.exists(), "the root-owned request got no receipt"
    assert json.loads(receipt_path.read_text())["state"] in FINAL_STATES


def test_root_stop_sh_never_follows_a_symlink_the_user_planted(unprivileged: Unprivileged) -> None:
    """Outside attack 1: the user sprays symlinks named like stop.sh's temp files (to a root-only
    file) into its own inbox/tmp; root's stop.sh must not overwrite the target, and still stops."""
    user = unprivileged
    victim = user.base / "victim"
    victim.write_text("root's precious data\n")
    os.chmod(victim, 0o600)
    user.make_agent("sleeper", python=SLEEPER)
    run_id, run_dir, runner = _launch(user, "sleeper")
    tmp = run_dir / "inbox" / "tmp"
    now = int(__import__("time").time())
    for second in range(now, now + 4):
        for pid in range(os.getpid(), os.getpid() + 200):
            link = tmp / f"sh-{second}-{pid}.json"
            with contextlib.suppress(FileExistsError):
                os.symlink(victim, link)
                os.chown(link, user.uid, user.gid, follow_symlinks=False)
    proc = subprocess.run(
        ["sh", str(ROOT / "scripts" / "stop.sh"), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PISUB_WAIT": "30"},
        check=False,
    )
    assert victim.read_text() == "root's precious data\n", "root's file was overwritten through a symlink"
    assert proc.returncode == 0 and json.loads(proc.stdout)["state"] == "delivered", proc
    assert json.loads(user.pisub("wait", run_id, "--json", timeout=60).stdout)["state"] == "stopped"
    wait_for(lambda: not pid_alive(runner), what="the runner to end")
