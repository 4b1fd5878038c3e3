"""Control of a chain's steps that have not started (session 32, F4/F5): a chain calls each step
only when the one before it has completed, so a later step has no entry in the workflow yet —
it is still known by its index and key (the chain's tasks). A steer or follow-up for it is
``scheduled`` and sent when it starts, a stop means it never starts (the chain ends there), an
interrupt fails, and an index the workflow does not have is named plainly.
Real coordinators, real child runs (external-cli workers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import control_json, final_receipt, gated_starts, gated_worker


@pytest.fixture
def gates(home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ``worker`` agent; the folder of its gates (tests.helpers.gated_worker)."""
    return gated_worker(make_agent, tmp_path, monkeypatch)


def _chain(tmp_path: Path, *tasks: tuple[str, str]) -> pisub.Run:
    """A chain of ``(key, task)`` steps of the worker, its first step running."""
    steps = tmp_path / "chain.json"
    steps.write_text(json.dumps([{"key": k, "agent": "worker", "task": t} for k, t in tasks]))
    proc = pisub_cli("run", "--json", "--chain", str(steps), check=True)
    run = pisub.Run(json.loads(proc.stdout)["runId"])
    wait_for(lambda: [str(s.status) for s in run.status().steps] == ["running"], 30, what="step 0 running")
    return run


def test_a_later_chain_step_takes_a_steer_scheduled_and_gets_it_when_it_starts(
    gates: Path, tmp_path: Path
) -> None:
    run = _chain(tmp_path, ("first", "gate first"), ("later", "gate later {previous}"))
    code, steer = control_json("steer", run.id, "--child", "later", "look at the tests")
    assert code == 0, steer
    assert (steer["state"], steer["targets"][0]["child"]) == ("scheduled", 1), steer
    assert "child 1 (later) has not started yet: sent to it when it starts" in steer["reason"]
    code, interrupt = control_json("interrupt", run.id, "--child", "1")
    assert code == 2 and "child 1 (later) has not started yet" in interrupt["reason"], interrupt
    code, missing = control_json("stop", run.id, "--child", "2")
    assert code == 2, missing
    assert "no child 2 (its children are 0 to 1, or their keys)" in missing["reason"], missing
    shown = pisub_cli("status", run.id, "--child", "later")
    assert shown.returncode == 1 and "has no run (it has not started yet)" in shown.stderr, shown.stderr

    (gates / "first").touch()  # later starts: the steer is sent into its inbox
    final = final_receipt(run, steer["requestId"])
    # an external CLI takes no steer: its runner's own answer comes back through the workflow
    assert final["state"] == "failed", final
    assert "steering is not supported by the external-cli runner" in final["reason"], final
    (gates / "later").touch()
    assert run.wait(timeout=60).state == "complete"
    assert gated_starts(gates) == ["gate first", "gate later did: gate first"]


def test_a_later_chain_step_stopped_before_it_starts_never_starts_and_ends_the_chain(
    gates: Path, tmp_path: Path
) -> None:
    run = _chain(tmp_path, ("first", "gate first"), ("later", "later"), ("third", "third"))
    _, steer = control_json("steer", run.id, "--child", "later", "hello")
    assert steer["state"] == "scheduled", steer
    # (attack 33: it said "kept for the next resume")
    shown = wait_for(lambda: "steer held" in (out := pisub_cli("status", run.id).stdout) and out, 30)
    assert "steer held for its child's start" in shown and "next resume" not in shown, shown
    code, stop = control_json("stop", run.id, "--child", "later")
    assert code == 0 and stop["state"] == "delivered", stop
    assert [(t["child"], t["state"]) for t in stop["targets"]] == [(1, "delivered")]
    failed = final_receipt(run, steer["requestId"])  # at once: what was held for it can never be sent
    assert failed["reason"] == "child 1: it never started: stopped by request before it started"
    assert not (gates / "first").exists()  # (before the first step could end)
    code, again = control_json("follow-up", run.id, "--child", "later", "more")
    assert code == 2 and "child 1 (later) was stopped before it started" in again["reason"], again

    (gates / "first").touch()
    result = run.wait(timeout=60)
    assert result.state == "failed"
    assert result.details.results[1].state == "stopped"
    assert "stopped by request before it started" in (result.details.results[1].error or "")
    assert [str(s.status) for s in run.status().steps] == ["complete", "stopped", "skipped"]
    assert gated_starts(gates) == ["gate first"]  # later never started, nor third
    failed = final_receipt(run, steer["requestId"])
    assert failed["reason"] == "child 1: it never started: stopped by request before it started"


def test_a_steer_held_for_a_later_chain_step_fails_when_the_workflow_ends_first(
    gates: Path, tmp_path: Path
) -> None:
    run = _chain(tmp_path, ("first", "gate first"), ("later", "later"))
    _, steer = control_json("steer", run.id, "--child", "later", "hello")
    assert steer["state"] == "scheduled", steer
    code, stopped = control_json("stop", run.id)
    assert code == 0 and stopped["state"] == "delivered", stopped
    failed = final_receipt(run, steer["requestId"])
    assert failed["reason"] == "child 1: it never started: the workflow ended before this child started"
    assert run.wait(timeout=60).state == "stopped"
    assert gated_starts(gates) == ["gate first"]


def test_the_python_api_names_a_later_step_by_key_and_refuses_a_request_no_runner_takes(
    gates: Path, tmp_path: Path
) -> None:
    """`run.stop(child="later")` wrote `"child": "later"` (the API took no key), which the
    runner rejected: the step ran. A key is resolved as the CLI resolves it; a request the
    runner would reject is refused before it is written."""
    run = _chain(tmp_path, ("first", "gate first"), ("later", "later"))
    with pytest.raises(pisub.PisubError, match=r"not a valid stop request: .*\$\.child"):
        run.send_stop(child="later")  # type: ignore[arg-type]
    assert not list((run.dir / "inbox" / "new").iterdir())
    _rid, receipt = run.stop(child="later", wait=10)
    assert receipt is not None and receipt.state == "delivered", receipt
    (gates / "first").touch()
    assert run.wait(timeout=60).state == "failed"
    assert [str(s.status) for s in run.status().steps] == ["complete", "stopped"]
    assert gated_starts(gates) == ["gate first"]


def test_a_child_whose_status_was_removed_is_settled_failed_naming_the_damage(
    gates: Path, tmp_path: Path
) -> None:
    """A child whose runner is gone and whose ``status.json`` was removed can never be read
    again: the workflow settles it as failed with the reason (as a child whose folder
    disappeared), and the chain ends — it never waits for it for ever."""
    import os
    import signal

    run = _chain(tmp_path, ("first", "gate first"), ("later", "gate later"))
    child = pisub.Run(run.status().steps[0].run_id or "")
    status = child.status()
    (child.dir / "status.json").unlink()  # (while its runner lives, the workflow waits for it)
    os.kill(status.pid or 0, signal.SIGKILL)
    os.killpg(status.steps[0].pgid or 0, signal.SIGKILL)
    ended = run.wait(timeout=60)
    assert ended.state == "failed", ended
    shown = pisub_cli("result", run.id)
    assert "status.json is missing: the run's folder is damaged" in shown.stdout + shown.stderr, shown
    assert gated_starts(gates) == ["gate first"]
