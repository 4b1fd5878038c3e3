"""The Slurm backend when Slurm's own clients fail — as for an unprivileged user who cannot read
``slurm.conf`` (they then say why once and retry for 60 s): the launch fails in one line that
carries what the client said, and the run, once Slurm proves no job of it lives, is repaired
``failed`` with that cause. Fake ``sbatch``/``squeue`` on PATH; no cluster, no root needed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import pisub
from pisub.backends import slurm
from pisub.errors import LaunchFailed
from pisub.protocol.status import RunState
from tests.conftest import AgentMaker

SAID = "sbatch: error: s_p_parse_file: cannot stat file /etc/slurm/slurm.conf: Permission denied"

HANGS = f"""#!/bin/sh
echo "{SAID}, retrying in 1sec up to 60sec" >&2
exec sleep 60
"""


def _tools(folder: Path, **scripts: str) -> None:
    folder.mkdir(exist_ok=True)
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_hanging_sbatch_fails_the_launch_with_what_it_said(
    home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "slurm-bin"
    _tools(bin_dir, sbatch=HANGS, squeue=HANGS, scancel=HANGS)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 1.0)
    make_agent("quick", python="print('hi')")
    with pytest.raises(LaunchFailed) as caught:
        pisub.launch("quick", "x", backend="slurm")
    message = caught.value.message
    assert "Slurm did not accept the run: sbatch did not answer within 1 s" in message
    assert SAID in message, "what sbatch said before it hung is the diagnosis"
    (status,) = pisub.list_runs()
    run = pisub.Run(status.run_id)
    assert "Permission denied" in (run.dir / "runner.log").read_text()
    # squeue cannot answer either: whether a job of it lives is not proven, so it is not repaired
    assert run.status().state == RunState.STARTING
    _tools(bin_dir, squeue="#!/bin/sh\nexit 0\n")  # Slurm answers: no such job
    result = run.wait(timeout=30)
    assert result.state == "failed" and result.details.error is not None
    assert "Slurm did not accept the run" in result.details.error.message
    assert SAID in result.details.error.message, "the repair keeps the cause"
