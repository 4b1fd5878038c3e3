"""Worktree isolation against real git repositories: preflight, base refs, exact capture
(binary, modes, odd names, hostile configuration), strict apply, cleanup, hostile roots and
git failures. Every repository lives in ``tmp_path``; the user's git configuration is never
read (``GIT_CONFIG_GLOBAL`` points at a file of the test's own)."""

from __future__ import annotations

import os
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from pisub.errors import InvalidInput, PisubError, WorktreeError
from pisub.protocol.codec import encode
from pisub.worktrees import (
    ApplyMode,
    Decision,
    Reason,
    WorktreeRecord,
    WorktreeState,
    allocate,
    apply,
    capture,
    cleanup_plan,
    dirty_paths,
    discard,
    isolation,
    list_records,
    load_record,
    patches,
    preflight,
    record_path,
    remove_safe,
    repo_root,
    resolve_base,
)
from pisub.worktrees.git import run_git

ODD_NAME = "dir with space/naïve файл.txt"
BINARY = bytes(range(256)) * 16


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    """Run plain git (the test's own configuration) and return its stdout."""
    proc = subprocess.run(
        ["git", "-C", str(cwd), *args], input=stdin, capture_output=True, check=False, timeout=30
    )
    assert proc.returncode == 0, f"git {args} failed: {proc.stderr.decode(errors='replace')}"
    return proc.stdout.decode("utf-8", "surrogateescape").strip()


