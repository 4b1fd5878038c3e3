"""Acceptance gates: verify commands run by the runner on the child's tree, memoized per tree
state; an explicit gate that fails fails the run. Real runs, real git repositories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.client import launch_parallel
from pisub.errors import InvalidInput
from tests.conftest import AgentMaker, pisub_cli


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path, home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = T\n\temail = t@example.com\n[init]\n\tdefaultBranch = main\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    make_agent("worker", command="true")
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    (path / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base")
    return path


def _counter(tmp_path: Path) -> tuple[str, Path]:
    """A verify command that counts its executions in a file outside the repository."""
    count = tmp_path / "count.txt"
    count.write_text("")
    script = tmp_path / "count.py"
    script.write_text(f"open({str(count)!r}, 'a').write('x')\n")
    return f"{sys.executable} {script}", count


def test_a_pytest_gate_passing_and_failing(repo: Path) -> None:
    gate = f"{sys.executable} -m pytest -q -p no:cacheprovider"
    ok = pisub.launch("worker", "x", cwd=repo, gate=gate)
    result = ok.wait(timeout=120)
    assert result.state == "complete", result.content[0].text
    record = result.details.results[0].acceptance
    assert record is not None and record.evidence_status == "verified" and record.explicit
    (check,) = record.checks
    assert check.id == "gate" and check.outcome == "passed" and check.exit_code == 0
    assert check.output is not None and "passed" in Path(check.output).read_text()

    (repo / "test_bad.py").write_text("def test_bad():\n    assert False\n")
    bad = pisub.launch("worker", "x", cwd=repo, gate=gate)
    result = bad.wait(timeout=120)
    assert result.state == "failed" and result.details.error is not None
    assert result.details.error.code == "SUBAGENT_FAILED"
    assert "acceptance gate failed: gate: exited with code 1" in result.details.error.message
    assert result.details.results[0].acceptance.evidence_status == "rejected"  # type: ignore[union-attr]


def test_an_unchanged_tree_never_reruns_a_command_and_an_untracked_file_does(
    repo: Path, tmp_path: Path
) -> None:
    command, count = _counter(tmp_path)
    first = pisub.launch("worker", "x", cwd=repo, gate=command).wait(timeout=60)
    second = pisub.launch("worker", "x", cwd=repo, gate=command).wait(timeout=60)
    assert count.read_text() == "x"  # ran once
    caches = [r.details.results[0].acceptance.checks[0].cache for r in (first, second)]  # type: ignore[union-attr]
    assert caches == ["miss", "hit"]
    (repo / "new_untracked.txt").write_text("appears\n")
    third = pisub.launch("worker", "x", cwd=repo, gate=command).wait(timeout=60)
    assert count.read_text() == "xx" and third.details.results[0].acceptance.checks[0].cache == "miss"  # type: ignore[union-attr]
    events = (pisub.Run(third.details.run_id or "").dir / "events.jsonl").read_text()
    assert '"acceptance.checked"' in events


def test_a_verify_cache_entry_has_a_v_and_one_from_before_v_still_hits(
    repo: Path, tmp_path: Path, home: Path
) -> None:
    command, count = _counter(tmp_path)
    first = pisub.launch("worker", "x", cwd=repo, gate=command).wait(timeout=60)
    (entry,) = (home / "cache" / "verify").iterdir()
    data = json.loads(entry.read_text())
    assert data["v"] == 1 and first.details.results[0].acceptance.checks[0].cache == "miss"  # type: ignore[union-attr]
    del data["v"]  # as a pisub from before v wrote it
    entry.write_text(json.dumps(data))
    second = pisub.launch("worker", "x", cwd=repo, gate=command).wait(timeout=60)
    assert second.details.results[0].acceptance.checks[0].cache == "hit" and count.read_text() == "x"  # type: ignore[union-attr]
    entry.write_text(json.dumps({**data, "v": 2}))  # a newer pisub's: not understood, a miss
    third = pisub.launch("worker", "x", cwd=repo, gate=command).wait(timeout=60)
    assert third.details.results[0].acceptance.checks[0].cache == "miss" and count.read_text() == "xx"  # type: ignore[union-attr]
    assert json.loads(entry.read_text())["v"] == 1


def test_a_workflow_childs_gate_is_in_its_result_and_a_resume_takes_none(repo: Path, tmp_path: Path) -> None:
    command, _count = _counter(tmp_path)
    run = launch_parallel([{"key": "a", "agent": "worker", "task": "x", "gate": command}], cwd=repo)
    result = run.wait(timeout=60)
    assert result.state == "complete"
    record = result.details.results[0].acceptance
    assert record is not None and record.checks[0].outcome == "passed"
    with pytest.raises(InvalidInput, match="resume"):
        launch_parallel(
            [{"key": "b", "agent": "worker", "task": "x", "gate": command, "resume": "abc"}], cwd=repo
        )


@pytest.mark.parametrize(
    ("acceptance", "gate", "needle"),
    [
        ("none", None, "not a bare"),
        (True, None, "not a bare"),
        ({"level": "reviewed"}, None, "is an outcome"),
        ({"level": "verified"}, None, "at least one command"),
        (
            {"level": "verified", "verify": [{"id": "a", "command": "x"}, {"id": "a", "command": "y"}]},
            None,
            "unique",
        ),
        ({"level": "verified", "verify": [{"id": "a", "command": "x"}], "colour": 1}, None, "colour"),
        ({"level": "none"}, "true", "not both"),
        ("auto", "", "give the command"),
    ],
)
def test_bad_acceptance_is_refused_naming_the_field(
    repo: Path, acceptance: Any, gate: str | None, needle: str
) -> None:
    with pytest.raises(InvalidInput, match=needle):
        pisub.launch("worker", "x", cwd=repo, acceptance=acceptance, gate=gate)
    assert not list(pisub.list_runs())


def test_the_cli_and_an_agent_file_gate(repo: Path, make_agent: AgentMaker) -> None:
    make_agent("gated", command="true", gate="false")
    done = pisub_cli("run", "--agent", "gated", "x", "--cwd", str(repo), "--json", check=True)
    result = pisub.Run(json.loads(done.stdout)["runId"]).wait(timeout=60)
    assert result.state == "failed" and "acceptance gate failed" in (
        result.details.error.message if result.details.error else ""
    )
    done = pisub_cli(
        "run", "--agent", "gated", "x", "--cwd", str(repo), "--gate", "true", "--json", check=True
    )
    assert pisub.Run(json.loads(done.stdout)["runId"]).wait(timeout=60).state == "complete"  # the call wins
    bad = pisub_cli("run", "--agent", "worker", "x", "--acceptance", '{"level": "reviewed"}')
    assert bad.returncode == 1 and "is an outcome" in bad.stderr


# Prints the report it finds in $REPORT (after a line of prose), and saves its task.
REPORTER = """
import os, sys
task = sys.stdin.read()
open(os.environ["TASK_SEEN"], "w").write(task)
print("All done.")
report = os.environ.get("REPORT")
if report:
    print("```acceptance-report")
    print(report)
    print("```")
