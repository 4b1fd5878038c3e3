"""What a local runner carries while it supervises one external CLI: its inbox watched by one
inotify descriptor in its own loop (no observer thread), and none of the modules only other
paths use (psutil, watchdog, the pi adapter)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import drop_request, run_receipts

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc")


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_a_runner_is_one_thread_watching_its_inbox_with_inotify(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleepy", command="sleep", args=["600"])
    run = pisub.launch("sleepy", "x")
    status = wait_for(lambda: (s := run.status()).inbox is not None and s, what="the inbox watch")
    assert status.inbox.watch == "inotify"
    pid = status.pid
    assert pid is not None
    # its descriptors include one inotify instance; its threads, only its main one
    links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert links.count("anon_inode:inotify") == 1, links
    assert os.listdir(f"/proc/{pid}/task") == [str(pid)]
    maps = _maps(pid)
    assert "_psutil_linux" not in maps  # (psutil's extension: the runner reads /proc itself)
    # a request is still answered (woken by the descriptor, or by the safety poll)
    drop_request(run, "hello.json", {"v": 1, "type": "steer", "message": "m"})
    wait_for(lambda: "hello" in run_receipts(run), what="the receipt")
    assert pisub_cli("stop", run.id).returncode == 0
    run.wait(timeout=30)