@pytest.fixture(autouse=True)
def git_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private global git configuration; no inherited variable points git elsewhere."""
    config = tmp_path / "gitconfig"
    config.write_text(
        "[user]\n\tname = Test\n\temail = test@example.com\n"
        "[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_PARAMETERS"):
        monkeypatch.delenv(name, raising=False)
    return config


def make_repo(path: Path) -> Path:
    """A repository with text, binary, a script, ignore rules and a tag ``v1``."""
    path.mkdir(parents=True)
    git(path, "init", "-q")
    (path / "a.txt").write_text("".join(f"line {n}\n" for n in range(1, 21)))
    (path / "old.txt").write_text("to be deleted\n")
    (path / "script.sh").write_text("#!/bin/sh\necho hi\n")
    (path / "bin.dat").write_bytes(BINARY)
    (path / "sub").mkdir()
    (path / "sub" / "c.txt").write_text("c\n")
    (path / ".gitignore").write_text("build/\n*.log\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    git(path, "tag", "v1")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "wt-root"


def new_run() -> str:
    return str(uuid.uuid4())


def tree_after_apply(patch: Path, clone: Path) -> str:
    """The tree ``patch`` gives when plain git applies it to ``clone`` (at the base)."""
    if patch.stat().st_size:
        git(clone, "apply", "--index", str(patch))
    return git(clone, "write-tree")


def status_and_bytes(path: Path) -> tuple[str, dict[str, bytes]]:
    """A checkout's status and every file's bytes (outside .git)."""
    files = {}
    for file in sorted(path.rglob("*")):
        if ".git" not in file.relative_to(path).parts and file.is_file():
            files[str(file.relative_to(path))] = file.read_bytes()
    return git(path, "status", "--porcelain=v1"), files


# --- preflight and base refs -------------------------------------------------------------


def test_clean_repo_passes_and_ignored_or_pisub_files_do_not_count(repo: Path) -> None:
    (repo / "sub").joinpath("x.log").write_text("ignored\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.o").write_bytes(b"\0")
    (repo / ".pisub" / "agents").mkdir(parents=True)
    (repo / ".pisub" / "agents" / "a.md").write_text("pisub's own\n")
    assert dirty_paths(repo) == []
    assert preflight(repo / "sub") == repo
    assert repo_root(repo / "sub" / "c.txt") == repo


def test_modified_staged_and_untracked_files_are_dirty(repo: Path) -> None:
    (repo / "a.txt").write_text("changed\n")
    (repo / "new.txt").write_text("staged\n")
    git(repo, "add", "new.txt")
    (repo / "sub" / "untracked.txt").write_text("u\n")
    assert sorted(dirty_paths(repo)) == ["a.txt", "new.txt", "sub/untracked.txt"]
    with pytest.raises(InvalidInput) as caught:
        preflight(repo)
    message = caught.value.message
    assert "has uncommitted changes: " in message and "sub/untracked.txt" in message
    assert "isolation is never dropped" in message and "\n" not in message


def test_a_long_dirty_list_is_cut_at_twenty(repo: Path) -> None:
    for n in range(25):
        (repo / f"u{n:02}.txt").write_text("u\n")
    with pytest.raises(InvalidInput, match="and 5 more"):
        preflight(repo)


def test_not_a_repository_is_invalid_input(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(InvalidInput, match="not inside a git work tree"):
        repo_root(tmp_path / "plain")
    with pytest.raises(InvalidInput, match="does not exist"):
        repo_root(tmp_path / "missing")


def test_base_refs_resolve_to_full_commits(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "branch", "feature")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    git(repo, "commit", "-q", "--allow-empty", "-m", "later")
    assert resolve_base(repo, None) == git(repo, "rev-parse", "HEAD") != head
    assert resolve_base(repo, "feature") == head
    assert resolve_base(repo, "v1") == head
    assert resolve_base(repo, head[:10]) == head
    assert resolve_base(repo, head) == head
    assert resolve_base(clone, "origin/feature") == head
    assert resolve_base(clone, "refs/remotes/origin/main") == head


@pytest.mark.parametrize("bad", ["-x", "--output=/tmp/x", "nope", "HEAD~999", "", "a\nb", "BLOB"])
def test_bad_base_refs_are_refused(repo: Path, bad: str) -> None:
    if bad == "BLOB":
        bad = git(repo, "rev-parse", "HEAD:a.txt")
    with pytest.raises(InvalidInput, match="base ref"):
        resolve_base(repo, bad)


# --- allocate and capture -----------------------------------------------------------------


def edit_everything(worktree: Path) -> None:
    """Modify, add, delete, binary (new and changed), odd name, executable bit, symlink, a
    commit made by the child itself, and an ignored file."""
    (worktree / "a.txt").write_text("LINE ONE\n" + "".join(f"line {n}\n" for n in range(2, 21)) + "more\n")
    git(worktree, "add", "a.txt")
    git(worktree, "commit", "-q", "-m", "child commit")
    (worktree / "a.txt").write_text((worktree / "a.txt").read_text() + "after commit\n")
    (worktree / "old.txt").unlink()
    (worktree / "new.bin").write_bytes(b"\0\x01\x02" + BINARY[::-1])
    changed = bytearray(BINARY)
    changed[100:104] = b"\xff\0\xff\0"
    (worktree / "bin.dat").write_bytes(bytes(changed))
    odd = worktree / ODD_NAME
    odd.parent.mkdir()
    odd.write_text("ünïcödé\n")
    (worktree / "script.sh").chmod(0o755)
    os.symlink("a.txt", worktree / "link")
    (worktree / "build").mkdir()
    (worktree / "build" / "artifact.o").write_bytes(b"\0\0")


def test_capture_reproduces_the_exact_tree(repo: Path, root: Path, tmp_path: Path) -> None:
    run_id = new_run()
    record = allocate(repo, base_ref="v1", run_id=run_id, key="writer", root=root)
    worktree = Path(record.path)
    assert worktree == root.resolve() / run_id and worktree.is_dir()
    assert record.state is WorktreeState.ALLOCATED and record.base_ref == "v1"
    assert record.branch == f"pisub/{run_id[:8]}/writer"
    assert git(repo, "rev-parse", f"refs/heads/{record.branch}") == record.base_commit
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    rec_file = record_path(root, run_id)
    assert stat.S_IMODE(rec_file.stat().st_mode) == 0o600
    assert load_record(rec_file) == record

    edit_everything(worktree)
    patch = tmp_path / "patches" / f"{run_id}.patch"
    captured = capture(rec_file, patch)

    assert captured.state is WorktreeState.CAPTURED and load_record(rec_file) == captured
    assert captured.patch is not None and captured.patch.path == str(patch)
    import hashlib

    data = patch.read_bytes()
    assert captured.patch.sha256 == hashlib.sha256(data).hexdigest() and captured.patch.size == len(data)
    assert stat.S_IMODE(patch.stat().st_mode) == 0o600
    assert ODD_NAME in captured.patch.files and "old.txt" in captured.patch.files
    assert captured.patch.ignored_changed == ["build/"]
    assert data.startswith(b"diff --git a/") and b"GIT binary patch" in data and b"\x1b[" not in data
    # The ref keeps the work: its tree is the worktree's, and it sits on the base.
    assert captured.ref == f"refs/pisub/{run_id}"
    commit = git(repo, "rev-parse", captured.ref)
    assert commit == captured.capture_commit
    assert git(repo, "rev-parse", f"{commit}^") == record.base_commit
    # Plain git applies the patch to a fresh clone at the base and gets the very same tree.
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    git(clone, "checkout", "-q", record.base_commit)
    assert tree_after_apply(patch, clone) == git(repo, "rev-parse", f"{commit}^{{tree}}")
    assert os.access(clone / "script.sh", os.X_OK) and os.readlink(clone / "link") == "a.txt"


def test_capture_is_idempotent_and_an_empty_change_is_a_valid_patch(
    repo: Path, root: Path, tmp_path: Path
) -> None:
    run_id = new_run()
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    rec_file = record_path(root, run_id)
    patch = tmp_path / "p.patch"
    empty = capture(rec_file, patch)
    assert empty.patch is not None and empty.patch.size == 0 and patch.read_bytes() == b""
    assert git(repo, "rev-parse", f"{empty.capture_commit}^{{tree}}") == git(repo, "rev-parse", "HEAD^{tree}")
    (Path(record.path) / "a.txt").write_text("new\n")
    again = capture(rec_file, patch)
    assert again.patch is not None and again.patch.size > 0 and again.patch.files == ["a.txt"]
    assert git(repo, "rev-parse", f"refs/pisub/{run_id}") == again.capture_commit != empty.capture_commit
    assert capture(rec_file, patch).patch == again.patch


def test_a_patch_that_does_not_reproduce_the_work_saves_nothing(
    repo: Path, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corrupted diff (what a user's diff.external once did) is caught before anything is
    saved, and the worktree keeps the work."""
    run_id = new_run()
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    (Path(record.path) / "a.txt").write_text("work\n")
    (Path(record.path) / "b.txt").write_text("more work\n")
    real = patches.staged_patch

    def corrupted(worktree: Path, base: str) -> bytes:
        patch = real(worktree, base)
        return patch[patch.index(b"diff --git a/b.txt") :]  # a.txt's change is lost

    monkeypatch.setattr(isolation, "staged_patch", corrupted)
    with pytest.raises(WorktreeError, match="does not reproduce its work"):
        capture(record_path(root, run_id), tmp_path / "p.patch")
    assert not (tmp_path / "p.patch").exists()
    assert git(repo, "for-each-ref", "refs/pisub/") == ""
    assert load_record(record_path(root, run_id)).state is WorktreeState.ALLOCATED
    assert (Path(record.path) / "a.txt").read_text() == "work\n"


