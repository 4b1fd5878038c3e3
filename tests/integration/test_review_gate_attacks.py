"""Review gates against reviewers that misbehave (issue 23): one that hangs, one that prints
no verdict, one that prints two. Each ends in a defined outcome and the gate fails closed —
never the favourable verdict of two. Real runs; the reviewer is an external CLI agent."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.runner.review import REVIEW_SLACK_S
from tests.conftest import AgentMaker, wait_for
from tests.helpers import run_events

# The task's line "SAY=<json>" (any number of them) becomes one verdict block each; HANG sleeps.
REVIEWER = """
import sys, time
task = sys.stdin.read()
if "HANG" in task:
    time.sleep(600)
print("I looked at it.")
for line in task.splitlines():
    if line.startswith("> SAY="):
        print("```review-verdict")
        print(line[len("> SAY="):])
        print("```")
"""

APPROVE = '{"verdict": "approve", "findings": []}'
REJECT = '{"verdict": "reject", "findings": [{"severity": "blocking", "message": "broken"}]}'

ASKS = {"level": "none", "review": {"required": True}}


def _gate(make_agent: AgentMaker, task: str, **reviewer: Any) -> Any:
    make_agent("reviewer", python=REVIEWER, args=None, acceptanceRole="read-only", **reviewer)
    make_agent("worker", command="true")
    run = pisub.launch("worker", task, acceptance=ASKS, review=True)
    result = run.wait(timeout=120)
    record = result.details.results[0].acceptance
    assert record is not None
    return result, record


@pytest.mark.parametrize(
    "says",
    [[REJECT, APPROVE], [APPROVE, REJECT], [APPROVE, APPROVE]],
    ids=["reject-then-approve", "approve-then-reject", "approve-twice"],
)
def test_a_reviewer_with_two_verdicts_decides_nothing(
    home: Path, make_agent: AgentMaker, says: list[str]
) -> None:
    result, record = _gate(make_agent, "work\n" + "".join(f"SAY={s}\n" for s in says))
    assert result.state == "failed", result.content[0].text
    assert record.evidence_status == "review-required", record
    check = record.checks[-1]
    assert check.kind == "review" and check.outcome == "failed"
    assert "2 review-verdict blocks" in (check.reason or "") and not check.findings


def test_a_reviewer_without_a_verdict_fails_the_gate_with_the_reason(
    home: Path, make_agent: AgentMaker
) -> None:
    result, record = _gate(make_agent, "work, no verdict asked")
    assert result.state == "failed" and record.evidence_status == "review-required"
    assert "no review-verdict block" in (record.checks[-1].reason or "")


@pytest.mark.serial  # bounds the elapsed time
def test_a_hung_reviewer_is_ended_at_its_timeout_and_the_gate_fails_closed(
    home: Path, make_agent: AgentMaker
) -> None:
    started = time.monotonic()
    result, record = _gate(make_agent, f"HANG\nSAY={APPROVE}\n", timeout=3)
    assert time.monotonic() - started < 90
    assert result.state == "failed" and record.evidence_status == "review-required", record
    check = record.checks[-1]
    assert "the reviewer ended failed" in (check.reason or ""), check
    assert check.run_id is not None and pisub.Run(check.run_id).status().state == "failed"


@pytest.mark.idle  # it waits ~20 s for pisub's own deadline; its bound has 30 s to spare
def test_a_reviewer_whose_runner_never_ends_is_not_waited_for_for_ever(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("reviewer", python=REVIEWER, args=None, acceptanceRole="read-only", timeout=2)
    make_agent("worker", command="true")
    run = pisub.launch("worker", "HANG", acceptance=ASKS, review=True)
    started = wait_for(lambda: run_events(run, "review.started"), timeout=60, what="the review to start")
    review = pisub.Run(str(started[0]["data"]["runId"]))
    runner = wait_for(lambda: review.status().pid, timeout=30, what="the reviewer's runner")
    os.kill(runner, signal.SIGSTOP)  # alive, never ending: its own deadline cannot fire
    try:
        began = time.monotonic()
        result = run.wait(timeout=120)
        assert time.monotonic() - began < 2 + 3 + REVIEW_SLACK_S + 30
        record = result.details.results[0].acceptance
        assert result.state == "failed" and record is not None and record.evidence_status == "review-required"
        assert "did not end within its timeout" in (record.checks[-1].reason or ""), record.checks[-1]
    finally:
        os.kill(runner, signal.SIGCONT)
    assert review.wait(timeout=60).state in ("stopped", "failed")  # asked to stop, it ends
