"""Control of a workflow's children that have not started (issue 25, audit #123 and #126): a
stop ends a queued child — it never starts, the workflow sees it ``stopped`` — and a steer or
follow-up is ``scheduled``, sent into the child's inbox when it starts, failed with a reason if
it never does. Exactly one receipt per request, also when the child starts as the request comes.
Real coordinators, real child runs (external-cli workers; the real pi in test_pi_workflows.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.client import launch_workflow, resume_workflow
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import (
    control_json,
    drop_request,
    final_receipt,
    first_and_later,
    gated_starts,
    gated_worker,
    run_receipts,
    write_script,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gates(home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ``worker`` agent; the folder of its gates (tests.helpers.gated_worker)."""
    return gated_worker(make_agent, tmp_path, monkeypatch)


def _states(run: pisub.Run) -> list[str]:
    return [str(s.status) for s in run.status().steps]


def _two(tmp_path: Path, later: str = "later") -> pisub.Run:
    """``first`` runs (until its gate opens), ``later`` is queued behind it (concurrency 1)."""
    run = launch_workflow(first_and_later(tmp_path, "worker", "gate first", later), concurrency=1)
    wait_for(lambda: _states(run) == ["running", "queued"], 30, what="first running, later queued")
    return run


def test_a_queued_child_stopped_never_starts_and_its_workflow_sees_it_stopped(
    gates: Path, tmp_path: Path
) -> None:
    run = _two(tmp_path)
    code, receipt = control_json("stop", run.id, "--child", "later")
    assert code == 0, receipt
    assert receipt["state"] == "delivered" and receipt["deliveryStatus"] == "delivered"
    assert [(t["child"], t["state"]) for t in receipt["targets"]] == [(1, "delivered")]
    assert _states(run) == ["running", "stopped"]
    (gates / "first").touch()
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert [row[:3] for row in json.loads(result.content[0].text)] == [
        ["first", "complete", True],
        ["later", "stopped", False],
    ]
    later = result.details.results[1]
    assert later.state == "stopped" and later.run_id is None
    assert later.error is not None and "stopped by request before it started" in later.error
    assert gated_starts(gates) == ["gate first"]  # later never started
    assert not [s for s in pisub.list_runs(children=True) if s.key == "later"]
    assert run_receipts(run)[receipt["requestId"]] == receipt  # its one receipt, as answered


def test_a_steer_and_a_follow_up_to_a_queued_child_are_scheduled_then_answered_when_it_starts(
    gates: Path, tmp_path: Path
) -> None:
    run = _two(tmp_path, later="gate later")
    code, steer = control_json("steer", run.id, "--child", "later", "look at the tests")
    assert code == 0, steer
    assert (steer["state"], steer["deliveryStatus"]) == ("scheduled", "queued")
    assert steer["targets"][0]["state"] == "scheduled"
    assert "child 1 (later) has not started yet: sent to it when it starts" in steer["reason"]
    code, follow = control_json("follow-up", run.id, "--child", "1", "and then the docs")
    assert code == 0 and follow["state"] == "scheduled", follow
    wait_for(
        lambda: [e.state for e in run.status().steering.recent] == ["scheduled", "scheduled"],
        10,
        what="the ledger",
    )

    (gates / "first").touch()  # later starts: both are sent into its inbox
    for rid in (steer["requestId"], follow["requestId"]):
        final = final_receipt(run, rid)
        # an external CLI takes no steer: its runner's own answer comes back through the workflow
        assert final["state"] == "failed", final
        assert "steering is not supported by the external-cli runner" in final["reason"], final
    # the workflow's status names the child's run once its coalesced write lands
    started = wait_for(lambda: run.status().steps[1].run_id, 30, what="later's run in the workflow's status")
    child = pisub.Run(started)
    assert {r["source"] for r in _requests(child)} == {f"workflow {run.id}"}
    (gates / "later").touch()
    assert run.wait(timeout=60).state == "complete"


def _requests(run: pisub.Run) -> list[dict[str, Any]]:
    return [json.loads(p.read_bytes()) for p in (run.dir / "inbox" / "cur").glob("*.json")]