def test_the_record_on_disk_is_camel_case_json(repo: Path, root: Path, tmp_path: Path) -> None:
    import json

    run_id = new_run()
    record = allocate(repo, base_ref="main", run_id=run_id, key="k", root=root)
    (Path(record.path) / "a.txt").write_text("x\n")
    with pytest.raises(InvalidInput, match="inside the worktree"):
        capture(record_path(root, run_id), Path(record.path) / "p.patch")
    with pytest.raises(InvalidInput, match="in the worktree root"):
        capture(record_path(root, run_id), root / "p.patch")
    capture(record_path(root, run_id), tmp_path / "p.patch")
    data = json.loads(record_path(root, run_id).read_bytes())
    assert data["v"] == 1 and data["runId"] == run_id and data["baseRef"] == "main"
    assert data["state"] == "captured" and data["ref"] == f"refs/pisub/{run_id}"
    assert set(data["patch"]) >= {"path", "sha256", "bytes", "files", "ignoredChanged"}
    assert {"repo", "path", "branch", "baseCommit", "captureCommit", "createdAt", "capturedAt"} <= set(data)
    # Readers are forward compatible: an unknown field from a newer pisub is ignored.
    data["fromTheFuture"] = {"x": 1}
    record_path(root, run_id).write_text(json.dumps(data))
    assert load_record(record_path(root, run_id)).run_id == run_id


