"""A run outlives its launcher: SIGKILL or SIGHUP of the launcher's whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker

LAUNCHER = textwrap.dedent("""
    import sys, time
    import pisub
    run = pisub.launch("slow", "survive")
    print(run.id, flush=True)
    time.sleep(300)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_run_survives_launcher_group_death(home: Path, make_agent: AgentMaker, sig: int) -> None:
    make_agent("slow", python="import time; time.sleep(1.0); print('finished after launcher died')")
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert launcher.stdout is not None
    run_id = launcher.stdout.readline().strip()
    os.killpg(launcher.pid, sig)
    launcher.wait(timeout=10)
    launcher.stdout.close()
    run = pisub.Run(run_id)
    result = run.wait(timeout=30)
    assert result.state == "complete", result.content[0].text
    assert result.details.results[0].output == "finished after launcher died\n"
