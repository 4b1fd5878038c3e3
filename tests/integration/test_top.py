"""`pisub top` driven in tmux: select a real pi run, steer it (the receipt is shown), open its log,
stop it after the confirmation, quit."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import pisub
from pisub.cli.top import keys_of
from tests.conftest import processes_of, wait_for

pytestmark = pytest.mark.pi


class Tmux:
    """A tmux server of the test's own. Named (``-L``), not a socket path in ``tmp_path``: an
    xdist worker's ``tmp_path`` can be longer than a socket's path may be (108 bytes)."""

    def __init__(self) -> None:
        self.label = f"pisub-test-{uuid.uuid4().hex}"

    def __call__(self, *args: str) -> str:
        proc = subprocess.run(["tmux", "-L", self.label, *args], capture_output=True, text=True, timeout=30)
        return proc.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "top", *keys)

    def type(self, text: str) -> None:
        self("send-keys", "-t", "top", "-l", text)


@pytest.fixture
def tmux(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/test.sh installs it)")
    monkeypatch.setenv("SHELL", "/bin/sh")  # (pisub-ci's login shell is nologin: tmux runs commands with it)
    t = Tmux()
    yield t
    t("kill-server")


@pytest.mark.pi_versions
def test_top_selects_steers_logs_and_stops_a_run(pi_home: Path, tmux: Tmux) -> None:
    run = pisub.launch("pi", "SLOW:600 a long piece of work")
    wait_for(lambda: run.status().state == "running", timeout=30)
    tmux("new-session", "-d", "-s", "top", "-x", "180", "-y", "40", f"{sys.executable} -m pisub top")
    short = run.id[:8]
    wait_for(lambda: short in tmux.screen(), timeout=30, what="the run in the table")
    tmux.keys("s")
    wait_for(lambda: f"steer {short}>" in tmux.screen(), timeout=10, what="the steer prompt")
    tmux.type("please hurry")
    tmux.keys("Enter")
    wait_for(
        lambda: f"steer {short}: delivered" in tmux.screen() or f"steer {short}: queued" in tmux.screen(),
        timeout=20,
        what="the steer's receipt",
    )
    tmux.keys("Enter")
    wait_for(lambda: f"log of {short}" in tmux.screen(), timeout=10, what="the log view")
    tmux.keys("q")
    wait_for(lambda: "steers" in tmux.screen(), timeout=10, what="the table again")
    tmux.keys("x")
    wait_for(lambda: f"stop {short}? y/n" in tmux.screen(), timeout=10, what="the confirmation")
    tmux.keys("y")
    assert run.wait(timeout=30).state == "stopped"
    wait_for(lambda: "stopped" in tmux.screen(), timeout=10, what="the stopped state")
    tmux.keys("q")
    wait_for(lambda: "top" not in tmux("list-sessions"), timeout=10, what="top to quit")


def test_keys_of_terminal_input() -> None:
    assert keys_of(b"jk\x1b[A\x1b[B\r\x1bq") == ["down", "up", "up", "down", "enter", "esc", "q"]


def test_top_refuses_a_pipe(home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", "top"],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1 and "needs a terminal" in proc.stderr and "Traceback" not in proc.stderr


def test_top_shows_every_unreadable_run(home: Path, tmux: Tmux) -> None:
    import os

    runs = home / "runs"
    runs.mkdir(parents=True, mode=0o700)
    bad = [f"aaaaaaaa-0000-4000-8000-00000000000{n}" for n in range(7)]
    for number, run_id in enumerate(bad):
        (runs / run_id).mkdir(mode=0o700)
        status = runs / run_id / "status.json"
        if number == 0:
            os.mkfifo(status)
        elif number == 1:
            status.mkdir()
        else:
            status.write_bytes([b"", b"{", b"[1]", b"\xff", b"null"][number - 2])
    tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "40", f"{sys.executable} -m pisub top")
    wait_for(lambda: all(run_id in tmux.screen() for run_id in bad), timeout=30, what="every unreadable run")
    tmux.keys("q")


def test_top_ends_quietly_when_its_terminal_goes_away(home: Path, tmux: Tmux, tmp_path: Path) -> None:
    err, rc = tmp_path / "top.err", tmp_path / "top.rc"
    command = f"{sys.executable} -m pisub top 2>>{err}; echo $? >{rc}"
    tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "30", command)
    wait_for(lambda: "no runs yet" in tmux.screen(), timeout=30, what="the empty table")
    tmux("kill-server")
    wait_for(lambda: (err.exists() and rc.exists()) or not _top_alive(home), timeout=15, what="top to end")
    text = err.read_text() if err.exists() else ""
    assert "internal error" not in text and "Traceback" not in text, text


def _top_alive(home: Path) -> bool:
    """Whether this test's ``pisub top`` runs (it has this test's PISUB_HOME in its environment;
    other tests' tops, on other xdist workers, do not)."""
    for pid in processes_of(home):
        try:
            if b"pisub\0top" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False
