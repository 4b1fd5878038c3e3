"""Repositories that try to run their own programs inside pisub's git calls, and repositories
with submodules (issue 23). Every program a repository's configuration names — filter drivers
(``clean``/``smudge``/``process``, even ``required``), ``diff`` drivers (external command,
textconv), ``merge`` drivers, hooks — must never run in allocate, capture, the cleanup checks,
a reviewer's diff or apply; the work still round-trips byte-exact. Work inside a submodule
is refused at capture (no patch carries another repository's commits), never silently dropped.
Real git repositories."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pisub.acceptance.review import diff_of
from pisub.errors import WorktreeError
from pisub.protocol.worktree import WorktreeState
from pisub.worktrees import Decision, Reason, allocate, apply, capture, cleanup_plan, load_record, record_path
from pisub.worktrees.cleanup import leftover_work, uncaptured_change
from pisub.worktrees.git import filter_drivers
from tests.conftest import wait_for
from tests.integration.test_worktree_git import git, git_config, make_repo  # noqa: F401

HOOKS = ("post-checkout", "pre-commit", "post-commit", "reference-transaction", "post-index-change")


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


def _hostile_repo(path: Path, markers: Path) -> Path:
    repo = make_repo(path)
    (repo / ".gitattributes").write_text("*.txt filter=evil diff=evil merge=evil\n")
    git(repo, "add", ".gitattributes")
    git(repo, "-c", "core.hooksPath=/dev/null", "commit", "-qm", "attributes")
    for key, value in [
        ("filter.evil.clean", f"sh -c 'touch {markers}/clean-$$; tr a-z A-Z'"),
        ("filter.evil.smudge", f"sh -c 'touch {markers}/smudge-$$; cat'"),
        ("filter.evil.process", f"sh -c 'touch {markers}/process-$$; exit 1'"),
        ("filter.evil.required", "true"),
        ("filter.Other.clean", f"sh -c 'touch {markers}/other-$$; cat'"),
        ("diff.evil.textconv", f"sh -c 'touch {markers}/textconv-$$; cat \"$0\"'"),
        ("diff.evil.command", f"sh -c 'touch {markers}/extdiff-$$'"),
        ("merge.evil.driver", f"sh -c 'touch {markers}/merge-$$'"),
    ]:
        git(repo, "config", key, value)
    for hook in HOOKS:
        script = repo / ".git" / "hooks" / hook
        script.write_text(f"#!/bin/sh\ntouch {markers}/hook-{hook}\n")
        script.chmod(0o755)
    return repo


def _ran(markers: Path) -> list[str]:
    return sorted(os.listdir(markers))


def test_no_program_a_repository_names_runs_in_any_pisub_git_call(tmp_path: Path, markers: Path) -> None:
    repo = _hostile_repo(tmp_path / "repo", markers)
    assert filter_drivers(repo) == ["evil", "Other"]
    root = tmp_path / "root"
    run_id = str(uuid.uuid4())
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    assert _ran(markers) == [], "allocate (git worktree add: checkout, hooks)"
    worktree = Path(record.path)
    (worktree / "a.txt").write_text("lower case stays lower\n")
    (worktree / "new.txt").write_text("new file\n")
    (worktree / "docs.md").write_text("the child's own attributes\n")
    (worktree / ".gitattributes").write_text("*.txt filter=evil diff=evil\n*.md filter=Other\n")
    captured = capture(record_path(root, run_id), tmp_path / "p.patch")
    assert _ran(markers) == [], "capture (git add, write-tree, diff)"
    data = (tmp_path / "p.patch").read_bytes()
    assert b"+lower case stays lower" in data and b"LOWER" not in data  # stored bytes, no clean filter
    assert uncaptured_change(captured) is None and leftover_work(captured) is None
    assert {e.reason for e in cleanup_plan(root, lambda _rid: False)} == {Reason.UNAPPLIED}
    assert _ran(markers) == [], "the cleanup checks (snapshot of the worktree)"
    review = diff_of(worktree, None)
    assert review is not None and "lower case stays lower" in review
    assert _ran(markers) == [], "a reviewer's diff (textconv, external diff)"
    report = apply(record_path(root, run_id))
    assert report.ok, report
    assert _ran(markers) == [], "apply (git apply --index)"
    assert (repo / "a.txt").read_bytes() == b"lower case stays lower\n"
    assert (repo / "docs.md").read_bytes() == b"the child's own attributes\n"


def test_a_filter_driver_that_cannot_be_switched_off_refuses_git(tmp_path: Path, markers: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "config", "filter.a=b.clean", f"touch {markers}/ran")
    (repo / ".gitattributes").write_text("* filter=a=b\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-qm", "a")
    for name in _ran(markers):  # the test's own git ran it
        (markers / name).unlink()
    with pytest.raises(WorktreeError, match="cannot be switched off"):
        allocate(repo, base_ref=None, run_id=str(uuid.uuid4()), key="k", root=tmp_path / "root")
    assert _ran(markers) == []


def _repo_with_submodule(tmp_path: Path) -> Path:
    lib = make_repo(tmp_path / "lib")
    repo = make_repo(tmp_path / "repo")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
    git(repo, "commit", "-qm", "submodule")
    return repo


@pytest.mark.parametrize("work", ["superproject-only", "files-in-submodule", "submodule-moved"])
def test_work_in_a_submodule_is_refused_at_capture_and_the_worktree_kept(tmp_path: Path, work: str) -> None:
    repo = _repo_with_submodule(tmp_path)
    root = tmp_path / "root"
    run_id = str(uuid.uuid4())
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    worktree = Path(record.path)
    assert os.listdir(worktree / "lib") == []  # never cloned, nothing fetched, no hook ran
    (worktree / "a.txt").write_text("superproject edit\n")
    if work == "files-in-submodule":
        (worktree / "lib" / "l.txt").write_text("an edit git add -A cannot see\n")
    elif work == "submodule-moved":
        subprocess.run(
            [
                "git",
                "-C",
                str(worktree),
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "update",
                "--init",
                "-q",
            ],
            check=True,
            capture_output=True,
        )
        (worktree / "lib" / "a.txt").write_text("a commit only this clone has\n")
        git(worktree / "lib", "commit", "-qam", "inner")
    rec_path = record_path(root, run_id)
    if work == "superproject-only":
        captured = capture(rec_path, tmp_path / "p.patch")
        assert captured.patch is not None and captured.patch.files == ["a.txt"]
        assert apply(rec_path).ok and (repo / "a.txt").read_text() == "superproject edit\n"
        return
    with pytest.raises(WorktreeError, match="submodule") as refused:
        capture(rec_path, tmp_path / "p.patch")
    assert "nothing was saved and the worktree is kept" in refused.value.message
    assert load_record(rec_path).state is WorktreeState.ALLOCATED
    assert not (tmp_path / "p.patch").exists()
    [entry] = cleanup_plan(root, lambda _rid: False)
    assert entry.decision is Decision.KEEP and entry.reason is Reason.UNCAPTURED


SHIM = """#!/bin/sh
for a in "$@"; do case "$a" in --check|--cached) exec {real} "$@";; esac; done
for a in "$@"; do
    if [ "$a" = apply ]; then {real} "$@"; rc=$?; touch {marker}; sleep 2; exit $rc; fi