def test_hostile_repository_configuration_cannot_change_the_patch(
    repo: Path, root: Path, tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.sh"
    garbage.write_text("#!/bin/sh\necho GARBAGE FROM EXTERNAL DIFF\n")
    garbage.chmod(0o755)
    for key, value in [
        ("diff.external", str(garbage)),
        ("diff.upper.textconv", "tr a-z A-Z"),
        ("diff.noprefix", "true"),
        ("diff.mnemonicPrefix", "true"),
        ("color.ui", "always"),
        ("color.diff", "always"),
        ("diff.renames", "copies"),
        ("diff.context", "0"),
        ("diff.relative", "true"),
        ("diff.orderFile", str(garbage)),
        ("core.quotepath", "true"),
        ("apply.whitespace", "error"),
        ("commit.gpgSign", "true"),
        ("core.hooksPath", str(tmp_path / "hooks")),
    ]:
        git(repo, "config", key, value)
    (tmp_path / "hooks").mkdir()
    hook = tmp_path / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {tmp_path}/hook-ran\nexit 1\n")
    hook.chmod(0o755)
    (repo / ".gitattributes").write_text("*.txt diff=upper\n")
    git(repo, "add", ".gitattributes")
    git(repo, "-c", "core.hooksPath=/dev/null", "commit", "-q", "--no-gpg-sign", "-m", "attrs")

    run_id = new_run()
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    assert not (tmp_path / "hook-ran").exists()
    worktree = Path(record.path)
    (worktree / "a.txt").write_text("trailing space \n" + (worktree / "a.txt").read_text())
    (worktree / "sub" / "c.txt").rename(worktree / "sub" / "moved.txt")
    odd = worktree / ODD_NAME
    odd.parent.mkdir()
    odd.write_text("x\n")
    patch = tmp_path / "p.patch"
    captured = capture(record_path(root, run_id), patch)
    data = patch.read_bytes()
    assert b"GARBAGE" not in data and b"\x1b[" not in data and b"LINE" not in data
    assert b"diff --git a/a.txt b/a.txt" in data and b"rename" not in data
    assert ODD_NAME.encode() in data
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    git(clone, "checkout", "-q", record.base_commit)
    assert tree_after_apply(patch, clone) == git(repo, "rev-parse", f"{captured.capture_commit}^{{tree}}")
    # pisub's own apply into the hostile repository works too (whitespace=error is overridden).
    report = apply(record_path(root, run_id))
    assert report.ok, report
    assert (repo / ODD_NAME).read_text() == "x\n"


def test_inherited_git_variables_do_not_redirect_git(
    repo: Path, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = make_repo(tmp_path / "other")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "bogus-index"))
    (repo / "dirty.txt").write_text("d\n")
    assert dirty_paths(repo) == ["dirty.txt"]
    assert repo_root(repo) == repo


# --- apply ----------------------------------------------------------------------------------


def test_two_writers_on_one_line_first_applies_second_conflicts_and_changes_nothing(
    repo: Path, root: Path, tmp_path: Path
) -> None:
    records = []
    for n, text in enumerate(["first writer\n", "second writer\n"]):
        run_id = new_run()
        record = allocate(repo, base_ref=None, run_id=run_id, key=f"w{n}", root=root)
        lines = (Path(record.path) / "a.txt").read_text().splitlines(keepends=True)
        (Path(record.path) / "a.txt").write_text(text + "".join(lines[1:]))
        (Path(record.path) / f"only-{n}.txt").write_text("mine\n")
        capture(record_path(root, run_id), tmp_path / f"{run_id}.patch")
        records.append(record)

    first = apply(record_path(root, records[0].run_id))
    assert first.ok and first.mode is ApplyMode.INDEX and first.conflicts == []
    assert (repo / "a.txt").read_text().startswith("first writer\n")
    assert load_record(record_path(root, records[0].run_id)).state is WorktreeState.APPLIED

    before = status_and_bytes(repo)
    second = apply(record_path(root, records[1].run_id))
    assert not second.ok and second.mode is ApplyMode.WORKTREE
    assert [c.path for c in second.conflicts] == ["a.txt"]
    assert "line 1" in second.conflicts[0].reason
    assert status_and_bytes(repo) == before
    assert not (repo / "only-1.txt").exists()
    assert load_record(record_path(root, records[1].run_id)).state is WorktreeState.CAPTURED
    with pytest.raises(InvalidInput, match="it is applied"):
        apply(record_path(root, records[0].run_id))


