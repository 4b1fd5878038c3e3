"""The low-severity leftovers of issue 29's outside attack (docs only), one test each; each
failed before its fix."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pisub.protocol.codec import encode, now_iso
from pisub.protocol.status import RunState, Status
from tests.conftest import pisub_cli

RUN_ID = "0123abcd-0000-4000-8000-000000000000"


def _one_line(proc: subprocess.CompletedProcess[str], code: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pisub: ") and lines[0].endswith(f"[{code}]"), proc.stderr
    return lines[0]


def _empty_run_folder(home: Path) -> Path:
    assert pisub_cli("list").returncode == 0  # the home, as pisub makes it
    folder = home / "runs" / RUN_ID
    folder.mkdir(mode=0o700)
    return folder


def test_control_of_an_empty_run_folder_answers_as_status_does(home: Path) -> None:
    """F10: a run folder with no files is a broken run for ``stop`` (and every request) as for
    ``status``: the same one line, not a storage failure."""
    folder = _empty_run_folder(home)
    status = _one_line(pisub_cli("status", RUN_ID), "RUN_NOT_FOUND")
    for command in (["stop"], ["interrupt"], ["stop", "--wait", "0"]):
        proc = pisub_cli(*command, RUN_ID, timeout=20)
        assert proc.returncode == 1
        line = _one_line(proc, "RUN_NOT_FOUND")
        assert line == status or (command == ["interrupt"] and "manifest.json does not exist" in line)
    assert sorted(p.name for p in folder.iterdir()) == [], "nothing was written"


def test_a_request_to_a_run_folder_without_its_inbox_names_the_problem(home: Path) -> None:
    """F10: a readable status but no inbox: a protocol problem naming the folder, not IO_ERROR."""
    folder = _empty_run_folder(home)
    now = now_iso()
    status = Status(
        v=1, run_id=RUN_ID, state=RunState.RUNNING, agent="x", runner="external", host="h",
        started_at=now, updated_at=now,
    )  # fmt: skip
    (folder / "status.json").write_bytes(encode(status))
    proc = pisub_cli("stop", "--wait", "0", RUN_ID, timeout=20)
    assert "has no inbox" in _one_line(proc, "PROTOCOL_ERROR"), proc.stderr
