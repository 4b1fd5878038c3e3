"""Worktree isolation end to end: real workflow runs whose children edit files in their own
git worktrees, real git repositories, the pisub CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.client import launch_lanes, launch_parallel
from pisub.errors import InvalidInput
from tests.conftest import AgentMaker, pisub_cli, wait_for

# The task is "FILE=TEXT [sleep N]": writes TEXT as the whole of FILE (in its cwd), then sleeps.
EDITOR = """
import os, sys, time
task = sys.stdin.read().strip()
words = task.split()
name, _, text = words[0].partition("=")
with open(name, "w") as fh:
    fh.write(text + "\\n")
if len(words) >= 3 and words[-2] == "sleep":
    time.sleep(float(words[-1]))
print("wrote", name, "in", os.getcwd())
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path, home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = Test\n\temail = t@example.com\n[init]\n\tdefaultBranch = main\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    make_agent("editor", python=EDITOR)
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    (path / "shared.txt").write_text("base\n")
    (path / "README").write_text("readme\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return path


def plant_merge(repo: Path, heads: int = 4) -> tuple[list[str], str, str]:
    """Commits for lane evidence to name, made in ``repo`` without moving anything: reviewed
    heads, an (octopus) merge commit of all of them, and a second merge of the first head
    alone. Their ids: ``(heads, merge, other_merge)``."""
    empty = git(repo, "hash-object", "-t", "tree", "-w", "/dev/null").strip()
    made = [git(repo, "commit-tree", empty, "-m", f"head {n}").strip() for n in range(1, heads + 1)]
    parents = [arg for head in made for arg in ("-p", head)]
    merge = git(repo, "commit-tree", empty, *parents, "-m", "merge").strip()
    other = git(repo, "commit-tree", empty, "-p", made[0], "-m", "another merge").strip()
    return made, merge, other


def _wait(run: pisub.Run) -> Any:
    result = run.wait(timeout=90)
    assert result.state == "complete", result.content[0].text
    return result


def test_two_writers_of_one_file_both_captured_one_applies_the_other_conflicts(repo: Path) -> None:
    before = git(repo, "rev-parse", "HEAD")
    run = launch_parallel(
        [
            {"key": "left", "agent": "editor", "task": "shared.txt=from-left"},
            {"key": "right", "agent": "editor", "task": "shared.txt=from-right"},
        ],
        cwd=repo,
        isolation="worktree",
    )
    result = _wait(run)
    assert (repo / "shared.txt").read_text() == "base\n"  # the source is untouched
    left, right = (r.run_id for r in result.details.results)
    assert left and right
    for child in (left, right):
        manifest = pisub.Run(child).manifest()
        assert manifest.worktree is not None and manifest.cwd == manifest.worktree.path
        patch = pisub.Run(child).dir / "worktree.patch"
        assert patch.is_file() and b"shared.txt" in patch.read_bytes()
        assert stat_mode(patch) == 0o600
        ref = f"refs/pisub/{child}"
        assert git(repo, "rev-parse", "--verify", ref).strip()
    events = (pisub.Run(left).dir / "events.jsonl").read_text()
    assert '"worktree.captured"' in events

    listed = json.loads(pisub_cli("worktree", "list", "--json", check=True).stdout)
    assert {(r["plan"]["runId"], r["plan"]["reason"]) for r in listed} == {
        (left, "unapplied"),
        (right, "unapplied"),
    }

    done = json.loads(pisub_cli("worktree", "apply", left, "--json", check=True).stdout)
    assert done["ok"] and (repo / "shared.txt").read_text() == "from-left\n"
    snapshot = git(repo, "status", "--porcelain"), (repo / "shared.txt").read_bytes()
    clash = pisub_cli("worktree", "apply", right)
    assert clash.returncode == 1 and "conflict: shared.txt" in clash.stdout
    assert (git(repo, "status", "--porcelain"), (repo / "shared.txt").read_bytes()) == snapshot
    assert git(repo, "rev-parse", "HEAD") == before

    # cleanup: the applied one is safe to remove, the unapplied one is kept.
    git(repo, "commit", "-qam", "left's work")
    plan = json.loads(pisub_cli("worktree", "cleanup", "--plan", "--json", check=True).stdout)["plan"]
    decisions = {e["runId"]: (e["decision"], e["reason"]) for e in plan}
    assert decisions == {left: ("remove", "safe"), right: ("keep", "unapplied")}
    applied = json.loads(pisub_cli("worktree", "cleanup", "--apply", "--json", check=True).stdout)
    assert [r["entry"]["runId"] for r in applied["removed"] if r["removed"]] == [left]
    assert not Path(pisub.Run(left).manifest().worktree.path).exists()  # type: ignore[union-attr]
    assert Path(pisub.Run(right).manifest().worktree.path).exists()  # type: ignore[union-attr]
    assert pisub_cli("worktree", "discard", right).returncode == 1  # needs --force
    pisub_cli("worktree", "discard", right, "--force", check=True)
    assert not Path(pisub.Run(right).manifest().worktree.path).exists()  # type: ignore[union-attr]


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_dirty_source_starts_nothing_and_names_the_paths(repo: Path) -> None:
    (repo / "README").write_text("changed\n")
    (repo / "new.txt").write_text("untracked\n")
    with pytest.raises(InvalidInput) as caught:
        launch_parallel([{"agent": "editor", "task": "x.txt=1"}], cwd=repo, isolation="worktree")
    assert "README" in caught.value.message and "new.txt" in caught.value.message
    assert not list(pisub.list_runs(children=True))
    done = pisub_cli("run", "--task", "editor=x.txt=1", "--isolation", "worktree", "--cwd", str(repo))
    assert done.returncode == 1 and "uncommitted" in done.stderr and "Traceback" not in done.stderr
    bad_ref = pisub_cli(
        "run", "--task", "editor=x.txt=1", "--isolation", "worktree", "--base-ref", "-rf", "--cwd", str(repo)
    )
    assert bad_ref.returncode == 1 and "Traceback" not in bad_ref.stderr


def test_a_runner_killed_mid_edit_leaves_its_worktree_kept_as_uncaptured(repo: Path) -> None:
    run = launch_lanes(
        [
            {
                "key": "slow",
                "defaults": {"agent": "editor", "isolation": "worktree"},
                "stages": [{"key": "edit", "task": "shared.txt=half-done sleep 60"}],
            }
        ],
        cwd=repo,
    )
    child_id = wait_for(lambda: (s := run.status().steps) and s[0].pid and s[0].run_id, 30)
    child = pisub.Run(child_id)
    link = child.manifest().worktree
    assert link is not None
    wait_for(lambda: (Path(link.path) / "shared.txt").read_text() == "half-done\n", 30)
    runner = child.status().pid
    assert runner is not None
    os.kill(runner, signal.SIGKILL)
    wait_for(lambda: child.status().state == "failed", 15)
    run.wait(timeout=30)  # its only lane is blocked: the workflow ends by itself
    plan = json.loads(pisub_cli("worktree", "cleanup", "--apply", "--json", check=True).stdout)
    assert [(e["runId"], e["decision"], e["reason"]) for e in plan["plan"]] == [
        (child_id, "keep", "uncaptured")
    ]
    assert not plan["removed"]
    assert (Path(link.path) / "shared.txt").read_text() == "half-done\n"  # the work is still there


def test_a_base_ref_and_a_subdirectory_cwd_carry_into_the_worktree(repo: Path) -> None:
    first = git(repo, "rev-parse", "HEAD").strip()
    (repo / "sub").mkdir()
    (repo / "sub" / "f.txt").write_text("f\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "second")
    run = launch_parallel(
        [{"key": "old", "agent": "editor", "task": "here.txt=x", "cwd": "."}],
        cwd=repo,
        isolation="worktree",
        base_ref=first[:10],
    )
    result = _wait(run)
    child = pisub.Run(result.details.results[0].run_id or "")
    link = child.manifest().worktree
    assert link is not None and link.base_commit == first
    assert not (Path(link.path) / "sub").exists()  # the worktree is at the older commit
    deeper = launch_parallel(
        [{"key": "deep", "agent": "editor", "task": "g.txt=y"}], cwd=repo / "sub", isolation="worktree"
    )
    inner = pisub.Run(_wait(deeper).details.results[0].run_id or "")
    assert inner.manifest().cwd.endswith("/sub") and (Path(inner.manifest().cwd) / "g.txt").is_file()


def test_gc_keeps_a_run_whose_worktree_work_is_not_applied(repo: Path) -> None:
    task = {"key": "w", "agent": "editor", "task": "n.txt=1"}
    run = launch_parallel([task], cwd=repo, isolation="worktree")
    child = _wait(run).details.results[0].run_id or ""
    pisub_cli("gc", "--older-than", "0s", check=True)
    assert (pisub.Run(child).dir / "worktree.patch").is_file()
    pisub_cli("worktree", "apply", child, check=True)
    pisub_cli("gc", "--older-than", "0s", check=True)
    with pytest.raises(pisub.PisubError):
        pisub.Run(child).status()  # applied: an ordinary finished run again


def _two_writers(repo: Path, *names: str) -> tuple[pisub.Run, list[str]]:
    tasks = [{"key": n, "agent": "editor", "task": f"{n}.txt={n}"} for n in names]
    run = launch_parallel(tasks, cwd=repo, isolation="worktree")
    return run, [r.run_id or "" for r in _wait(run).details.results]


def _lane_state(run_id: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(pisub_cli("lane", "status", run_id, "--json", check=True).stdout)
    return found


def test_lane_evidence_allows_cleanup_only_while_the_facts_hold(repo: Path) -> None:
    run, (a, b) = _two_writers(repo, "a", "b")
    state = _lane_state(run.id)
    assert state["state"] == "terminal-blocked" and "no merge" in state["reason"]
    assert sorted(state["children"]) == sorted([a, b])
    (head, *_), commit, _ = plant_merge(repo)
    merge = ["--pr", "7", "--reviewed-head", head, "--merge-commit", commit, "--by", "ana"]
    bad = pisub_cli("lane", "record-merge", run.id, *merge, "--post-merge-checks", "maybe")
    assert (
        bad.returncode == 1 and "recorded, skipped or failed" in bad.stderr and "Traceback" not in bad.stderr
    )
    wrong = pisub_cli(
        "lane", "record-merge", run.id, *merge[:3], "zz", *merge[4:], "--post-merge-checks", "recorded"
    )
    assert wrong.returncode == 1 and "INVALID_INPUT" in wrong.stderr
    not_equal = pisub_cli("lane", "record-merge", run.id, *merge, "--post-merge-checks", "recorded", "--json")
    assert json.loads(not_equal.stdout)["state"] == "terminal-blocked"
    done = pisub_cli(
        "lane",
        "record-merge",
        run.id,
        *merge,
        "--tree-equivalent",
        "--post-merge-checks",
        "recorded",
        check=True,
    )
    assert f"allows: pisub worktree cleanup --apply --lane {run.id}" in done.stdout
    assert _lane_state(run.id)["state"] == "terminal-eligible"
    handoff = pisub.Run(run.id).dir / "handoff.json"
    assert stat_mode(handoff) == 0o600 and json.loads(handoff.read_text())["merge"]["pr"] == 7

    # Without --lane nothing is removed (captured, never applied); a change blocks the lane.
    plain = json.loads(pisub_cli("worktree", "cleanup", "--plan", "--json", check=True).stdout)["plan"]
    assert {e["reason"] for e in plain} == {"unapplied"}
    worktree_b = Path(pisub.Run(b).manifest().worktree.path)  # type: ignore[union-attr]
    (worktree_b / "late.txt").write_text("written after the merge\n")
    blocked = _lane_state(run.id)
    assert blocked["state"] == "terminal-blocked" and "b" in blocked["reason"]
    out = json.loads(
        pisub_cli("worktree", "cleanup", "--apply", "--lane", run.id, "--json", check=True).stdout
    )
    assert not [r for r in out["removed"] if r["removed"]]
    (worktree_b / "late.txt").unlink()
    assert _lane_state(run.id)["state"] == "terminal-eligible"
    out = json.loads(
        pisub_cli("worktree", "cleanup", "--apply", "--lane", run.id, "--json", check=True).stdout
    )
    assert sorted(r["entry"]["runId"] for r in out["removed"] if r["removed"]) == sorted([a, b])
    assert not worktree_b.exists()
    assert git(repo, "rev-parse", "--verify", f"refs/pisub/{b}").strip()  # the work stays in git
    after = _lane_state(run.id)
    assert after["state"] == "terminal-eligible", after  # the records moved, the facts held


def test_a_lane_superseded_by_another_and_an_active_lane_refuses_evidence(repo: Path) -> None:
    first, _ = _two_writers(repo, "x")
    second, _ = _two_writers(repo, "y")
    done = json.loads(
        pisub_cli(
            "lane",
            "record-supersession",
            first.id,
            "--by-lane",
            second.id,
            "--by",
            "bo",
            "--json",
            check=True,
        ).stdout
    )
    assert done["state"] == "superseded-eligible" and done["supersession"]["byLane"] == second.id
    live = launch_parallel(
        [{"key": "slow", "agent": "editor", "task": "s.txt=1 sleep 30"}], cwd=repo, isolation="worktree"
    )
    wait_for(lambda: live.status().steps and live.status().steps[0].pid, 30)
    assert _lane_state(live.id)["state"] == "active"
    refused = pisub_cli("lane", "record-supersession", live.id, "--by-lane", first.id, "--by", "bo")
    assert refused.returncode == 1 and "active" in refused.stderr
    single = pisub_cli("lane", "status", pisub.Run(done["children"][0]).id)
    assert single.returncode == 1 and "not a workflow run" in single.stderr
    live.send_stop()
    live.wait(timeout=30)


def test_changed_ignored_files_are_a_warning_not_silence(repo: Path) -> None:
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "ignore logs")
    run = launch_parallel(
        [{"key": "l", "agent": "editor", "task": "debug.log=noise"}], cwd=repo, isolation="worktree"
    )
    child = _wait(run).details.results[0].run_id or ""
    shown = pisub_cli("worktree", "list", check=True).stdout
    assert "warning: 1 ignored path(s)" in shown and "debug.log" in shown
    assert '"ignoredChanged":1' in (pisub.Run(child).dir / "events.jsonl").read_text().replace(" ", "")
