"""The plain forms of ``pisub status`` and ``pisub list`` run without typer and click
(:mod:`pisub.cli.fast`): they print, fail and exit exactly as the same command line through
the parser does, and every other form still goes through the parser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker

_THROUGH = """
import json, sys
sys.argv = ["pisub", *json.loads(sys.argv[1])]
from pisub.cli.{module} import main
try:
    main()
finally:
    sys.stdout.flush()
    sys.__stderr__.write("\\nTYPER " + json.dumps("typer" in sys.modules or "click" in sys.modules) + "\\n")
"""


def _cli(module: str, *argv: str) -> tuple[int, str, str, bool]:
    """``pisub ARGV`` through ``pisub.cli.<module>.main``: exit code, stdout, stderr, and
    whether typer or click was imported."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_COMPLETE")}
    proc = subprocess.run(
        [sys.executable, "-c", _THROUGH.format(module=module), json.dumps(list(argv))],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    *err, marker = proc.stderr.rstrip("\n").split("\n")
    assert marker.startswith("TYPER "), proc.stderr
    out = re.sub(r"\b\d+[smhd] ago\b", "N ago", proc.stdout)  # (the clock moves between the two)
    return proc.returncode, out, "\n".join(err).rstrip("\n"), json.loads(marker[len("TYPER ") :])


@pytest.fixture
def two_runs(home: Path, make_agent: AgentMaker) -> list[str]:
    make_agent("quick", python="print('done')")
    runs = [pisub.launch("quick", "x", label=f"l{i}") for i in range(2)]
    for run in runs:
        run.wait(timeout=30)
    return [run.id for run in runs]


PLAIN = [
    ("status", "{0}", "--json"),
    ("status", "--json", "{0}"),
    ("status", "{0}"),
    ("status", "@l1", "--json"),
    ("status", "{prefix}"),
    ("status",),
    ("status", "--json"),
    ("status", "00000000-0000-4000-8000-000000000000", "--json"),
    ("status", "nope"),
    ("list",),
    ("list", "--json"),
    ("list", "--json", "--all", "--state", "complete", "--agent", "quick", "--since", "1h", "--limit", "1"),
    ("list", "--state", "running", "--json"),
    ("list", "--state", "bogus"),
    ("list", "--since", "soon"),
    ("list", "--limit", "0", "--json"),
    ("list", "--limit", "0"),
]

THROUGH_THE_PARSER = [
    ("status", "--help"),
    ("status", "{0}", "--view", "fleet"),
    ("status", "{0}", "--json", "--json"),
    ("status", "{0}", "{1}"),
    ("status", "--", "{0}"),
    ("list", "--limit", "-1"),
    ("list", "--limit", "+1"),
    ("list", "--state"),
    ("list", "--state=complete"),
    ("list", "--bogus"),
    ("list", "--json", "--json"),
]


@pytest.mark.parametrize("argv", PLAIN + THROUGH_THE_PARSER, ids=" ".join)
def test_the_same_output_and_exit_with_or_without_the_parser(
    two_runs: list[str], argv: tuple[str, ...]
) -> None:
    args = [a.format(*two_runs, prefix=two_runs[0][:8]) for a in argv]
    code, out, err, typer_loaded = _cli("entry", *args)
    assert typer_loaded == (argv not in PLAIN)
    assert (code, out, err) == _cli("parser", *args)[:3]


@pytest.mark.parametrize(
    "argv", [("list", "--json"), ("list",), ("list", "--limit", "+5"), ("status", "{0}")]
)
@pytest.mark.parametrize("module", ["entry", "parser"])
def test_a_reader_gone_away_ends_the_command_silently_with_141(
    two_runs: list[str], module: str, argv: tuple[str, ...]
) -> None:
    """spec/cli.md: ``pisub list | head`` exits 141 silently — with or without the parser
    (typer alone would exit 1)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                _THROUGH.format(module=module),
                json.dumps([a.format(*two_runs) for a in argv]),
            ],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141
    assert proc.stderr.strip().startswith("TYPER ")  # nothing else said
