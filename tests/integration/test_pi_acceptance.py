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