def test_a_scheduled_request_fails_with_a_reason_when_its_child_never_starts(
    gates: Path, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        """
        async def main(runs, state, args):
            calls = [{"key": k, "agent": "worker", "task": "gate " + k} for k in ("first", "b", "c")]
            return [r.state for r in await runs.all(calls)]
        """,
    )
    run = launch_workflow(script, concurrency=1)
    wait_for(lambda: _states(run) == ["running", "queued", "queued"], 30)
    _, to_b = control_json("steer", run.id, "--child", "b", "hello b")
    _, to_c = control_json("follow-up", run.id, "--child", "c", "hello c")
    assert (to_b["state"], to_c["state"]) == ("scheduled", "scheduled")

    code, stop_b = control_json("stop", run.id, "--child", "b")
    assert code == 0 and stop_b["state"] == "delivered", stop_b
    b = final_receipt(run, to_b["requestId"])
    assert b["state"] == "failed" and b["deliveryStatus"] == "queued"
    assert b["reason"] == "child 1: it never started: stopped by request before it started"

    code, stopped = control_json("stop", run.id)  # the whole workflow: c never starts
    assert code == 0 and stopped["state"] == "delivered", stopped
    c = final_receipt(run, to_c["requestId"])
    assert c["state"] == "failed"
    assert c["reason"] == "child 2: it never started: the workflow ended before this child started"
    assert run.wait(timeout=60).state == "stopped"
    assert gated_starts(gates) == ["gate first"]
    ledger = run.status().steering  # final: written before the result
    assert ledger.failed == 2 and ledger.delivered == 2


def test_only_a_stop_or_a_steer_is_widened_to_children_that_have_not_started(
    gates: Path, tmp_path: Path
) -> None:
    run = _two(tmp_path)
    code, interrupt = control_json("interrupt", run.id, "--child", "later")
    assert code == 2 and interrupt["state"] == "failed", interrupt
    assert "child 1 (later) has not started yet" in interrupt["reason"]
    # a queued child holds at most 20 requests for its start: the next is refused
    for n in range(20):
        drop_request(run, f"f-{n:02d}.json", {"v": 1, "type": "follow_up", "child": 1, "message": f"m{n}"})
    drop_request(run, "f-20.json", {"v": 1, "type": "follow_up", "child": 1, "message": "one too many"})
    wait_for(lambda: len(run_receipts(run)) == 22, 30, what="every receipt")
    receipts = run_receipts(run)
    assert [receipts[f"f-{n:02d}"]["state"] for n in range(20)] == ["scheduled"] * 20
    assert receipts["f-20"]["state"] == "failed"
    assert "already holds 20 requests for its start" in receipts["f-20"]["reason"]

    _, stop = control_json("stop", run.id, "--child", "later")
    assert stop["state"] == "delivered"
    code, again = control_json("stop", run.id, "--child", "later")  # it has ended now
    assert code == 2 and again["reason"] == "child 1 (later) has already ended", again
    code, missing = control_json("stop", run.id, "--child", "7")
    assert code == 2 and "no child 7" in missing["reason"], missing
    receipts = run_receipts(run)
    assert {receipts[f"f-{n:02d}"]["state"] for n in range(20)} == {"failed"}
    (gates / "first").touch()
    assert run.wait(timeout=60).state == "complete"
    assert gated_starts(gates) == ["gate first"]