def test_apply_names_each_kind_of_conflict(repo: Path, root: Path, tmp_path: Path) -> None:
    run_id = new_run()
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    worktree = Path(record.path)
    (worktree / "new.txt").write_text("new\n")
    (worktree / "old.txt").unlink()
    (worktree / "sub" / "c.txt").write_text("child\n")
    capture(record_path(root, run_id), tmp_path / "p.patch")
    (repo / "new.txt").write_text("already here\n")  # untracked in the way
    (repo / "sub" / "c.txt").write_text("local edit\n")  # unstaged edit of a patched file
    before = status_and_bytes(repo)
    report = apply(record_path(root, run_id))
    assert not report.ok and report.mode is ApplyMode.INDEX
    reasons = {c.path: c.reason for c in report.conflicts}
    assert "already exists in working directory" in reasons["new.txt"]
    assert "does not match index" in reasons["sub/c.txt"]
    assert status_and_bytes(repo) == before


def test_apply_refuses_a_changed_patch_file(repo: Path, root: Path, tmp_path: Path) -> None:
    run_id = new_run()
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    (Path(record.path) / "a.txt").write_text("x\n")
    patch = tmp_path / "p.patch"
    capture(record_path(root, run_id), patch)
    patch.write_bytes(patch.read_bytes().replace(b"+x", b"+y"))
    with pytest.raises(WorktreeError, match="changed since it was captured"):
        apply(record_path(root, run_id))
    assert (repo / "a.txt").read_text().startswith("line 1")


def test_apply_into_another_checkout(repo: Path, root: Path, tmp_path: Path) -> None:
    run_id = new_run()
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    (Path(record.path) / "a.txt").write_text("x\n")
    capture(record_path(root, run_id), tmp_path / "p.patch")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    with pytest.raises(InvalidInput, match="worktree itself"):
        apply(record_path(root, run_id), into=Path(record.path))
    report = apply(record_path(root, run_id), into=clone / "sub")
    assert b'"mode":"index"' in encode(report)
    assert report.ok and report.target == str(clone) and report.files == ["a.txt"]
    assert (clone / "a.txt").read_text() == "x\n" and (repo / "a.txt").read_text() != "x\n"
    with pytest.raises(InvalidInput):
        apply(record_path(root, run_id), into=clone)


# --- allocate refusals, discard ------------------------------------------------------------


def test_allocate_refusals(repo: Path, root: Path) -> None:
    with pytest.raises(InvalidInput, match="inside the repository"):
        allocate(repo, base_ref=None, run_id=new_run(), key="k", root=repo / ".wt")
    assert not (repo / ".wt").exists()
    with pytest.raises(InvalidInput, match="not a run id"):
        allocate(repo, base_ref=None, run_id="../x", key="k", root=root)
    with pytest.raises(InvalidInput, match="not a child key"):
        allocate(repo, base_ref=None, run_id=new_run(), key="-k", root=root)
    with pytest.raises(InvalidInput, match="not a valid git branch name"):
        allocate(repo, base_ref=None, run_id=new_run(), key="a..b", root=root)
    with pytest.raises(InvalidInput, match="base ref"):
        allocate(repo, base_ref="nope", run_id=new_run(), key="k", root=root)
    run_id = new_run()
    git(repo, "branch", f"pisub/{run_id[:8]}/k")
    with pytest.raises(WorktreeError, match="create the worktree"):
        allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    assert not record_path(root, run_id).exists() and not (root / run_id).exists()
    (repo / "a.txt").write_text("dirty\n")
    with pytest.raises(InvalidInput, match=r"uncommitted changes: a\.txt"):
        allocate(repo, base_ref=None, run_id=new_run(), key="k", root=root)


def test_discard_removes_worktree_branch_and_ref(repo: Path, root: Path, tmp_path: Path) -> None:
    run_id = new_run()
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    (Path(record.path) / "a.txt").write_text("x\n")
    rec_file = record_path(root, run_id)
    capture(rec_file, tmp_path / "p.patch")
    discard(rec_file)
    assert not Path(record.path).exists()
    assert record.branch not in git(repo, "branch", "--list")
    assert git(repo, "for-each-ref", "refs/pisub/") == ""
    assert load_record(rec_file).state is WorktreeState.DISCARDED
    assert (tmp_path / "p.patch").exists()
    [entry] = cleanup_plan(root, lambda _: False)
    assert (entry.decision, entry.reason) == (Decision.REMOVE, Reason.SAFE)
    with pytest.raises(InvalidInput, match="it is discarded"):
        capture(rec_file, tmp_path / "p.patch")


