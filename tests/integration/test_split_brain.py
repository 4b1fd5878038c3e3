"""The split brain of ``../shared/research/scale-out.md`` §4.2, reproduced on one machine: a
"second node" (``unshare``: its own host name, pid namespace and boot id) reads the home through a
second FUSE mount (``bindfs``, where the runner's lock is invisible). Before placements, that
reader proved a live runner dead and repaired its run ``failed`` while it ran on; now it cannot
prove anything about another host and repairs nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.protocol.status import RunState
from tests.conftest import AgentMaker, wait_for

pytestmark = pytest.mark.root  # bindfs and a bind mount over boot_id

SECOND_NODE = """
set -e
hostname node2
printf '%s\\n' "$BOOT_ID" > "$BOOT_FILE"
mount --bind "$BOOT_FILE" /proc/sys/kernel/random/boot_id
exec "$@"
"""


@pytest.fixture
def second_mount(home: Path, tmp_path: Path) -> Iterator[Path]:
    """The home seen through a second mount (bindfs)."""
    if os.geteuid() != 0 or shutil.which("bindfs") is None or shutil.which("unshare") is None:
        pytest.skip("needs root, bindfs (Debian: bindfs) and unshare")
    home.mkdir(mode=0o700, exist_ok=True)
    mount = tmp_path / "node2-home"
    mount.mkdir()
    subprocess.run(["bindfs", str(home), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["fusermount", "-u", "-z", str(mount)], check=False)


def _status_from_node2(mount: Path, run_id: str, tmp_path: Path, *, text: bool = False) -> tuple[str, Any]:
    """``pisub status --json`` (``text``: without ``--json``) run on the second node through the
    second mount: (host, the status, or its text)."""
    env = {**os.environ, "PISUB_HOME": str(mount), "BOOT_ID": str(uuid.uuid4())}
    env["BOOT_FILE"] = str(tmp_path / "node2-boot-id")
    argv = ["unshare", "--uts", "--pid", "--mount", "--fork", "--mount-proc", "sh", "-c", SECOND_NODE, "sh"]
    code = (
        "import socket, subprocess, sys; print(socket.gethostname(), flush=True);"
        "sys.exit(subprocess.call(sys.argv[1:]))"
    )
    argv += [sys.executable, "-c", code, sys.executable, "-m", "pisub", "status", run_id]
    argv += [] if text else ["--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    host, _, status = proc.stdout.partition("\n")
    return host, status if text else json.loads(status)


def test_a_reader_on_another_node_through_another_mount_repairs_nothing(
    second_mount: Path, make_agent: AgentMaker, tmp_path: Path
) -> None:
    # It ticks until the test has looked from node2 (a fixed 3 s was over before a loaded
    # machine's second look).
    release = tmp_path / "release"
    ticker = (
        f"import os, time\nwhile not os.path.exists({str(release)!r}):\n"
        "    print('t', flush=True); time.sleep(0.1)\n"
    )
    make_agent("ticker", python=ticker)
    run = pisub.launch("ticker", "go")
    wait_for(lambda: run.status().state == RunState.RUNNING, timeout=30, what="running")
    host, seen = _status_from_node2(second_mount, run.id, tmp_path)
    assert host == "node2"
    assert seen["state"] == "running"  # not "failed": nothing proves the runner dead from there
    _, shown = _status_from_node2(second_mount, run.id, tmp_path, text=True)
    assert "this host cannot prove whether the runner (on " in shown
    release.touch()
    assert run.wait(timeout=60).state == "complete"
    assert "run.repaired" not in [e.type for e in run.events()]
    assert json.loads((run.dir / "result.json").read_text())["state"] == "complete"
