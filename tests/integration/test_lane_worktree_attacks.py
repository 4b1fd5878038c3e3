"""What an outside attack on lanes, retained children and worktree isolation found (issue 13),
each kept broken-no-more here."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.client import launch_lanes, launch_parallel, launch_workflow
from pisub.errors import InvalidInput
from tests.conftest import AgentMaker, pisub_cli
from tests.integration.test_worktree_runs import git, repo

__all__ = ["repo"]

# Runs its task as Python in its cwd (the attack's "edit" agent).
RUNNER = "import sys\nexec(sys.stdin.read())\n"


@pytest.fixture
def py(home: Path, make_agent: AgentMaker) -> None:
    make_agent("py", python=RUNNER)


def _one(repo: Path, code: str, **options: Any) -> str:
    run = launch_parallel(
        [{"key": "w", "agent": "py", "task": code}], cwd=repo, isolation="worktree", **options
    )
    result = run.wait(timeout=90)
    assert result.state == "complete", result.content[0].text
    return result.details.results[0].run_id or ""


def _plan() -> dict[str, tuple[str, str]]:
    found = json.loads(pisub_cli("worktree", "cleanup", "--plan", "--json", check=True).stdout)["plan"]
    return {e["name"]: (e["decision"], e["reason"]) for e in found}


def test_a_forged_record_never_deletes_a_branch_that_is_not_the_runs(repo: Path, py: None) -> None:
    child = _one(repo, "open('a.txt', 'w').write('a')")
    git(repo, "branch", "precious")
    pisub_cli("worktree", "apply", child, check=True)
    record_file = Path(pisub.Run(child).manifest().worktree.record)  # type: ignore[union-attr]
    record = json.loads(record_file.read_text())
    record["branch"] = "precious"
    record_file.write_text(json.dumps(record))
    assert _plan()[child] == ("unknown", "unknown")
    pisub_cli("worktree", "cleanup", "--apply", check=True)
    assert git(repo, "rev-parse", "--verify", "refs/heads/precious").strip()


def test_a_root_or_record_others_can_write_is_never_acted_on(repo: Path, py: None) -> None:
    child = _one(repo, "open('a.txt', 'w').write('a')")
    pisub_cli("worktree", "apply", child, check=True)
    git(repo, "commit", "-qam", "applied")
    record_file = Path(pisub.Run(child).manifest().worktree.record)  # type: ignore[union-attr]
    record_file.chmod(0o666)
    assert _plan()[child] == ("unknown", "unknown")
    record_file.chmod(0o600)
    root = record_file.parent
    root.chmod(0o777)
    assert _plan()[child] == ("unknown", "unknown")
    with pytest.raises(InvalidInput, match="writable by other users"):
        launch_parallel([{"key": "v", "agent": "py", "task": "pass"}], cwd=repo, isolation="worktree")
    root.chmod(0o700)


def test_work_no_patch_can_carry_keeps_the_worktree(repo: Path, py: None) -> None:
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "ignore logs")
    nested = _one(
        repo,
        textwrap.dedent(
            """
            import os, subprocess
            os.mkdir("proj")
            open("proj/main.c", "w").write("int main;")
            subprocess.run(["git", "init", "-q", "proj"], check=True)
            subprocess.run(["git", "-C", "proj", "add", "-A"], check=True)
            subprocess.run(["git", "-C", "proj", "commit", "-qm", "inner"], check=True)
            open("proj/uncommitted.txt", "w").write("more")
            """
        ),
    )
    logged = _one(repo, "open('results.log', 'w').write('hours of work')")
    plan = _plan()
    # A nested repository is refused at capture (no patch carries its commits): uncaptured, kept.
    assert plan[nested] == ("keep", "uncaptured") and plan[logged] == ("keep", "dirty")
    # Even once applied, a worktree holding such work is never "safe".
    for child in (nested, logged):
        record_file = Path(pisub.Run(child).manifest().worktree.record)  # type: ignore[union-attr]
        record = json.loads(record_file.read_text())
        record["state"] = "applied"
        record_file.write_text(json.dumps(record))
        record_file.chmod(0o600)
    plan = _plan()
    assert plan[nested] == ("keep", "dirty") and plan[logged] == ("keep", "dirty")
    pisub_cli("worktree", "cleanup", "--apply", check=True)
    assert (Path(pisub.Run(logged).manifest().worktree.path) / "results.log").is_file()  # type: ignore[union-attr]


def test_bad_sources_are_refused_at_launch_and_nothing_is_created(
    repo: Path, py: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for ref in ("HEAD~1000", "HEAD^{tree}", "HEAD:README", "../x", "main..main"):
        with pytest.raises(InvalidInput, match="base ref"):
            launch_parallel([{"agent": "py", "task": "pass"}], cwd=repo, isolation="worktree", base_ref=ref)
    with pytest.raises(InvalidInput, match="branch name"):
        launch_parallel([{"key": "x.lock", "agent": "py", "task": "pass"}], cwd=repo, isolation="worktree")
    with pytest.raises(InvalidInput, match=r"lanes\[0\] \(L\)\.stages\[1\] \(lock\).*branch name"):
        launch_lanes(
            [
                {
                    "key": "L",
                    "defaults": {"agent": "py", "isolation": "worktree"},
                    "stages": [{"key": "plan", "task": "pass"}, {"key": "lock", "task": "pass"}],
                }
            ],
            cwd=repo,
        )
    (repo / ".gitignore").write_text("build/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "ignore build")
    (repo / "build").mkdir()
    with pytest.raises(InvalidInput, match="not a directory of the base commit"):
        launch_parallel([{"agent": "py", "task": "pass"}], cwd=repo / "build", isolation="worktree")
    monkeypatch.setenv("PISUB_WORKTREES", "relative/path")
    with pytest.raises(InvalidInput, match="absolute"):
        launch_parallel([{"agent": "py", "task": "pass"}], cwd=repo, isolation="worktree")
    assert not [s for s in pisub.list_runs(children=True) if s.parent_run_id]


def test_the_verdict_is_the_last_blocks_only_and_file_only_output_counts(
    home: Path, py: None, tmp_path: Path
) -> None:
    blocked = 'print("```json\\n{\\"verdict\\": \\"blocked\\"}\\n```")'
    then_other = blocked + '; print("```json\\n{\\"note\\": \\"all good\\"}\\n```")'
    lanes = [
        {
            "key": "a",
            "defaults": {"agent": "py"},
            "stages": [{"key": "s", "task": then_other}, {"key": "t", "task": "pass"}],
        },
        {
            "key": "b",
            "defaults": {"agent": "py"},
            "stages": [
                {"key": "s", "task": blocked, "output": "v.md", "outputMode": "file-only"},
                {"key": "t", "task": "pass"},
            ],
        },
    ]
    run = launch_lanes(lanes, cwd=tmp_path)
    text = run.wait(timeout=90).content[0].text
    a, b = json.loads(text[text.index("[") :])
    assert a["state"] == "complete" and "verdict" not in a["stages"][0]
    assert b["state"] == "blocked" and b["stages"][0]["verdict"] == "blocked"


def test_a_changed_second_lanes_call_is_refused_whole(home: Path, py: None, tmp_path: Path) -> None:
    script = tmp_path / "wf.py"
    script.write_text(
        textwrap.dedent(
            """
            def lanes(second):
                return [{"key": "a", "defaults": {"agent": "py"},
                         "stages": [{"key": "s1", "task": "pass"}, {"key": "s2", "task": second}]}]

            async def main(runs, state, args):
                await runs.lanes(lanes("x = 1"))
                try:
                    await runs.lanes(lanes("x = 2") + [{"key": "b", "defaults": {"agent": "py"},
                                                       "stages": [{"key": "s1", "task": "pass"}]}])
                except Exception as exc:
                    return type(exc).__name__ + ": " + str(exc)
                return "accepted"
            """
        )
    )
    result = launch_workflow(script, cwd=tmp_path).wait(timeout=90)
    assert "INVALID_INPUT" in result.content[0].text or "InvalidInput" in result.content[0].text
    assert "a.s2" in result.content[0].text
    assert "b.s1" not in {r.key for r in result.details.results}


def test_lanes_errors_name_the_stage_and_survive_redaction(home: Path, py: None, tmp_path: Path) -> None:
    with pytest.raises(pisub.PisubError, match=r"lanes\[0\] \(k\)\.stages\[0\] \(s\)"):
        launch_lanes([{"key": "k", "stages": [{"key": "s", "task": "t", "agent": "ghost"}]}])
    path = tmp_path / "lanes.json"
    path.write_text(
        json.dumps([{"key": "a", "defaults": {"agent": "py"}, "stages": [{"key": "s", "task": "t"}]}] * 2)
    )
    done = pisub_cli("run", "--lanes", str(path))
    assert done.returncode == 1 and "REDACTED" not in done.stderr and "'a' is used twice" in done.stderr


def test_the_spawn_budget_covers_a_whole_lanes_manifest(home: Path, py: None, tmp_path: Path) -> None:
    lanes = [
        {
            "key": f"l{i}",
            "defaults": {"agent": "py"},
            "stages": [{"key": f"s{n}", "task": "pass"} for n in range(6)],
        }
        for i in range(2)
    ]
    with pytest.raises(pisub.PisubError, match="max-spawns"):
        launch_lanes(lanes, max_spawns=5)
    script = tmp_path / "wf.py"
    script.write_text(f"async def main(runs, state, args):\n    return await runs.lanes({lanes!r})\n")
    result = launch_workflow(script, max_spawns=5).wait(timeout=60)
    assert result.state == "failed" and "spawn budget" in result.content[0].text
    assert not result.details.results


def test_follow_up_to_a_child_that_never_ran_says_so(home: Path, py: None) -> None:
    run = launch_lanes(
        [
            {
                "key": "a",
                "defaults": {"agent": "py"},
                "stages": [{"key": "s1", "task": "raise SystemExit(3)"}, {"key": "s2", "task": "pass"}],
            }
        ]
    )
    run.wait(timeout=60)
    skipped = pisub_cli("follow-up", run.id, "--child", "a.s2", "more")
    assert skipped.returncode == 1 and "never started" in skipped.stderr and "a.s2" in skipped.stderr
    missing = pisub_cli("follow-up", run.id, "--child", "99", "more")
    assert missing.returncode == 1 and "no child 99" in missing.stderr
    external = pisub_cli("follow-up", run.id, "--child", "a.s1", "more")
    assert external.returncode == 1 and "is an external-cli run" in external.stderr


def test_user_given_input_files_may_be_symlinks(home: Path, py: None, tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text(
        json.dumps([{"key": "a", "defaults": {"agent": "py"}, "stages": [{"key": "s", "task": "pass"}]}])
    )
    link = tmp_path / "link.json"
    os.symlink(real, link)
    started = pisub_cli("run", "--lanes", str(link), "--json", check=True)
    assert pisub.Run(json.loads(started.stdout)["runId"]).wait(timeout=60).state == "complete"