# --- cleanup --------------------------------------------------------------------------------


def test_cleanup_plan_and_remove_safe(repo: Path, root: Path, tmp_path: Path) -> None:
    runs: dict[str, str] = {}

    def start(name: str, edit: bool = True, do_capture: bool = True) -> WorktreeRecord:
        run_id = new_run()
        runs[name] = run_id
        record = allocate(repo, base_ref=None, run_id=run_id, key=name, root=root)
        if edit:
            (Path(record.path) / f"{name}.txt").write_text(f"{name}\n")
        if do_capture:
            capture(record_path(root, run_id), tmp_path / f"{name}.patch")
        return record

    start("allocated", do_capture=False)
    start("captured")
    edited = start("edited")
    (Path(edited.path) / "edited.txt").write_text("more\n")
    for name in ("applied", "applied2", "active"):
        start(name)
    for name in ("applied", "applied2", "active"):
        assert apply(record_path(root, runs[name])).ok
    (root / "stray").mkdir()
    live = {runs["active"]}

    plan = {entry.name: entry for entry in cleanup_plan(root, lambda run_id: run_id in live)}
    got = {name: (plan[run_id].decision, plan[run_id].reason) for name, run_id in runs.items()}
    assert got == {
        "allocated": (Decision.KEEP, Reason.UNCAPTURED),
        "captured": (Decision.KEEP, Reason.UNAPPLIED),
        "edited": (Decision.KEEP, Reason.DIRTY),
        "applied": (Decision.REMOVE, Reason.SAFE),
        "applied2": (Decision.REMOVE, Reason.SAFE),
        "active": (Decision.KEEP, Reason.ACTIVE),
    }
    assert (plan["stray"].decision, plan["stray"].reason) == (Decision.UNKNOWN, Reason.UNKNOWN)
    # Planning changed nothing: the edited worktree's own index does not hold the new edit.
    assert git(Path(edited.path), "status", "--porcelain") == "AM edited.txt"

    # Between plan and removal, applied2's worktree gets an edit: the re-check keeps it.
    applied2 = Path(load_record(record_path(root, runs["applied2"])).path)
    (applied2 / "late.txt").write_text("late\n")
    removals = remove_safe(root, list(plan.values()), lambda run_id: run_id in live)
    outcome = {r.entry.run_id: (r.removed, r.entry.reason) for r in removals}
    assert outcome == {runs["applied"]: (True, Reason.SAFE), runs["applied2"]: (False, Reason.DIRTY)}

    gone = runs["applied"]
    assert not (root / gone).exists() and not record_path(root, gone).exists()
    moved = load_record(record_path(root / ".removed", gone))
    assert moved.removed_at is not None and moved.state is WorktreeState.APPLIED
    assert f"pisub/{gone[:8]}/applied" not in git(repo, "branch", "--list")
    assert git(repo, "for-each-ref", f"refs/pisub/{gone}") == ""
    assert str(root.resolve() / gone) not in git(repo, "worktree", "list")
    for name in ("allocated", "captured", "edited", "applied2", "active", "stray"):
        assert (root / runs.get(name, name)).is_dir(), name
    after = {entry.name for entry in cleanup_plan(root, lambda _: False)}
    assert gone not in after and "stray" in after


