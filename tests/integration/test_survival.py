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


# The child finishes only once the test has killed the launcher (it waits for a file the test
# creates afterwards), so a run that ended before the launcher died cannot pass for one that survived.
SLOW = """
import os, time
go = os.environ["PISUB_RUN_DIR"] + "/go"
while not os.path.exists(go):
    time.sleep(0.01)
print('finished after launcher died')
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_run_survives_launcher_group_death(home: Path, make_agent: AgentMaker, sig: int) -> None:
    make_agent("slow", python=SLOW)
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert launcher.stdout is not None
    run_id = launcher.stdout.readline().strip()
    os.killpg(launcher.pid, sig)
    launcher.wait(timeout=10)
    launcher.stdout.close()
    run = pisub.Run(run_id)
    assert run.status().state == "running", "the child waits for the go after the launcher died"
    (run.dir / "go").write_text("")
    result = run.wait(timeout=30)
    assert result.state == "complete", result.content[0].text
    assert result.details.results[0].output == "finished after launcher died\n"
