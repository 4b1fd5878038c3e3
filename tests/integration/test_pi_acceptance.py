"""A pi child's work behind a `pytest -q` gate, with the real pi against the scripted model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pisub

pytestmark = pytest.mark.pi


def test_a_pytest_gate_on_a_pi_childs_tree(
    pi_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = T\n\temail = t@example.com\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
    (repo / "test_a.py").write_text("def test_a():\n    assert 1 + 1 == 2\n")
    gate = f"{sys.executable} -m pytest -q -p no:cacheprovider"
    passing = pisub.launch("pi", "please run TOOL: ls", cwd=repo, gate=gate).wait(timeout=120)
    assert passing.state == "complete", passing.content[0].text
    assert passing.details.results[0].acceptance is not None
    assert passing.details.results[0].acceptance.evidence_status == "verified"
    broken = "please run TOOL: printf 'def test_b():\\n    assert False\\n' > test_b.py"
    failing = pisub.launch("pi", broken, cwd=repo, gate=gate).wait(timeout=120)
    assert failing.state == "failed" and failing.details.error is not None
    assert "acceptance gate failed" in failing.details.error.message


def test_a_malformed_acceptance_report_from_pi_fails_with_the_field(pi_home: Path, tmp_path: Path) -> None:
    task = """please run TOOL: printf 'ok\\n```acceptance-report\\n{"colour": 1}\\n```\\n'"""
    result = pisub.launch("pi", task, cwd=tmp_path, acceptance={"level": "attested"}).wait(timeout=120)
    assert result.state == "failed" and result.details.error is not None, result.content[0].text
    assert "acceptance-report.colour" in result.details.error.message
    good = """please run TOOL: printf 'ok\\n```acceptance-report\\n{"status": "done"}\\n```\\n'"""
    fine = pisub.launch("pi", good, cwd=tmp_path, acceptance={"level": "attested"}).wait(timeout=120)
    assert fine.state == "complete", fine.content[0].text
    assert "acceptance-report" not in fine.content[0].text


def _pi_reviewer(pi_home: Path) -> None:
    (pi_home / "agents" / "reviewer.md").write_text(
        "---\nname: reviewer\nrunner: pi\ntools: [read, grep, find, ls]\ndescription: reviews\n---\nReview.\n"
    )


def test_a_review_gate_runs_a_pi_reviewer_on_the_diff(pi_home: Path, tmp_path: Path) -> None:
    """The child writes a file in a git tree; a pi reviewer gets the diff and its verdict
    decides (the scripted model answers the review request with the verdict it carries)."""
    _pi_reviewer(pi_home)
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
    blocking = '{"verdict": "approve", "findings": [{"severity": "blocking", "message": "no tests"}]}'
    verdicts = {"reviewed": '{"verdict": "approve"}', "rejected": blocking}
    for status, verdict in verdicts.items():
        review = {"required": True, "focus": f"REVIEW_VERDICT:{verdict}"}
        task = "please run TOOL: echo new > made.txt"
        run = pisub.launch("pi", task, cwd=repo, acceptance={"level": "none", "review": review}, review=True)
        result = run.wait(timeout=180)
        record = result.details.results[0].acceptance
        assert record is not None and record.evidence_status == status, result.content[0].text
        check = record.checks[-1]
        assert check.kind == "review" and check.run_id is not None
        reviewer = pisub.Run(check.run_id)
        assert reviewer.manifest().agent.name == "reviewer" and reviewer.manifest().parent_run_id == run.id
        assert "made.txt" in reviewer.manifest().task  # the diff lists the new file
        assert result.state == ("complete" if status == "reviewed" else "failed")


@pytest.mark.pi_versions
def test_a_default_pi_run_is_checked_by_inference_and_never_failed_by_it(
    pi_home: Path, tmp_path: Path
) -> None:
    (pi_home / "agents" / "plain.md").write_text("---\nname: plain\nrunner: pi\n---\nBe terse.\n")
    result = pisub.launch("plain", "hello there", cwd=tmp_path).wait(timeout=120)
    assert result.state == "complete", result.content[0].text
    record = result.details.results[0].acceptance
    assert record is not None and record.level == "checked" and not record.explicit
    # the scripted model echoes the task, template included: a report the runner can read
    assert record.evidence_status == "checked", record
    assert "```acceptance-report" not in result.content[0].text
