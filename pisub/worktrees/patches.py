"""Patches of isolated worktrees: made exact and binary-safe, proved to reproduce the work
before anything is saved, and applied all-or-nothing with every conflict named."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from pisub.errors import WorktreeError
from pisub.protocol.worktree import ApplyMode, Conflict
from pisub.termsafe import printable
from pisub.worktrees.git import DIFF_FLAGS, git_out, run_git
from pisub.worktrees.repo import tree_of

_PATCH_FAILED = re.compile(r"error: patch failed: (?P<path>.+):(?P<line>\d+)")
_QUOTED = re.compile(r"error: (?P<before>[^']*)'(?P<path>[^']+)'(?P<after>.*)")
_PATH_REASON = re.compile(
    r"error: (?P<path>.+): (?P<reason>does not exist in index|already exists in index"
    r"|already exists in working directory|does not match index|wrong type|patch does not apply"
    r"|does not exist|[A-Z][A-Za-z ]+)"
)


def staged_patch(worktree: Path, base: str) -> bytes:
    """``git diff --cached <base>`` of ``worktree`` with :data:`DIFF_FLAGS`: raw bytes, never
    decoded (b"" when nothing changed).

    Raises:
        WorktreeError: git failed.
    """
    args = ["diff", "--cached", *DIFF_FLAGS, "--end-of-options", base, "--"]
    return run_git(worktree, args, what="diff the worktree against its base").stdout


def changed_files(worktree: Path, base: str) -> list[str]:
    """Paths (printable) the staged change of ``worktree`` touches, relative to its top."""
    args = [
        "diff",
        "--cached",
        "--name-only",
        "-z",
        "--no-renames",
        "--no-relative",
        "--no-ext-diff",
        "--ignore-submodules=none",
        "--end-of-options",
        base,
        "--",
    ]
    out = run_git(worktree, args, what="list the changed files").stdout
    return [printable(os.fsdecode(name)) for name in out.split(b"\0") if name]


def submodule_work(worktree: Path, base: str) -> str | None:
    """Work in ``worktree`` that lives in a submodule, which no patch of the superproject can
    carry (None when there is none): a submodule moved to another commit (that commit is only
    in the worktree's own clone of it), or files in a submodule's directory.

    Raises:
        WorktreeError: git failed.
    """
    raw = ["diff", "--cached", "--raw", "-z", "--no-renames", "--no-abbrev", "--end-of-options", base, "--"]
    out = run_git(worktree, raw, what="list the changed submodules", fix="").stdout.split(b"\0")
    for meta, name in zip(out[0::2], out[1::2], strict=False):
        modes = meta.split(b" ")[:2]
        if any(mode.endswith(b"160000") for mode in modes):
            return f"the submodule {printable(os.fsdecode(name), one_line=True)} moved to another commit"
    staged = run_git(worktree, ["ls-files", "-s", "-z"], what="list the worktree's index").stdout
    for entry in staged.split(b"\0"):
        if entry.startswith(b"160000 "):
            inner = os.fsdecode(entry.split(b"\t", 1)[1])
            try:
                holds = bool(os.listdir(worktree / inner))
            except OSError:
                holds = False
            if holds:
                return f"a nested repository or submodule at {printable(inner, one_line=True)} holds files"
    return None


def ignored_present(worktree: Path) -> list[str]:
    """Ignored paths present in ``worktree`` (printable; a wholly ignored directory once)."""
    args = ["status", "--porcelain=v1", "-z", "--ignored=matching", "--untracked-files=all", "--no-renames"]
    out = run_git(worktree, args, what="list the ignored files").stdout
    return [printable(os.fsdecode(entry[3:])) for entry in out.split(b"\0") if entry.startswith(b"!! ")]


def verify_reproduces(worktree: Path, base: str, patch: bytes, tree: str) -> None:
    """Prove that ``patch`` applied to ``base`` gives exactly ``tree`` (same tree id: contents,
    modes, symlinks, binaries), in a temporary index; nothing of the worktree is touched.

    Raises:
        WorktreeError: it does not (nothing must be saved then).
    """
    if not patch:
        got = tree_of(worktree, base)
    else:
        with tempfile.TemporaryDirectory(prefix="pisub-verify-") as tmp:
            env = {"GIT_INDEX_FILE": os.fspath(Path(tmp) / "index")}
            what = "verify the captured patch"
            run_git(worktree, ["read-tree", "--end-of-options", base], what=what, env=env)
            apply = ["apply", "--cached", "--whitespace=nowarn", "-"]
            run_git(worktree, apply, what=what, env=env, stdin=patch)
            got = git_out(worktree, ["write-tree"], what=what, env=env).decode("ascii", "replace")
    if got != tree:
        raise WorktreeError(
            f"the patch of {printable(os.fspath(worktree), one_line=True)} does not reproduce its work "
            f"(tree {got} instead of {tree}); nothing was saved and the worktree is kept: report this bug"
        )


def choose_mode(target: Path) -> ApplyMode:
    """:attr:`ApplyMode.INDEX` when ``target`` has nothing staged, else
    :attr:`ApplyMode.WORKTREE` (its staged changes are not mixed with the patch).

    Raises:
        WorktreeError: git cannot compare the index with HEAD.
    """
    args = ["diff", "--cached", "--quiet", "--no-ext-diff", "--ignore-submodules=none"]
    result = run_git(target, args, what="read the target's index", check=False)
    if result.returncode not in (0, 1):
        raise WorktreeError(
            f"cannot read the index of {printable(os.fspath(target), one_line=True)}: {result.message()}; "
            "check the repository with git status"
        )
    return ApplyMode.INDEX if result.returncode == 0 else ApplyMode.WORKTREE


def parse_conflicts(stderr: bytes) -> list[Conflict]:
    """The files ``git apply`` refused, one :class:`Conflict` per path (its first reason)."""
    found: dict[str, str] = {}
    for raw in stderr.decode("utf-8", "surrogateescape").splitlines():
        parsed = _parse_line(raw.strip())
        if parsed is not None and parsed[0] not in found:
            found[parsed[0]] = parsed[1]
    return [
        Conflict(path=printable(path, one_line=True), reason=printable(reason, one_line=True))
        for path, reason in found.items()
    ]


def _parse_line(line: str) -> tuple[str, str] | None:
    if match := _PATCH_FAILED.fullmatch(line):
        return match["path"], f"the patch does not apply at line {match['line']} (the file differs)"
    if match := _QUOTED.fullmatch(line):
        return match["path"], line.removeprefix("error: ")
    if match := _PATH_REASON.fullmatch(line):
        return match["path"], match["reason"]
    return None


def _apply_args(mode: ApplyMode, *, check: bool) -> list[str]:
    args = ["apply", "--whitespace=nowarn"]
    if mode is ApplyMode.INDEX:
        args.append("--index")
    if check:
        args.append("--check")
    return [*args, "-"]


def apply_patch(target: Path, patch: bytes, mode: ApplyMode, *, check: bool) -> list[Conflict]:
    """Apply ``patch`` to ``target`` (only check it with ``check``); the files that do not
    apply, or [] when it applied. ``git apply`` is all-or-nothing: on conflicts nothing changed.

    Raises:
        WorktreeError: git failed for another reason than conflicting files (a corrupt patch).
    """
    what = "check the patch" if check else "apply the patch"
    result = run_git(target, _apply_args(mode, check=check), what=what, stdin=patch, check=False)
    if result.ok:
        return []
    conflicts = parse_conflicts(result.stderr)
    if not conflicts:
        raise WorktreeError(
            f"cannot {what} in {printable(os.fspath(target), one_line=True)}: {result.message()}; "
            "nothing was changed"
        )
    return conflicts
