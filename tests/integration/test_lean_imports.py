"""The commands a user runs most — ``pisub run --agent NAME TASK``, ``pisub list``, ``pisub
status RUN --json`` — import only what they use: no parser (typer, click), no ``dataclasses`` and the
``inspect`` it pulls in, no ``typing_extensions`` (msgspec is imported without it:
:mod:`pisub.protocol.msgspec_lean`). Each of these costs milliseconds of every such command
(README, Performance); this holds the cut, it times nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker

HEAVY = ("typer", "click", "dataclasses", "inspect", "typing_extensions")

_THROUGH = """
import json, sys
sys.argv = ["pisub", *json.loads(sys.argv[1])]
import pisub.__main__ as entry
entry.exit_now = lambda exc: None  # (a launch skips the teardown: this finally must run)
try:
    entry.main()
finally:
    sys.stdout.flush()
    heavy = sorted(m for m in {heavy!r} if m in sys.modules)
    sys.__stderr__.write("\\nIMPORTED " + json.dumps(heavy) + "\\n")
"""


def _imported(*argv: str) -> tuple[int, str, list[str]]:
    """``pisub ARGV`` as the console script runs it: exit code, stdout, the heavy modules imported."""
    proc = subprocess.run(
        [sys.executable, "-c", _THROUGH.format(heavy=HEAVY), json.dumps(list(argv))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.endswith("_COMPLETE")},
    )
    *_, marker = proc.stderr.rstrip("\n").split("\n")
    assert marker.startswith("IMPORTED "), proc.stderr
    return proc.returncode, proc.stdout, json.loads(marker[len("IMPORTED ") :])


@pytest.fixture
def one_run(home: Path, make_agent: AgentMaker) -> str:
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    return run.id


@pytest.mark.parametrize(
    "argv",
    [
        ("list",),
        ("list", "--json"),
        ("list", "--state", "running", "--json"),
        ("status", "{run}", "--json"),
        ("run", "--agent", "quick", "lean"),
    ],
)
def test_the_common_commands_import_no_parser_dataclasses_or_typing_extensions(
    one_run: str, argv: tuple[str, ...]
) -> None:
    code, out, heavy = _imported(*(a.format(run=one_run) for a in argv))
    assert code == 0, out
    assert out.strip() or "running" in argv  # (no run is running)
    assert heavy == []


def test_msgspec_without_typing_extensions_decodes_as_before_and_leaves_it_importable(one_run: str) -> None:
    probe = """
import sys
from pisub.protocol.msgspec_lean import import_msgspec
import_msgspec()
assert "typing_extensions" not in sys.modules
import msgspec
from pisub.protocol.manifest import Manifest
from pisub.protocol.status import Status
import typing_extensions  # still importable, and the real one
assert typing_extensions.get_type_hints is not None
print(msgspec.json.encode(msgspec.json.decode(open(sys.argv[1], "rb").read(), type=Status)).decode())
print(msgspec.json.encode(msgspec.json.decode(open(sys.argv[2], "rb").read(), type=Manifest)).decode())
"""
    run = pisub.Run(one_run)
    files = [str(run.dir / "status.json"), str(run.dir / "manifest.json")]
    lean = subprocess.run([sys.executable, "-c", probe, *files], capture_output=True, text=True, check=True)
    usual = subprocess.run(
        [
            sys.executable,
            "-c",
            "import typing_extensions\n"
            + probe.replace('assert "typing_extensions" not', "assert 'typing_extensions'"),
            *files,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert lean.stdout == usual.stdout
    assert json.loads(lean.stdout.splitlines()[0])["runId"] == one_run


def test_a_launchs_handle_knows_the_manifest_it_wrote_and_it_equals_the_file(
    home: Path, make_agent: AgentMaker
) -> None:
    from pisub.store.runs import load_manifest

    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x", label="m1", timeout=30)
    known = run.manifest()
    assert known is run.manifest()  # read once
    assert known == load_manifest(run.paths)  # what the file says, field by field
    assert pisub.Run(run.id).manifest() == known
    flow = pisub.launch_parallel([{"agent": "quick", "task": "a"}, {"agent": "quick", "task": "b"}])
    assert flow.manifest() == load_manifest(flow.paths)
    flow.wait(timeout=60)
