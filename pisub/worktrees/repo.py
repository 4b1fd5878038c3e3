"""Questions about a repository: where its top is, whether it is clean, what a base ref names,
and what tree a worktree holds right now (computed without touching its index)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from pisub.core.fsio import read_bytes
from pisub.errors import InvalidInput
from pisub.termsafe import printable
from pisub.worktrees.git import WorktreeError, git_out, run_git

PISUB_DIR = ".pisub"
"""pisub's own directory in a project: its files never make a repository dirty."""

MAX_LISTED_DIRTY = 20
"""Dirty paths named in a preflight error."""

MAX_REF_CHARS = 1024
_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_BAD_REF_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def _show(path: Path | str) -> str:
    return printable(os.fspath(path), one_line=True)


def repo_root(source: Path) -> Path:
    """The top level of the git work tree containing ``source`` (a directory or a file in one).

    Raises:
        InvalidInput: ``source`` does not exist or is not inside a git work tree (a bare
            repository, a ``.git`` directory, or no repository at all).
        WorktreeError: git cannot be run.
    """
    path = Path(os.path.abspath(source))
    if not path.exists():
        raise InvalidInput(f"{_show(path)} does not exist; give a directory inside a git repository")
    start = path if path.is_dir() else path.parent
    result = run_git(start, ["rev-parse", "--show-toplevel"], what="find the repository", check=False)
    top = result.stdout.removesuffix(b"\n")
    if not result.ok or not top:
        raise InvalidInput(
            f"{_show(path)} is not inside a git work tree ({result.message()}); "
            "isolation needs a git repository with a checkout"
        )
    return Path(os.fsdecode(top))


def _status_paths(output: bytes, codes: tuple[bytes, ...] | None) -> list[str]:
    """Paths of ``git status --porcelain=v1 -z --no-renames`` entries (whose ``XY`` code is in
    ``codes``, or all), decoded as file names (undecodable bytes kept as surrogates)."""
    paths = []
    for entry in output.split(b"\0"):
        if len(entry) < 4:
            continue
        if codes is None or entry[:2] in codes:
            paths.append(os.fsdecode(entry[3:]))
    return paths


def _is_pisub_path(path: str) -> bool:
    return f"/{PISUB_DIR}/" in f"/{path}"


def dirty_paths(repo: Path) -> list[str]:
    """Paths of ``repo``'s work tree that are modified, staged, deleted or untracked (ignored
    files and anything under a ``.pisub/`` directory do not count), relative to its top.

    Raises:
        WorktreeError: git cannot read the repository's status.
    """
    args = ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored=no", "--no-renames"]
    result = run_git(repo, args, what="read the repository's status")
    return [path for path in _status_paths(result.stdout, None) if not _is_pisub_path(path)]


def preflight(source: Path) -> Path:
    """The top of the repository containing ``source``, once it is known to be clean.

    Raises:
        InvalidInput: not a repository, or it has uncommitted changes (up to
            :data:`MAX_LISTED_DIRTY` of them named).
    """
    top = repo_root(source)
    dirty = dirty_paths(top)
    if dirty:
        shown = ", ".join(_show(path) for path in dirty[:MAX_LISTED_DIRTY])
        more = f" and {len(dirty) - MAX_LISTED_DIRTY} more" if len(dirty) > MAX_LISTED_DIRTY else ""
        raise InvalidInput(
            f"the repository {_show(top)} has uncommitted changes: {shown}{more} "
            "(commit or stash them; isolation is never dropped)"
        )
    return top


def check_ref_text(ref: str, what: str = "base ref") -> None:
    """Refuse a ref that could be taken for an option or smuggle a control character.

    Raises:
        InvalidInput: empty, beginning with ``-``, too long, or holding a control character.
    """
    if not ref.strip() or ref.startswith("-") or len(ref) > MAX_REF_CHARS or _BAD_REF_CHARS.search(ref):
        raise InvalidInput(
            f"the {what} {ref[:100]!r} is not a usable git ref; give a branch, tag or commit id"
        )


def resolve_base(repo: Path, base_ref: str | None) -> str:
    """The full commit id ``base_ref`` names in ``repo`` now (``HEAD`` when None): a branch, a
    tag (peeled), a remote-tracking ref or a full or unambiguous short commit id.

    Raises:
        InvalidInput: the ref is malformed or does not name a commit (a blob, a tree, nothing).
    """
    ref = "HEAD" if base_ref is None else base_ref
    check_ref_text(ref)
    args = ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"]
    result = run_git(repo, args, what="resolve the base ref", check=False)
    commit = result.stdout.decode("ascii", "replace").strip()
    if not result.ok or not _OBJECT_ID.fullmatch(commit):
        raise InvalidInput(
            f"the base ref {ref[:100]!r} does not name a commit in {_show(repo)}; "
            "give a branch, tag, remote branch or commit id"
        )
    return commit


