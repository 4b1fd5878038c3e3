"""The workspace contract (pisub/worktrees/workspace.py): where a child works — in place or in
a git worktree of its own — keeps these promises. Every test uses a real git repository in
``tmp_path`` and a real pisub home; the user's git configuration is never read."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from pisub.core.fsio import private_mkdir
from pisub.errors import InvalidInput, PisubError
from pisub.protocol import AgentSpec, Limits, Manifest
from pisub.protocol.fields import Isolation
from pisub.protocol.worktree import WorktreeRecord, WorktreeState
from pisub.store.paths import Home
from pisub.worktrees.records import load_record
from pisub.worktrees.workspace import GitWorktree, InPlace, Workspace, workspace, workspace_of

WORKSPACES: dict[str, type[InPlace] | type[GitWorktree]] = {"in-place": InPlace, "worktree": GitWorktree}


def git(cwd: Path, *args: str) -> str:
    """Plain git (the test's own configuration); its stdout."""
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, check=False, timeout=30)
    assert done.returncode == 0, f"git {args} failed: {done.stderr.decode(errors='replace')}"
    return done.stdout.decode("utf-8", "surrogateescape")


@pytest.fixture(autouse=True)
def git_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A private global git configuration; no inherited variable points git or pisub elsewhere."""
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = Test\n\temail = t@example.com\n[init]\n\tdefaultBranch = main\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_PARAMETERS", "PISUB_WORKTREES"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=list(WORKSPACES), ids=list(WORKSPACES))
def space(request: pytest.FixtureRequest) -> Workspace:
    made: Workspace = WORKSPACES[request.param]()
    return made


@pytest.fixture
def home(tmp_path: Path) -> Home:
    private_mkdir(tmp_path / "home")
    return Home(tmp_path / "home")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed repository: ``README`` at the top, ``sub/c.txt`` and ``sub/gone.txt`` below."""
    path = tmp_path / "repo"
    (path / "sub").mkdir(parents=True)
    git(path, "init", "-q")
    (path / "README").write_text("readme\n")
    (path / "sub" / "c.txt").write_text("c\n")
    (path / "sub" / "gone.txt").write_text("to be deleted\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return path


def manifest_in(cwd: Path) -> Manifest:
    spec = AgentSpec(name="x", runner="external-cli", command="true")
    limits = Limits(timeout=None, idle_timeout=None, grace=1, output_cap=1 << 20, output_hard_cap=1 << 26)
    return Manifest(
        v=1,
        run_id=str(uuid.uuid4()),
        created_at="2026-01-01T00:00:00Z",
        agent=spec,
        task="work",
        cwd=str(cwd),
        umask=0o22,
        limits=limits,
        key="k1",
    )


def prepared(space: Workspace, home: Home, repo: Path) -> Manifest:
    cwd = repo / "sub"
    space.check(cwd, "k1", None)
    return space.prepare(home, manifest_in(cwd), "k1", None)


def files_of(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory`` (outside ``.git``) and its bytes."""
    return {
        str(f.relative_to(directory)): f.read_bytes()
        for f in sorted(directory.rglob("*"))
        if f.is_file() and ".git" not in f.relative_to(directory).parts
    }


def do_work(cwd: Path) -> None:
    """What a child does: adds a file, changes one, deletes one."""
    (cwd / "new.txt").write_text("new work\n")
    (cwd / "c.txt").write_text("c changed\n")
    (cwd / "gone.txt").unlink()


def saved_files(saved: WorktreeRecord | None, placed: Manifest, repo: Path) -> dict[str, bytes]:
    """The files of the child's directory as what its capture saved keeps them: the directory
    itself when nothing needed saving, else the captured commit."""
    if saved is None:
        return files_of(Path(placed.cwd))
    assert saved.capture_commit is not None
    names = git(repo, "ls-tree", "-r", "--name-only", saved.capture_commit, "--", "sub/").split()
    show = ["git", "-C", str(repo), "show"]
    return {
        name.removeprefix("sub/"): subprocess.run(
            [*show, f"{saved.capture_commit}:{name}"], capture_output=True, check=True
        ).stdout
        for name in names
    }


# --- the promises every workspace keeps ----------------------------------------------------


def test_check_creates_nothing(space: Workspace, home: Home, repo: Path) -> None:
    before = git(repo, "status", "--porcelain=v1", "--ignored"), git(repo, "worktree", "list")
    space.check(repo / "sub", "k1", None)
    assert (git(repo, "status", "--porcelain=v1", "--ignored"), git(repo, "worktree", "list")) == before
    assert not home.worktrees.exists()


def test_prepare_places_the_child_at_the_same_place_in_its_tree(
    space: Workspace, home: Home, repo: Path
) -> None:
    given = manifest_in(repo / "sub")
    placed = space.prepare(home, given, "k1", None)
    cwd = Path(placed.cwd)
    assert cwd.is_dir() and cwd.name == "sub"
    assert files_of(cwd) == files_of(repo / "sub")
    assert (cwd.parent / "README").read_text() == "readme\n"
    # the same launch request but for where it works; the given one is not changed
    assert given.cwd == str(repo / "sub") and given.worktree is None
    same = (placed.run_id, placed.task, placed.agent, placed.limits, placed.key, placed.created_at)
    assert same == (given.run_id, given.task, given.agent, given.limits, given.key, given.created_at)


def test_the_manifest_names_its_workspace(space: Workspace, home: Home, repo: Path) -> None:
    placed = prepared(space, home, repo)
    assert workspace_of(placed).isolation is space.isolation
    assert type(workspace(space.isolation)) is type(space)


def test_a_run_prepared_again_gets_its_place_back_with_its_work(
    space: Workspace, home: Home, repo: Path
) -> None:
    given = manifest_in(repo / "sub")
    first = space.prepare(home, given, "k1", None)
    do_work(Path(first.cwd))
    again = space.prepare(home, given, "k1", None)
    assert again.cwd == first.cwd and again.worktree == first.worktree
    assert (Path(again.cwd) / "new.txt").read_text() == "new work\n"


def test_nothing_the_child_writes_is_lost(space: Workspace, home: Home, repo: Path, tmp_path: Path) -> None:
    placed = prepared(space, home, repo)
    do_work(Path(placed.cwd))
    written = files_of(Path(placed.cwd))
    saved = space.capture(placed, tmp_path / "run" / "worktree.patch")
    assert saved_files(saved, placed, repo) == written
    assert {"new.txt": b"new work\n", "c.txt": b"c changed\n"}.items() <= written.items()


def test_capture_leaves_the_childs_files_as_they_are(
    space: Workspace, home: Home, repo: Path, tmp_path: Path
) -> None:
    placed = prepared(space, home, repo)
    do_work(Path(placed.cwd))
    top = Path(placed.cwd).parent
    before = files_of(top)
    space.capture(placed, tmp_path / "run" / "worktree.patch")
    assert files_of(top) == before


def test_capturing_again_captures_the_state_of_now(
    space: Workspace, home: Home, repo: Path, tmp_path: Path
) -> None:
    placed = prepared(space, home, repo)
    patch = tmp_path / "run" / "worktree.patch"
    (Path(placed.cwd) / "new.txt").write_text("first\n")
    space.capture(placed, patch)
    (Path(placed.cwd) / "new.txt").write_text("second\n")
    saved = space.capture(placed, patch)
    assert saved_files(saved, placed, repo)["new.txt"] == b"second\n"


def test_only_a_child_in_place_changes_its_source(space: Workspace, home: Home, repo: Path) -> None:
    placed = prepared(space, home, repo)
    do_work(Path(placed.cwd))
    changed = git(repo, "status", "--porcelain=v1") != ""
    assert changed is (space.isolation is Isolation.NONE)


# --- what differs: isolation is never dropped silently --------------------------------------


def test_a_worktree_refuses_a_dirty_source_naming_it_and_in_place_does_not(home: Home, repo: Path) -> None:
    (repo / "sub" / "c.txt").write_text("uncommitted\n")
    InPlace().check(repo / "sub", "k1", None)
    with pytest.raises(InvalidInput, match=r"c\.txt"):
        GitWorktree().check(repo / "sub", "k1", None)
    with pytest.raises(InvalidInput, match=r"c\.txt"):
        GitWorktree().prepare(home, manifest_in(repo / "sub"), "k1", None)
    assert not home.worktrees.exists() or not any(home.worktrees.rglob("*.json"))


def test_a_worktree_needs_a_repository_and_in_place_does_not(home: Home, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    InPlace().check(plain, "k1", None)
    assert InPlace().prepare(home, manifest_in(plain), "k1", None).cwd == str(plain)
    with pytest.raises(InvalidInput):
        GitWorktree().check(plain, "k1", None)


def test_a_worktree_starts_at_its_base_ref(home: Home, repo: Path) -> None:
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "README").write_text("later\n")
    git(repo, "commit", "-q", "-am", "later")
    placed = GitWorktree().prepare(home, manifest_in(repo / "sub"), "k1", base)
    assert placed.worktree is not None and placed.worktree.base_commit == base
    assert (Path(placed.cwd).parent / "README").read_text() == "readme\n"


def test_a_failed_worktree_capture_keeps_the_work(home: Home, repo: Path, tmp_path: Path) -> None:
    placed = prepared(GitWorktree(), home, repo)
    assert placed.worktree is not None
    (Path(placed.cwd) / "new.txt").write_text("work\n")
    patch = tmp_path / "worktree.patch"
    patch.mkdir()  # a directory where the patch would go: nothing can be saved
    with pytest.raises(PisubError):
        GitWorktree().capture(placed, patch)
    assert load_record(Path(placed.worktree.record)).state is WorktreeState.ALLOCATED
    assert (Path(placed.cwd) / "new.txt").read_text() == "work\n"
