"""Progress bars of long commands: drawn on a terminal, absent when stderr is not one."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pisub
from tests.conftest import AgentMaker, pisub_cli


def _on_a_terminal(*args: str, timeout: float = 60) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal; its exit code and what the terminal got."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pisub", *args], stdout=subprocess.DEVNULL, stderr=slave, env=dict(os.environ)
    )
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"pisub {' '.join(args)} still ran after {timeout:g}s: {seen!r}"
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break  # the terminal closed: the command exited
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=10), seen.decode("utf-8", "replace")


def test_wait_all_shows_how_many_runs_ended_on_a_terminal_only(home: Path, make_agent: AgentMaker) -> None:
    make_agent("short", command="sleep", args=["1"])
    ids = [pisub.launch("short", "x").id for _ in range(3)]
    code, screen = _on_a_terminal("wait", "--all", *ids)
    assert code == 0
    assert "runs ended" in screen and "/3" in screen
    more = [pisub.launch("short", "x").id for _ in range(2)]
    piped = pisub_cli("wait", "--all", *more)
    assert piped.returncode == 0 and piped.stderr == ""


def test_gc_shows_its_passes_on_a_terminal_only(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", command="true")
    for _ in range(3):
        pisub.launch("quick", "x").wait(30)
    code, screen = _on_a_terminal("gc", "--older-than", "0s", "--dry-run")
    assert code == 0 and "checking runs" in screen
    piped = pisub_cli("gc", "--older-than", "0s")
    assert piped.returncode == 0 and piped.stderr == "" and "removed 3 run(s)" in piped.stdout
