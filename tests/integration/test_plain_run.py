"""``pisub run --agent NAME TASK`` runs without the command line's parser (:mod:`pisub.__main__`)
and says exactly what the parser's ``run`` says: the run id, the agent's ignored keys (once),
the acceptance line, and every refusal as the same one line with the same exit code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pisub
from pisub.__main__ import plain_run
from tests.conftest import AgentMaker

PARSER = "import sys; from pisub.cli import main; sys.argv[0] = 'pisub'; main()"
"""The same command through the parser (typer): what the plain launch must match."""


def _both(home: Path, tmp_path: Path, *args: str) -> tuple[list[str], list[str]]:
    """The outputs (returncode, stdout, stderr, run ids as ID) of the plain launch and of the
    parser's, each in a fresh home holding the same agents."""
    shown = []
    for i, argv in enumerate(([sys.executable, "-m", "pisub", *args], [sys.executable, "-c", PARSER, *args])):
        other = tmp_path / f"home-{i}"
        if not other.exists():
            subprocess.run(["cp", "-a", str(home), str(other)], check=True)
        env = {**os.environ, "PISUB_HOME": str(other)}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        text = f"{done.returncode}\n{done.stdout}{done.stderr}".replace(str(other), "HOME")
        shown.append(re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "ID", text))
        for run in pisub.list_runs(home=other):
            if not run.state.is_terminal:
                pisub.Run(run.run_id, home=other).send_stop()
    return shown[0].splitlines(), shown[1].splitlines()


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--agent", "odd", "do it"),
        ("run", "do it", "-a", "odd"),
        ("run", "--agent=writer", "do it"),
        ("run", "--agent", "nope", "x"),
        ("run", "--agent", "odd", ""),
        ("run", "--agent", "odd", "bad \udcff bytes"),
    ],
)
def test_the_plain_launch_says_what_the_parser_says(
    home: Path, tmp_path: Path, make_agent: AgentMaker, args: tuple[str, ...]
) -> None:
    make_agent("odd", command="sleep", args=["30"], inheritSkills=True)
    make_agent("writer", command="sleep", args=["30"], acceptanceRole="writer")
    plain, parsed = _both(home, tmp_path, *args)
    assert plain == parsed


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--agent", "a", "x"], ("a", "x")),
        (["run", "-a", "a", "x"], ("a", "x")),
        (["run", "x", "--agent=a"], ("a", "x")),
        (["run", "--agent", "a", "x", "--json"], None),
        (["run", "--agent", "a"], None),
        (["run", "x"], None),
        (["run", "--agent", "a", "x", "y"], None),
        (["run", "--agent", "a", "--agent", "b", "x"], None),
        (["run", "--agent", "-x", "x"], None),
        (["run", "--agent", "a", "-"], None),
        (["resume", "r", "x"], None),
    ],
)
def test_what_is_a_plain_launch(argv: list[str], expected: tuple[str, str] | None) -> None:
    assert plain_run(argv) == expected
