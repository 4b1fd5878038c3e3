"""Progress bars of long commands: drawn on a terminal, absent when stderr is not one."""

from __future__ import annotations

from pathlib import Path

import pisub
from tests.conftest import AgentMaker, pisub_cli
from tests.helpers import on_a_terminal


def _on_a_terminal(*args: str, timeout: float = 60) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal; its exit code and what the terminal got."""
    return on_a_terminal(*args, stdout_too=False, timeout=timeout)


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
