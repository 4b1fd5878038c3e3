"""The run-mode contract: every mode a runner can run (:mod:`pisub.runner.modes`) keeps the same
promises — one child process (``single``) and a workflow's coordinator (``workflow``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import pisub
from pisub.api.client import launch_parallel
from pisub.store.mailbox import new_key
from tests.conftest import AgentMaker, wait_for, wait_no_processes
from tests.helpers import run_event_types

Launch = Callable[[], pisub.Run]


def _single() -> pisub.Run:
    return pisub.launch("sleeper", "x")


def _workflow() -> pisub.Run:
    return launch_parallel([{"agent": "sleeper", "task": "x"}, {"agent": "sleeper", "task": "y"}])


MODES = {"single": (_single, "single"), "workflow": (_workflow, "parallel")}


@pytest.fixture(params=sorted(MODES))
def mode(request: pytest.FixtureRequest, home: Path, make_agent: AgentMaker) -> tuple[Launch, str]:
    make_agent("sleeper", command="sleep", args=["300"])
    return MODES[request.param]


def test_a_launch_returns_once_the_runner_committed(mode: tuple[Launch, str]) -> None:
    launch, _ = mode
    run = launch()
    status = run.status()
    assert status.state == "running" and status.pid is not None and status.pid_start_ticks
    wait_for(lambda: run.status().inbox is not None, 10)  # watched just after the commit
    run.send_stop()
    run.wait(timeout=60)


def test_a_stop_gets_one_receipt_and_ends_the_run_whole(home: Path, mode: tuple[Launch, str]) -> None:
    launch, details_mode = mode
    run = launch()
    rid = run.send_stop(reason="contract")
    receipt = run.wait_for_receipt(rid, 30)
    assert receipt is not None and receipt.state == "delivered"
    result = run.wait(timeout=60)
    assert result.state == "stopped" and result.details.mode == details_mode
    assert run.status().state == "stopped"
    # run.finished is the runner's last word, just after its terminal status
    events = wait_for(lambda: (found := run_event_types(run))[-1] == "run.finished" and found, 10)
    assert events[0] == "run.created"
    assert sorted(p.name for p in (run.dir / "outbox").iterdir()) == [f"{rid}.json"]
    wait_no_processes(home)


def test_every_request_gets_exactly_one_receipt(mode: tuple[Launch, str]) -> None:
    launch, _ = mode
    run = launch()
    new = run.dir / "inbox" / "new"
    names = []
    for i in range(40):
        name = f"flood-{i:03d}.json"
        body = b'{"v":1,"type":"steer","message":"hi"}' if i % 2 else b'{"v":1,"type":"bogus"}'
        (run.dir / "inbox" / "tmp" / name).write_bytes(body)
        os.rename(run.dir / "inbox" / "tmp" / name, new / name)
        names.append(name)
    run.send_stop()
    run.wait(timeout=60)
    receipts = {p.name for p in (run.dir / "outbox").iterdir()}
    for name in names:
        assert new_key(name) + ".json" in receipts
    assert not [p for p in new.iterdir() if p.name.endswith(".json")]


def test_a_runner_killed_is_repaired_by_a_reader(home: Path, mode: tuple[Launch, str]) -> None:
    launch, details_mode = mode
    run = launch()
    pid = run.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    repaired = wait_for(lambda: (st := run.status()).state == "failed" and st, 15)
    assert repaired.error is not None and repaired.error.code == "SUBAGENT_FAILED"
    result = run.result()
    assert result is not None and result.state == "failed" and result.details.mode == details_mode
    late = run.dir / "inbox" / "new" / "late.json"
    late.write_bytes(b'{"v":1,"type":"stop"}')
    run.status()
    answered = run.receipt("late")
    assert answered is not None and answered.state == "failed"
    for status in pisub.list_runs(children=True):  # a workflow's children go on: stop them
        if not status.state.is_terminal:
            pisub.Run(status.run_id).send_stop()
            pisub.Run(status.run_id).wait(timeout=30)
    wait_no_processes(home)