sys.exit(int(os.environ.get("EXIT", "0")))
"""


@pytest.fixture
def reporter(repo: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    seen = tmp_path / "task-seen.txt"
    monkeypatch.setenv("TASK_SEEN", str(seen))
    make_agent("reporter", python=REPORTER)
    return seen


def _report_run(
    repo: Path, monkeypatch: pytest.MonkeyPatch, report: str | None, acceptance: dict[str, Any]
) -> Any:
    if report is None:
        monkeypatch.delenv("REPORT", raising=False)
    else:
        monkeypatch.setenv("REPORT", report)
    return pisub.launch("reporter", "do it", cwd=repo, acceptance=acceptance).wait(timeout=60)


def test_an_attested_report_is_read_tolerantly_and_taken_out_of_the_output(
    repo: Path, reporter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wanted = {
        "level": "attested",
        "evidence": ["changed-files", "no-staged-files"],
        "criteria": ["tests pass"],
    }
    report = json.dumps(
        {"report": {"files_changed": "test_ok.py", "no_staged_files": "true", "notes": "fine"}}
    )
    result = _report_run(repo, monkeypatch, report, wanted)
    assert result.state == "complete", result.content[0].text
    record = result.details.results[0].acceptance
    assert record is not None and record.evidence_status == "attested"
    assert "acceptance-report" not in result.content[0].text and "All done." in result.content[0].text
    seen = reporter.read_text()
    assert "```acceptance-report" in seen and "tests pass" in seen and "changed-files" in seen


@pytest.mark.parametrize(
    ("report", "needle"),
    [
        (None, "no acceptance-report block"),
        ('{"colour": "red"}', "acceptance-report.colour"),
        ('{"files": ["a"], "changed_files": ["b"]}', "given twice"),
        ("[1, 2]", "expected a JSON object"),
        ('{"noStagedFiles": "perhaps"}', "expected true or false"),
        ('{"manualNotes": "x"}', "missing: changed-files"),
    ],
)
def test_a_bad_or_missing_report_fails_with_the_field(
    repo: Path, reporter: Path, monkeypatch: pytest.MonkeyPatch, report: str | None, needle: str
) -> None:
    result = _report_run(repo, monkeypatch, report, {"level": "attested", "evidence": ["changed-files"]})
    assert result.state == "failed" and result.details.error is not None
    assert needle in result.details.error.message


GOOD_REPORT = '{"changedFiles": ["test_ok.py"], "noStagedFiles": true}'
VERIFIED: dict[str, Any] = {"level": "verified", "verify": [{"id": "ok", "command": "true"}]}


@pytest.mark.parametrize(
    ("acceptance", "exit_code", "asked", "state"),
    [
        ({"level": "attested"}, 0, True, "complete"),
        ({"level": "checked"}, 0, True, "complete"),
        (VERIFIED, 0, False, "complete"),
        ({**VERIFIED, "report": "on"}, 0, True, "complete"),
        ({"level": "attested", "report": "on"}, 0, True, "complete"),
        ({"level": "attested"}, 3, True, "failed"),
        ({**VERIFIED, "report": "on"}, 3, True, "failed"),
        (VERIFIED, 3, False, "failed"),
    ],
)
def test_the_report_block_is_taken_out_exactly_when_it_was_asked_for(
    repo: Path,
    reporter: Path,
    monkeypatch: pytest.MonkeyPatch,
    acceptance: dict[str, Any],
    exit_code: int,
    asked: bool,
    state: str,
) -> None:
    """One rule, whatever the level and however the run ends: the child is asked for a report
    (``report``, else attested and checked) exactly when the block is taken out of the output
    the caller gets; a block written unasked (a gate run) is the child's output. The raw log
    keeps it either way."""
    monkeypatch.setenv("EXIT", str(exit_code))
    monkeypatch.setenv("REPORT", GOOD_REPORT)
    run = pisub.launch("reporter", "do it", cwd=repo, acceptance=acceptance)
    result = run.wait(timeout=60)
    assert result.state == state, result.content[0].text
    output = result.details.results[0].output or ""
    assert "All done." in output and "All done." in result.content[0].text
    assert ("acceptance-report" in output) is not asked, output
    assert ("acceptance-report" in result.content[0].text) is not asked, result.content[0].text
    assert ("```acceptance-report" in reporter.read_text()) is asked  # the task asked for it
    assert "```acceptance-report" in (run.dir / "output-0.log").read_text()  # the raw log keeps it


@pytest.mark.parametrize(
    ("acceptance", "needle"),
    [
        ({"level": "attested", "report": "off"}, "acceptance.report: off contradicts level attested"),
        ({"level": "checked", "report": "off"}, "acceptance.report: off contradicts level checked"),
        ({"level": "none", "report": "on"}, "acceptance.report: on needs a level"),
    ],
)
def test_a_report_setting_that_contradicts_the_level_is_refused(
    repo: Path, acceptance: dict[str, Any], needle: str
) -> None:
    with pytest.raises(InvalidInput, match=needle):
        pisub.launch("worker", "x", cwd=repo, acceptance=acceptance)
    assert not list(pisub.list_runs())


def test_checked_claims_are_checked(repo: Path, reporter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = {"level": "checked"}
    lying = _report_run(repo, monkeypatch, '{"changedFiles": ["nowhere.py"]}', wanted)
    assert lying.state == "failed" and "no such changed file: nowhere.py" in (
        lying.details.error.message if lying.details.error else ""
    )
    honest = _report_run(repo, monkeypatch, '{"changedFiles": ["test_ok.py"], "noStagedFiles": true}', wanted)
    assert honest.state == "complete"
    assert honest.details.results[0].acceptance.evidence_status == "checked"


FORGER = """
import json, os, sys
sys.stdin.read()
from pathlib import Path
from pisub.acceptance.verify import key_of, place
from pisub.protocol.acceptance import VerifyCommand
manifest = json.loads((Path(os.environ["PISUB_RUN_DIR"]) / "manifest.json").read_text())
command = VerifyCommand(**manifest["acceptance"]["spec"]["verify"][0])
key = key_of(command, place(Path.cwd(), []))
cache = Path(os.environ["PISUB_HOME"]) / "cache" / "verify"
cache.mkdir(parents=True, exist_ok=True)
forged = {"exitCode": 0, "outcome": "passed", "reason": "trust me", "at": "x"}
(cache / f"{key}.json").write_text(json.dumps(forged))
print("forged", key)
"""


def test_a_child_cannot_forge_its_own_gate_result(
    repo: Path, make_agent: AgentMaker, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PISUB_HOME", str(home))
    make_agent("forger", python=FORGER)
    result = pisub.launch("forger", "x", cwd=repo, gate="false").wait(timeout=60)
    assert result.state == "failed", result.content[0].text
    check = result.details.results[0].acceptance.checks[0]  # type: ignore[union-attr]
    assert check.cache == "miss" and check.exit_code == 1


def test_what_the_cache_key_cannot_see_is_never_cached(repo: Path, tmp_path: Path) -> None:
    command, _count = _counter(tmp_path)
    subprocess.run(["git", "init", "-q", str(repo / "sub")], check=True)
    (repo / "sub" / "ok").write_text("1\n")
    subprocess.run(["git", "-C", str(repo / "sub"), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo / "sub"), "commit", "-qm", "inner"], check=True)
    nested = pisub.launch("worker", "x", cwd=repo, gate=command).wait(timeout=60)
    assert nested.details.results[0].acceptance.checks[0].cache == "off"  # type: ignore[union-attr]


def test_a_changed_timeout_is_a_new_key_and_a_timeout_is_not_kept(repo: Path) -> None:
    def verify(timeout_ms: int) -> Any:
        wanted = {
            "level": "verified",
            "verify": [{"id": "s", "command": "sleep 1.5", "timeoutMs": timeout_ms}],
        }
        return pisub.launch("worker", "x", cwd=repo, acceptance=wanted).wait(timeout=60)

    assert verify(300).state == "failed"
    again = verify(300)
    assert again.details.results[0].acceptance.checks[0].cache == "miss"
    assert verify(20_000).state == "complete"


@pytest.mark.parametrize(
    ("gate", "needle"),
    [("x" * 20_000, "16384"), ("echo 'unbalanced", "does not split")],
)
def test_bad_gates_are_refused_at_launch(repo: Path, gate: str, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        pisub.launch("worker", "x", cwd=repo, gate=gate)
    assert not list(pisub.list_runs())


@pytest.mark.parametrize("claim", ["../../etc/passwd", "/etc/passwd", ".git", "", "."])
def test_checked_claims_must_be_files_inside_the_tree(
    repo: Path, reporter: Path, monkeypatch: pytest.MonkeyPatch, claim: str
) -> None:
    result = _report_run(repo, monkeypatch, json.dumps({"changedFiles": [claim]}), {"level": "checked"})
    assert result.state == "failed"


@pytest.mark.parametrize(
    "report", ['{"changedFiles": ["a"], "changedFiles": ["b"]}', '{"manualNotes": NaN}', '{"manualNotes": 5}']
)
def test_a_report_is_strict_about_duplicates_and_kinds(
    repo: Path, reporter: Path, monkeypatch: pytest.MonkeyPatch, report: str
) -> None:
    assert _report_run(repo, monkeypatch, report, {"level": "attested"}).state == "failed"


def test_config_show_checks_limits_as_a_run_does(repo: Path, home: Path) -> None:
    (home / "config.toml").write_text("[limits.tool_budget]\nhard = 5\nsoft = 10\n")
    done = pisub_cli("config", "show")
    assert done.returncode == 1 and "soft must not be above" in done.stderr
