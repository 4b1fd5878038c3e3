"""``acceptance: "auto"`` resolves through the inference table (row by row), and review gates
run a real reviewer run whose fenced verdict decides ``reviewed`` / ``rejected``. External
agents here (a reviewer is any agent); the same with the real pi is in test_pi_acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pisub
from pisub.acceptance.infer import TABLE, Role, Setting, infer, role_of
from pisub.acceptance.review import parse, rejection
from pisub.api.client import launch_parallel, launch_workflow
from pisub.errors import InvalidInput
from pisub.protocol.acceptance import AcceptanceRole, Level
from tests.conftest import AgentMaker, pisub_cli, wait_for
from tests.helpers import run_events

REVIEWER = """
import sys
task = sys.stdin.read()
verdict = task.split("VERDICT=", 1)[1].splitlines()[0] if "VERDICT=" in task else None
if "HANG" in task:
    import time
    time.sleep(600)
print("I looked at it.")
if verdict is not None:
    print("```review-verdict")
    print(verdict)
    print("```")
"""


@pytest.fixture
def reviewer(make_agent: AgentMaker) -> str:
    make_agent("reviewer", python=REVIEWER, args=None, acceptanceRole="read-only")
    return "reviewer"


# == the table ==========================================================================


@pytest.mark.parametrize(
    ("role", "setting", "level", "review"),
    [
        (Role.READ_ONLY, Setting.DIRECT, Level.NONE, False),
        (Role.READ_ONLY, Setting.DECLARED, Level.NONE, False),
        (Role.READ_ONLY, Setting.DYNAMIC, Level.NONE, False),
        (Role.UNKNOWN, Setting.DIRECT, Level.NONE, False),
        (Role.UNKNOWN, Setting.DECLARED, Level.NONE, False),
        (Role.UNKNOWN, Setting.DYNAMIC, Level.NONE, False),
        (Role.WRITER, Setting.DIRECT, Level.CHECKED, False),
        (Role.WRITER, Setting.DECLARED, Level.CHECKED, False),
        (Role.WRITER, Setting.DYNAMIC, Level.CHECKED, True),
    ],
)
def test_each_row_of_the_inference_table(role: Role, setting: Setting, level: Level, review: bool) -> None:
    got = infer(role, setting, "reviewer")
    assert not got.explicit and got.spec.level is level
    assert (got.spec.review is not None and got.spec.review.required) is review
    assert got.spec.reason is not None and got.spec.reason.startswith("inferred: ")
    assert len(TABLE) == len(Role) * len(Setting), "every pair has a row"


def test_a_review_row_without_a_reviewer_is_checked_and_says_why() -> None:
    got = infer(Role.WRITER, Setting.DYNAMIC, None, review_runs=True)
    assert got.spec.level is Level.CHECKED and got.spec.review is None
    assert "no reviewer agent" in (got.spec.reason or "")


@pytest.mark.parametrize("setting", list(Setting))
def test_review_runs_are_opt_in_and_then_cover_every_writer(setting: Setting) -> None:
    off = infer(Role.WRITER, setting, "reviewer")
    on = infer(Role.WRITER, setting, "reviewer", review_runs=True)
    assert off.reviewer is None and on.spec.review is not None and on.spec.review.agent == "reviewer"
    if setting is Setting.DYNAMIC:  # the seed's row: recorded as required, not run
        assert off.spec.review is not None and off.spec.review.agent is None
        assert "review runs are off" in (off.spec.reason or "")
    else:
        assert off.spec.review is None
    assert infer(Role.READ_ONLY, setting, "reviewer", review_runs=True).spec.review is None


@pytest.mark.parametrize(
    ("declared", "runner", "tools", "role"),
    [
        (None, "pi", None, Role.WRITER),  # pi's default tools write
        (None, "pi", ["read", "grep"], Role.READ_ONLY),
        (None, "pi", ["read", "bash"], Role.WRITER),
        (None, "pi", [], Role.READ_ONLY),
        (None, "external-cli", None, Role.UNKNOWN),
        (AcceptanceRole.WRITER, "external-cli", None, Role.WRITER),
        (AcceptanceRole.READ_ONLY, "pi", None, Role.READ_ONLY),  # the declared role wins over tools
        (AcceptanceRole.WRITER, "pi", ["read"], Role.WRITER),
    ],
)
def test_the_role_of_an_agent(
    declared: AcceptanceRole | None, runner: str, tools: list[str] | None, role: Role
) -> None:
    assert role_of(declared, runner, tools) is role


# == inference at launch ====================================================================


def test_auto_is_inferred_at_launch_and_explicit_values_win(home: Path, make_agent: AgentMaker) -> None:
    make_agent("ext", command="true")
    make_agent("writer", command="true", acceptanceRole="writer")
    ext = pisub.launch("ext", "x")
    writer = pisub.launch("writer", "x", acceptance="auto")
    explicit = pisub.launch("writer", "x", acceptance={"level": "none", "reason": "a quick probe"})
    for run in (ext, writer, explicit):
        run.wait(timeout=30)
    levels = {}
    for run in (ext, writer, explicit):
        accepted = run.manifest().acceptance
        assert accepted is not None
        levels[run.id] = (accepted.spec.level, accepted.explicit)
    assert levels[ext.id] == (Level.NONE, False)
    assert levels[writer.id] == (Level.CHECKED, False)
    assert levels[explicit.id] == (Level.NONE, True)
    # an inferred gate that is not met is reported, and the run still completes
    result = writer.result()
    assert result is not None and result.state == "complete"
    record = result.details.results[0].acceptance
    assert record is not None and record.evidence_status == "rejected" and not record.explicit


def test_config_can_turn_inference_off(home: Path, make_agent: AgentMaker) -> None:
    make_agent("writer", command="true", acceptanceRole="writer")
    (home / "config.toml").write_text("[acceptance]\ninfer = false\n")
    run = pisub.launch("writer", "x")
    assert run.manifest().acceptance is None
    assert run.wait(timeout=30).details.results[0].acceptance is None
    shown = pisub_cli("config", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {row["name"]: row for row in json.loads(shown.stdout)}
    assert rows["acceptance.infer"]["value"] is False and rows["acceptance.infer"]["source"] == "config.toml"
    assert rows["acceptance.reviewer"]["value"] == "reviewer"


def test_a_script_child_that_writes_is_reviewed_only_when_review_runs_are_on(
    home: Path, make_agent: AgentMaker, reviewer: str, tmp_path: Path
) -> None:
    reports = 'print("done"); print("```acceptance-report"); print(\'{"status": "done"}\'); print("```")'
    make_agent("writer", python=reports, acceptanceRole="writer")
    script = tmp_path / "wf.py"
    script.write_text(
        "async def main(runs, state, args):\n"
        "    return await runs.run('w', agent='writer', task='VERDICT={\"verdict\": \"approve\"}')\n"
    )
    dynamic = launch_workflow(script, review=True)
    unasked = launch_workflow(script)
    declared = launch_parallel([{"agent": "writer", "task": "x"}])
    for run in (dynamic, unasked, declared):
        run.wait(timeout=120)
    record = dynamic.result().details.results[0].acceptance  # type: ignore[union-attr]
    assert record is not None and [c.kind for c in record.checks][-1] == "review", record
    assert record.evidence_status == "reviewed" and not record.explicit
    # without the opt-in: the seed's review-required, and no reviewer run
    record = unasked.result().details.results[0].acceptance  # type: ignore[union-attr]
    assert record is not None and record.evidence_status == "review-required", record
    assert record.checks[-1].outcome == "skipped" and record.checks[-1].run_id is None
    child = pisub.Run(unasked.result().details.results[0].run_id or "")  # type: ignore[union-attr]
    assert not run_events(child, "review.started")
    plain = declared.result().details.results[0].acceptance  # type: ignore[union-attr]
    assert plain is not None and all(c.kind != "review" for c in plain.checks)


# == review gates =============================================================================


def _reviewed(agent_task: str, **review: object) -> pisub.Result:
    run = pisub.launch(
        "worker",
        agent_task,
        acceptance={"level": "none", "review": {"required": True, **review}},
    )
    return run.wait(timeout=120)


def test_a_review_gate_reviewed_rejected_and_unanswered(
    home: Path, make_agent: AgentMaker, reviewer: str
) -> None:
    make_agent("worker", command="true")
    approve = _reviewed('VERDICT={"verdict": "LGTM", "findings": [{"severity": "nit", "message": "fine"}]}')
    assert approve.state == "complete", approve.content[0].text
    record = approve.details.results[0].acceptance
    assert record is not None and record.evidence_status == "reviewed"
    check = record.checks[-1]
    assert check.kind == "review" and check.outcome == "passed" and check.run_id is not None
    assert check.findings is not None and check.findings[0].severity == "note"
    reviewer_run = pisub.Run(check.run_id)
    assert reviewer_run.manifest().parent_run_id == approve.details.run_id
    assert reviewer_run.manifest().key == "review"
    blocking = _reviewed(
        'VERDICT={"verdict": "approve", "findings": [{"severity": "blocker", "message": "drops the data"}]}'
    )
    assert blocking.state == "failed" and blocking.details.error is not None
    assert "drops the data" in blocking.details.error.message
    assert blocking.details.results[0].acceptance.evidence_status == "rejected"  # type: ignore[union-attr]
    silent = _reviewed("no verdict here")
    assert silent.state == "failed"
    record = silent.details.results[0].acceptance
    assert record is not None and record.evidence_status == "review-required"
    assert "no review-verdict block" in (record.reason or "")
    garbled = _reviewed('VERDICT={"verdict": "maybe"}')
    assert garbled.state == "failed" and "review-verdict.verdict" in (garbled.details.error.message or "")  # type: ignore[union-attr]


def test_a_stop_during_the_review_stops_the_reviewer_and_the_run(
    home: Path, make_agent: AgentMaker, reviewer: str
) -> None:
    make_agent("worker", command="true")
    run = pisub.launch("worker", "HANG please", acceptance={"level": "none", "review": {"required": True}})
    started = wait_for(lambda: run_events(run, "review.started"), timeout=30)
    review = pisub.Run(str(started[0]["data"]["runId"]))
    receipt = run.wait_for_receipt(run.send_stop(), timeout=10)
    assert receipt is not None and receipt.state == "delivered", receipt
    result = run.wait(timeout=30)
    assert result.state == "stopped", result.content[0].text
    assert review.wait(timeout=30).state == "stopped"


def test_a_review_gates_reviewer_must_exist(home: Path, make_agent: AgentMaker) -> None:
    make_agent("worker", command="true")
    review = {"required": True, "agent": "nobody"}
    with pytest.raises(InvalidInput, match=r"acceptance\.review\.agent: no agent 'nobody'"):
        pisub.launch("worker", "x", acceptance={"level": "none", "review": review})
    with pytest.raises(InvalidInput, match="reviewed"):
        pisub.launch("worker", "x", acceptance={"level": "reviewed"})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"verdict": "approve", "colour": 1}', "review-verdict.colour"),
        ('{"verdict": "approve", "findings": [{"severity": "huge", "message": "m"}]}', "severity"),
        ('{"verdict": "approve", "findings": [{"severity": "note"}]}', "message"),
        ("[1, 2]", "expected a JSON object"),
        ('{"verdict": NaN}', "NaN"),
        ("{" * 5000, "not JSON"),
    ],
)
def test_a_bad_verdict_names_the_field(text: str, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        parse(text)


def test_a_verdict_is_read_tolerantly() -> None:
    verdict = parse(
        '{"review": {"verdict": "Changes requested", "findings": [{"severity": "MAJOR", "message": "m"}]}}'
    )
    assert rejection(verdict) == "the reviewer rejected the work"
    assert rejection(parse('{"verdict": "pass"}')) is None