def check_branch_name(repo: Path, branch: str) -> None:
    """Refuse a branch name git would refuse (``..``, ``.lock``, ...).

    Raises:
        InvalidInput: naming the branch.
    """
    check_ref_text(branch, "branch name")
    result = run_git(
        repo, ["check-ref-format", f"refs/heads/{branch}"], what="check a branch name", check=False
    )
    if not result.ok:
        raise InvalidInput(f"{branch!r} is not a valid git branch name; use another key")


def tree_of(repo: Path, commit: str) -> str | None:
    """The tree id of ``commit`` in ``repo``; None when the commit is not there."""
    args = ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{commit}^{{tree}}"]
    result = run_git(repo, args, what="read a commit's tree", check=False)
    tree = result.stdout.decode("ascii", "replace").strip()
    return tree if result.ok and _OBJECT_ID.fullmatch(tree) else None


def ref_exists(repo: Path, ref: str) -> bool:
    """Whether the full ref name ``ref`` exists in ``repo``."""
    args = ["rev-parse", "--verify", "--quiet", "--end-of-options", ref]
    return run_git(repo, args, what="look up a ref", check=False).ok


def is_worktree_top(path: Path) -> bool:
    """Whether ``path`` is the top of a git work tree (not just a directory inside some other
    repository)."""
    if path.is_symlink() or not path.is_dir():
        return False
    result = run_git(path, ["rev-parse", "--show-toplevel"], what="inspect the worktree", check=False)
    top = os.fsdecode(result.stdout.removesuffix(b"\n"))
    return result.ok and os.path.realpath(top) == os.path.realpath(path)


def _index_copy(worktree: Path, into: Path) -> bool:
    """Copy the worktree's index file to ``into``; whether there was one to copy."""
    raw = git_out(worktree, ["rev-parse", "--git-path", "index"], what="find the worktree's index")
    index = worktree / os.fsdecode(raw)
    try:
        data = read_bytes(index)
    except OSError:
        return False
    into.write_bytes(data)
    return True


def snapshot_tree(worktree: Path) -> str:
    """The tree ``git add -A`` would stage in ``worktree`` now, computed in a temporary copy
    of its index (``GIT_INDEX_FILE``): the worktree's own index is never changed. Ignored
    files do not count; tracked files count even when they match an ignore pattern.

    Raises:
        WorktreeError: git failed (the worktree is broken, locked, or not a worktree).
    """
    with tempfile.TemporaryDirectory(prefix="pisub-index-") as tmp:
        index = Path(tmp) / "index"
        env = {"GIT_INDEX_FILE": os.fspath(index)}
        what = "snapshot the worktree"
        if not _index_copy(worktree, index):
            run_git(worktree, ["read-tree", "HEAD"], what=what, env=env)
        try:
            run_git(worktree, ["add", "-A"], what=what, env=env)
        except WorktreeError:  # e.g. a split index that does not copy: start from HEAD
            index.unlink(missing_ok=True)
            run_git(worktree, ["read-tree", "HEAD"], what=what, env=env)
            run_git(worktree, ["add", "-A"], what=what, env=env)
        return git_out(worktree, ["write-tree"], what=what, env=env).decode("ascii", "replace")


def check_source(cwd: Path, base_ref: str | None, key: str | None = None) -> Path:
    """Everything a worktree child needs of its source, checked before anything starts: a
    clean repository, a base ref naming a commit, the cwd present in that commit (not an
    ignored or untracked directory), and a branch name git accepts for ``key``.

    Returns:
        The repository's top level.

    Raises:
        InvalidInput: naming what is wrong.
    """
    top = preflight(cwd)
    commit = resolve_base(top, base_ref)
    inside = os.path.relpath(os.path.realpath(cwd), os.path.realpath(top))
    if inside != ".":
        spec = f"{commit}:{inside}"
        kind = run_git(top, ["cat-file", "-t", spec], what="look up the cwd in the base", check=False)
        if not kind.ok or kind.stdout.strip() != b"tree":
            raise InvalidInput(
                f"the cwd {_show(cwd)} is not a directory of the base commit {commit[:12]} "
                "(an ignored or untracked directory is not in a worktree); run from a tracked one"
            )
    if key is not None:
        from pisub.worktrees.records import expected_branch

        check_branch_name(top, expected_branch("0" * 8, key))
    return top
