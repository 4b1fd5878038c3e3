"""A warm runner is the launcher's own pisub: a ``pisub`` folder in the launcher's working
directory (another checkout, an older version, a planted one) is never imported as the runner
(``python -P -m pisub.runner``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

import pisub
from tests.conftest import AgentMaker, wait_for
from tests.helpers import stop_and_end


def test_a_pisub_folder_in_the_working_directory_is_not_the_runner(
    home: Path, tmp_path: Path, make_agent: AgentMaker
) -> None:
    make_agent("sleeper", command="sleep", args=["300"])
    planted, marker = _planted_pisub(tmp_path, "elsewhere", "__main__.py")
    entry = "import sys; from pisub.__main__ import main; sys.argv[0] = 'pisub'; main()"
    done = subprocess.run(
        # -P: the launcher is this pisub too (its own -c would put the folder on its path)
        [sys.executable, "-P", "-c", entry, "run", "--agent", "sleeper", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=planted,
        check=True,
    )
    run = pisub.Run(done.stdout.strip())
    assert not marker.exists()
    pid = run.status().pid
    assert pid is not None and "--warm-fd" in psutil.Process(pid).cmdline()  # the warm one took it
    stop_and_end(run)


def test_a_pisub_folder_in_a_workflows_working_directory_is_not_its_zygote(
    home: Path, tmp_path: Path, make_agent: AgentMaker
) -> None:
    """The zygote is this pisub whatever the workflow's working directory holds (it starts with
    ``python -P -m pisub.runner.zygote``, from the coordinator, which works in its run folder)."""
    make_agent("sleeper", command="sleep", args=["300"])
    planted, marker = _planted_pisub(tmp_path, "project", "zygote.py")
    run = pisub.launch_parallel([{"agent": "sleeper", "task": f"t{i}"} for i in range(3)], cwd=planted)
    wait_for(lambda: (s := run.status().steps) and all(x.pid for x in s), 60, what="3 children running")
    assert not marker.exists()
    stop_and_end(run)


def _planted_pisub(tmp_path: Path, folder: str, module: str) -> tuple[Path, Path]:
    """A folder ``tmp_path/folder`` holding a ``pisub`` package whose ``pisub/runner/module``
    only touches the returned marker file (and fails): the folder and the marker."""
    planted = tmp_path / folder
    (planted / "pisub" / "runner").mkdir(parents=True)
    (planted / "pisub" / "__init__.py").write_text("")
    (planted / "pisub" / "runner" / "__init__.py").write_text("")
    marker = tmp_path / "planted-ran"
    (planted / "pisub" / "runner" / module).write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit(1)\n"
    )
    return planted, marker