done
exec {real} "$@"
"""
APPLIER = """
import sys
from pathlib import Path
from pisub.worktrees import apply
apply(Path(sys.argv[1]))
"""


def test_an_interrupted_apply_is_whole_and_its_record_says_so(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    root = tmp_path / "root"
    run_id = str(uuid.uuid4())
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    for n in range(50):
        (Path(record.path) / f"f{n}.txt").write_text(f"{n}\n")
    capture(record_path(root, run_id), tmp_path / "p.patch")
    shim = tmp_path / "shim"
    shim.mkdir()
    marker = tmp_path / "git-applied"
    real = subprocess.run(
        ["sh", "-c", "command -v git"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (shim / "git").write_text(SHIM.format(real=real, marker=marker))
    (shim / "git").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    applier = subprocess.Popen(
        [sys.executable, "-c", APPLIER, str(record_path(root, run_id))], env=env, stderr=subprocess.PIPE
    )
    wait_for(marker.exists, 60, what="git apply to have written the files")
    applier.send_signal(signal.SIGINT)  # Ctrl-C while git is still running
    _, err = applier.communicate(timeout=60)
    assert applier.returncode != 0 and b"KeyboardInterrupt" in err  # the interrupt still counts
    assert all((repo / f"f{n}.txt").read_text() == f"{n}\n" for n in range(50))
    assert load_record(record_path(root, run_id)).state is WorktreeState.APPLIED