def test_a_stop_and_a_steer_for_a_child_that_is_starting_wait_for_its_start(
    gates: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's runner is held (SIGSTOP) just before its startup commit: the child is
    ``pending`` — its start journaled, its run created, not yet running. A stop and a steer
    that come then are held and sent when it runs; each gets exactly one final receipt."""
    latch = tmp_path / "latch"
    latch.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "faultinject"), str(ROOT)]))
    monkeypatch.setenv("PISUB_FAULT_AT", "launch.before-commit")
    monkeypatch.setenv("PISUB_FAULT_KEY", "later")
    monkeypatch.setenv("PISUB_FAULT_LATCH", str(latch))
    run = launch_workflow(first_and_later(tmp_path, "worker", "gate first", "gate later"), concurrency=1)
    wait_for(lambda: _states(run) == ["running", "queued"], 30)
    (gates / "first").touch()
    fired = latch / "launch.before-commit"
    wait_for(lambda: fired.is_file() and fired.read_text(), 30, what="later's runner to hold")
    runner = int(fired.read_text())
    try:
        wait_for(lambda: _states(run) == ["complete", "pending"], 10, what="later starting")
        drop_request(run, "stop-later.json", {"v": 1, "type": "stop", "child": 1})
        drop_request(run, "steer-later.json", {"v": 1, "type": "steer", "child": 1, "message": "hi"})
        wait_for(lambda: len(run_receipts(run)) == 2, 30, what="the first receipts")
        receipts = run_receipts(run)
        assert receipts["stop-later"]["state"] == "pending"
        assert receipts["steer-later"]["state"] == "scheduled"
    finally:
        os.kill(runner, signal.SIGCONT)
    stop, steer = final_receipt(run, "stop-later"), final_receipt(run, "steer-later")
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert [row[1] for row in json.loads(result.content[0].text)] == ["complete", "stopped"]
    assert stop["state"] == "delivered", stop
    assert steer["state"] == "failed", steer  # the child takes no steer, or it was stopped first
    (later,) = [s for s in pisub.list_runs(children=True) if s.key == "later"]
    assert later.state == "stopped"  # its run was made: its own runner stopped it
    assert set(run_receipts(run)) == {"stop-later", "steer-later"}


def test_stops_racing_the_starts_of_their_children_get_one_receipt_that_says_what_happened(
    gates: Path, tmp_path: Path
) -> None:
    """Stops written while children queue, start, run and end one after another: every stop has
    exactly one final receipt, a child stopped before its start never ran, and a ``delivered``
    stop's child is ``stopped`` (or was ending by itself as the stop came)."""
    keys = [f"k{i}" for i in range(8)]
    script = write_script(
        tmp_path,
        f"""
        async def main(runs, state, args):
            calls = [{{"key": k, "agent": "worker", "task": "sleep 0.3 " + k}} for k in {keys!r}]
            return [r.state for r in await runs.all(calls)]
        """,
    )
    run = launch_workflow(script, concurrency=1)
    wait_for(lambda: len(run.status().steps) == len(keys), 30)
    for i in range(1, len(keys)):
        drop_request(run, f"stop-{i}.json", {"v": 1, "type": "stop", "child": i})
        subprocess.run(["sleep", "0.15"], check=True)  # a stop every 0.15 s, a child every 0.3 s
    result = run.wait(timeout=90)
    assert result.state == "complete", result.content[0].text
    receipts = run_receipts(run)
    assert set(receipts) == {f"stop-{i}" for i in range(1, len(keys))}
    started = {line.split()[-1] for line in gated_starts(gates)}
    runs = {s.key for s in pisub.list_runs(children=True) if s.parent_run_id == run.id}
    # A run made is a child started; one whose stop came within milliseconds of its start may
    # be ended before its agent wrote its line (its run then says stopped).
    assert started <= runs
    for single in result.details.results:
        if single.key in runs - started:
            assert single.state == "stopped", single
    for i, single in enumerate(result.details.results[1:], start=1):
        receipt = receipts[f"stop-{i}"]
        assert receipt["state"] in ("delivered", "failed"), receipt
        before = single.error is not None and "stopped by request before it started" in single.error
        assert before == (single.run_id is None), single
        if before:
            assert receipt["state"] == "delivered" and keys[i] not in started
        if receipt["state"] == "delivered":
            assert single.state in ("stopped", "complete"), single
        else:
            assert single.state == "complete", (receipt, single)  # it ended before the stop came


def test_a_scheduled_request_of_a_coordinator_that_dies_is_answered_failed_by_the_repair(
    gates: Path, tmp_path: Path
) -> None:
    run = _two(tmp_path)
    _, steer = control_json("steer", run.id, "--child", "later", "hello later")
    assert steer["state"] == "scheduled"
    coordinator = run.status().pid
    assert coordinator is not None
    os.kill(coordinator, signal.SIGKILL)
    wait_for(lambda: run.status().state == "failed", 30, what="the coordinator's repair")
    final = final_receipt(run, steer["requestId"])
    assert final["state"] == "failed" and "died" in (final["reason"] or ""), final
    (gates / "first").touch()  # its running child goes on under its own runner, and ends
    (first,) = [s for s in pisub.list_runs(children=True) if s.key == "first"]
    assert pisub.Run(first.run_id).wait(timeout=60).state == "complete"
    assert gated_starts(gates) == ["gate first"]


def test_a_queued_child_stopped_stays_stopped_when_its_workflow_is_resumed(
    gates: Path, tmp_path: Path
) -> None:
    run = _two(tmp_path)
    assert control_json("stop", run.id, "--child", "later")[1]["state"] == "delivered"
    assert control_json("interrupt", run.id)[1]["state"] == "delivered"  # first is paused
    assert run.wait(timeout=60).state == "paused"
    (gates / "first").touch()
    again = resume_workflow(run.id)
    result = again.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert [row[:3] for row in json.loads(result.content[0].text)] == [
        ["first", "complete", True],
        ["later", "stopped", False],  # its stop is its key's result: never started
    ]
    assert gated_starts(gates) == ["gate first", "gate first"]


def test_a_task_launch_child_is_named_by_its_key_before_its_workflow_wrote_a_step(gates: Path) -> None:
    """Right after `pisub run --task ...` the coordinator has not written its steps yet: the key
    of a parallel task is known from the launch (task-N), and its steer is scheduled, not refused."""
    tasks = ("--task", "worker=gate first", "--task", "worker=two")
    proc = pisub_cli("run", "--json", "--concurrency", "1", *tasks, check=True)
    run = pisub.Run(json.loads(proc.stdout)["runId"])
    code, steer = control_json("steer", run.id, "--child", "task-2", "hi")
    assert code == 0 and steer["state"] == "scheduled", steer
    assert steer["targets"][0]["child"] == 1
    (gates / "first").touch()
    assert final_receipt(run, steer["requestId"])["state"] == "failed"  # an external CLI takes no steer
    assert run.wait(timeout=60).state == "complete"