@pytest.mark.serial  # bounds the elapsed time
def test_hostile_entries_in_the_root_are_reported_never_followed(
    repo: Path, root: Path, tmp_path: Path
) -> None:
    run_id = new_run()
    allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    (root / "x.json").mkdir()
    (root / "y.json").symlink_to("/etc/passwd")
    os.mkfifo(root / "z.json")
    (root / "w.json").write_bytes(b"")
    with open(root / "h.json", "wb") as fh:
        fh.truncate(1 << 30)  # sparse
    (root / os.fsdecode(b"\xff\xfe.json")).write_bytes(b"{}")
    other = new_run()
    forged = load_record(record_path(root, run_id))
    (root / f"{other}.json").write_bytes(
        record_path(root, run_id)
        .read_bytes()
        .replace(f'"runId": "{run_id}"'.encode(), f'"runId": "{other}"'.encode())
    )
    (root / "t.json").write_bytes(record_path(root, run_id).read_bytes())  # names another run
    os.symlink(forged.path, root / "dirlink")

    started = time.monotonic()
    listed = dict(list_records(root))
    errors = {path.name: found for path, found in listed.items() if isinstance(found, str)}
    assert isinstance(listed[record_path(root, run_id)], WorktreeRecord)
    assert "directory" in errors["x.json"] and "symlink" in errors["y.json"]
    assert "FIFO" in errors["z.json"] and "not valid JSON" in errors["w.json"]
    assert "larger than" in errors["h.json"] and "names another run" in errors["t.json"]
    assert os.fsdecode(b"\xff\xfe.json") in errors
    assert all("\n" not in line for line in errors.values())

    plan = {entry.name: entry for entry in cleanup_plan(root, lambda _: False)}
    assert time.monotonic() - started < 10
    assert plan[run_id].reason is Reason.UNCAPTURED
    # The forged record points at run_id's worktree, which is not <root>/<other>: unknown.
    assert plan[other].decision is Decision.UNKNOWN and "not in this root" in plan[other].detail
    for name in ("x", "y", "z", "w", "h", "t", "dirlink"):
        assert plan[name].decision is Decision.UNKNOWN, name
    assert "\\udcff" in "".join(plan)
    encode(list(plan.values()))  # printable: encodes as JSON despite the undecodable name
    # Even an entry forged to say "remove" is re-judged and not removed.
    forged_entry = plan[other].__class__(
        name=other, run_id=other, decision=Decision.REMOVE, reason=Reason.SAFE
    )
    [removal] = remove_safe(root, [forged_entry])
    assert not removal.removed and removal.entry.decision is Decision.UNKNOWN
    with pytest.raises(InvalidInput, match="not in this root"):
        discard(root / f"{other}.json")
    with pytest.raises(InvalidInput, match="names another run"):
        capture(root / "t.json", tmp_path / "p.patch")
    assert Path(forged.path).is_dir()
    assert (root / "y.json").is_symlink() and Path("/etc/passwd").exists()


# --- git failures ---------------------------------------------------------------------------


def test_a_missing_root_lists_nothing_and_a_symlinked_root_is_refused(tmp_path: Path) -> None:
    assert list_records(tmp_path / "missing") == []
    assert cleanup_plan(tmp_path / "missing", lambda _: False) == []
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(PisubError, match="list the worktree root"):
        list_records(tmp_path / "link")
    with pytest.raises(InvalidInput, match="no worktree record"):
        capture(tmp_path / "real" / f"{new_run()}.json", tmp_path / "p.patch")


def test_git_missing_is_one_line_naming_git(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(WorktreeError) as caught:
        preflight(repo)
    assert caught.value.code == "WORKTREE_ERROR" and isinstance(caught.value, PisubError)
    assert "git is not installed or not on PATH" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.serial  # bounds the elapsed time
def test_a_hung_git_is_killed_at_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "git").write_text("#!/bin/sh\nsleep 30 &\nsleep 30\n")
    (fake / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    started = time.monotonic()
    with pytest.raises(WorktreeError, match=r"did not finish within 0\.3s"):
        run_git(tmp_path, ["status"], what="read the status", timeout=0.3)
    assert time.monotonic() - started < 5


def test_a_failing_git_call_names_the_operation_and_the_fix(repo: Path, root: Path, tmp_path: Path) -> None:
    run_id = new_run()
    record = allocate(repo, base_ref=None, run_id=run_id, key="k", root=root)
    (Path(record.path) / "a.txt").write_text("x\n")
    lock = Path(git(Path(record.path), "rev-parse", "--absolute-git-dir")) / "index.lock"
    lock.write_text("")  # a git killed mid-operation
    with pytest.raises(WorktreeError) as caught:
        capture(record_path(root, run_id), tmp_path / "p.patch")
    assert (
        "cannot stage the worktree's changes" in caught.value.message and "index.lock" in caught.value.message
    )
    assert load_record(record_path(root, run_id)).state is WorktreeState.ALLOCATED
    assert not (tmp_path / "p.patch").exists()
