"""Crash injection, lost notifications and launcher death: nothing is lost.

CI runs a few rounds; ``--stress`` runs the long mode (200 crash rounds) and prints counts.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import pisub
from pisub.core.fsio import iter_jsonl_lines
from pisub.core.locks import is_held
from pisub.protocol import Manifest, Result, Status, decode
from pisub.protocol.control import Receipt
from pisub.store.mailbox import InboxClosed
from tests.conftest import AgentMaker, pid_alive, pisub_cli, wait_for, wait_no_processes

CHATTY = """
import os, subprocess, sys, time
subprocess.Popen(["sleep", "300"], start_new_session=True)
n = 0
while True:
    n += 1
    sys.stdout.write(f"line {n} " + "x" * 200 + "\\n")
    sys.stdout.flush()
    time.sleep(0.001)
"""


def _parses(run: pisub.Run) -> None:
    """Every file a reader may read decodes strictly (a torn last event line is allowed)."""
    decode((run.dir / "manifest.json").read_bytes(), Manifest, "manifest")
    decode((run.dir / "status.json").read_bytes(), Status, "status")
    decode((run.dir / "result.json").read_bytes(), Result, "result")
    for receipt in (run.dir / "outbox").glob("*.json"):
        decode(receipt.read_bytes(), Receipt, receipt.name)
    for _, line in iter_jsonl_lines((run.dir / "events.jsonl").read_bytes()):
        json.loads(line)


def _dead(run: pisub.Run, pid: int) -> bool:
    return not pid_alive(pid) and not is_held(run.dir / "runner.lock")


def test_kill9_at_random_moments_loses_no_request_and_leaves_no_process(
    home: Path, make_agent: AgentMaker, request: pytest.FixtureRequest
) -> None:
    rounds = 200 if request.config.getoption("--stress") else 5
    make_agent("chatty", python=CHATTY)
    rng = random.Random(1234)
    counts: Counter[str] = Counter()
    for _ in range(rounds):
        run = pisub.launch("chatty", "x")
        runner = run.status().pid
        assert runner is not None
        written: list[str] = []
        stop = threading.Event()

        def write(run: pisub.Run = run, written: list[str] = written, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                try:
                    written.append(run.send_steer("hello") if len(written) % 3 else run.send_stop(child=7))
                    time.sleep(0.002)
                except InboxClosed:
                    counts["withdrawn or refused (closed inbox)"] += 1
                    time.sleep(0.01)

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(rng.uniform(0.0, 0.4))
        os.kill(runner, signal.SIGKILL)
        wait_for(functools.partial(_dead, run, runner), what="the runner to die")
        status = run.status()  # crash detection and repair, while the writer still writes
        stop.set()
        writer.join()
        run.status()
        assert status.state == "failed"
        receipts = {
            p.stem: decode(p.read_bytes(), Receipt, p.name) for p in (run.dir / "outbox").glob("*.json")
        }
        for rid in written:
            assert rid in receipts, f"request {rid} has no receipt"
            assert receipts[rid].state.is_final, receipts[rid]
        assert not list((run.dir / "inbox" / "new").glob("*.json"))
        counts["requests"] += len(written)
        counts.update(f"receipt {r.state}" for r in receipts.values())
        _parses(run)
        wait_no_processes(home)
        counts["rounds"] += 1
    print(f"\ncrash injection: {dict(counts)}")
    assert counts["rounds"] == rounds


def test_inbox_flood_overflows_inotify_and_every_request_is_answered(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("sleepy", command="sleep", args=["600"])
    run = pisub.launch("sleepy", "x")
    total = 20_000
    tmp, new = run.dir / "inbox" / "tmp", run.dir / "inbox" / "new"
    for i in range(total):
        name = f"{i:08d}.json"
        (tmp / name).write_bytes(b'{"v":1,"type":"steer","message":"m"}')
        os.rename(tmp / name, new / name)

    def receipts() -> int:  # a batch's temp files in flight start with "." and end in ".tmp"
        return len(list((run.dir / "outbox").glob("*.json")))

    wait_for(lambda: receipts() >= total, timeout=240, interval=0.2, what="20,000 receipts")
    assert receipts() == total
    assert not os.listdir(new)
    status = run.status()
    assert status.state == "running"
    wait_for(lambda: run.status().steering.requested == total, what="the coalesced ledger")
    assert pisub_cli("stop", run.id).returncode == 0
    run.wait(timeout=30)


LAUNCHER = """
import pisub, sys
pisub.launch("short", "x")
"""


def test_launcher_death_mid_launch(
    home: Path, make_agent: AgentMaker, request: pytest.FixtureRequest
) -> None:
    rounds = 40 if request.config.getoption("--stress") else 8
    make_agent("short", python="import time; time.sleep(0.3); print('ok')")
    rng = random.Random(99)
    for n in range(rounds):
        launcher = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.0, 0.5))
        os.killpg(launcher.pid, signal.SIGKILL if n % 2 else signal.SIGHUP)
        launcher.wait()

    def settled() -> bool:
        listed = [json.loads(line) for line in pisub_cli("list", "--json", check=True).stdout.splitlines()]
        return all(s["state"] in ("complete", "failed") for s in listed)

    wait_for(settled, timeout=60, interval=0.3, what="every launched run to end")
    # A launcher killed while creating its run may leave runs/.creating-<id>: readers never see
    # it, and gc sweeps it.
    states = Counter(json.loads(line)["state"] for line in pisub_cli("list", "--json").stdout.splitlines())
    print(f"\nlauncher death: {dict(states)} of {rounds} launches")
    assert set(states) <= {"complete", "failed"}
    wait_no_processes(home)
