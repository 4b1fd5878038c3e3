"""What ``pisub worktree`` does, for the CLI and the Python API: list the isolated children's
worktrees, apply or discard one run's captured work, and plan or carry out a cleanup that
removes only worktrees whose work is safe elsewhere."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from pisub.errors import InvalidInput, PisubError, RunNotFound
from pisub.protocol.codec import Record
from pisub.protocol.worktree import ApplyReport, PlanEntry, Removal, WorktreeRecord
from pisub.store.paths import Home, is_run_id, open_home, open_home_to_read


class WorktreeRow(Record, kw_only=True):
    """One worktree as ``pisub worktree list`` shows it: its record and cleanup's view of it."""

    root: str
    plan: PlanEntry
    record: WorktreeRecord | None = None


def roots(home: Home) -> list[Path]:
    """Every worktree root (one per repository) under the home's worktree directory."""
    from pisub.worktrees.records import checked_base, is_plain_dir

    base = checked_base(home.worktrees, home.root)
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    except OSError as exc:
        from pisub.errors import storage_error

        raise storage_error(exc, "list", base) from exc
    return [base / name for name in names if is_plain_dir(base / name)]


def is_active(home: Home, run_id: str) -> bool:
    """Whether run ``run_id`` is still going (after crash repair); a run that is gone is not."""
    from pisub.runs.reconcile import observe

    if not is_run_id(run_id):
        return False
    try:
        return not observe(home.run(run_id)).state.is_terminal
    except RunNotFound:
        return False
    except PisubError:
        return True  # cannot tell: never removed


def list_worktrees(home: Path | None = None) -> list[WorktreeRow]:
    """Every isolated child's worktree, with what cleanup would do with it."""
    from pisub.worktrees import cleanup_plan, list_records

    h = open_home_to_read(home)  # (no home: no worktrees)
    rows = []
    for root in roots(h):
        records = {p.name.removesuffix(".json"): r for p, r in list_records(root) if not isinstance(r, str)}
        for entry in cleanup_plan(root, lambda rid: is_active(h, rid)):
            rows.append(WorktreeRow(root=str(root), plan=entry, record=records.get(entry.name)))
    return rows


def record_of(ref: str, home: Path | None = None) -> Path:
    """The ownership record of run ``ref``'s worktree.

    Raises:
        RunNotFound: no such run. InvalidInput: it has no worktree.
    """
    from pisub.api.client import Run

    run = Run(ref, home=home)
    link = run.manifest().worktree
    if link is None:
        raise InvalidInput(f"run {run.id} has no worktree (it was not started with isolation='worktree')")
    return Path(link.record)


def apply_worktree(ref: str, into: str | Path | None = None, home: Path | None = None) -> ApplyReport:
    """Apply run ``ref``'s captured patch onto the checkout ``into`` (default: the repository it
    came from) after fresh checks; on a conflict nothing is changed and each file is named.

    Raises:
        InvalidInput: not captured (the run still goes, or its capture failed), the patch was
            changed, ``into`` is not a git work tree.
    """
    from pisub.worktrees import apply

    record = record_of(ref, home)
    if is_active(open_home(home), _run_id(ref, home)):
        raise InvalidInput(f"run {ref} is still going: its work is captured when it ends")
    return apply(record, Path(into).absolute() if into is not None else None)


def discard_worktree(ref: str, *, force: bool, home: Path | None = None) -> None:
    """Delete run ``ref``'s worktree, branch and ``refs/pisub/`` ref (the patch file stays in
    the run). Only with ``force``: the work is gone from git.

    Raises:
        InvalidInput: without ``force``, or the run still goes.
    """
    from pisub.worktrees import discard

    if not force:
        raise InvalidInput("discarding deletes the worktree and its branch: give --force")
    record = record_of(ref, home)
    if is_active(open_home(home), _run_id(ref, home)):
        raise InvalidInput(f"run {ref} is still going: stop it first")
    discard(record)


def cleanup_worktrees(
    *,
    apply: bool,
    lane: str | None = None,
    repo: str | Path | None = None,
    home: Path | None = None,
) -> tuple[list[PlanEntry], list[Removal]]:
    """The cleanup plan of every worktree (``remove`` / ``keep`` / ``unknown`` with the reason);
    with ``apply``, each ``remove`` entry is checked again and only safe ones are removed.
    With ``lane`` (a workflow run whose merge or supersession is recorded and still holds,
    see ``pisub lane status``) that lane's captured, unchanged worktrees count as safe too;
    the lane's evidence is checked again before anything is removed, under the lane's lock
    (no evidence is recorded meanwhile), and each stored patch is hashed again.

    With ``repo`` (a directory in a git work tree), only the worktrees of that repository:
    those in its project's root whose record names it, and unreadable entries of that root.

    Raises:
        EvidenceMismatch: with ``lane``, a child's stored patch is not the one captured.
        InvalidInput: ``repo`` is not inside a git work tree.
    """
    from pisub.worktrees import cleanup_plan, remove_safe

    h = open_home_to_read(home)  # (no home: no worktrees)
    mine = _of_repo(repo)
    settled: set[str] = set()
    if lane is not None:
        from pisub.api.lane_evidence import settled_children

        settled = settled_children(lane, home)
    plan: list[PlanEntry] = []
    removed: list[Removal] = []
    for root in roots(h):
        entries = cleanup_plan(root, lambda rid: is_active(h, rid), settled.__contains__)
        entries = [e for e in entries if mine(root, e)]
        plan += entries
        if apply:
            with _lane_held(lane, home):
                again: set[str] = set()
                if lane is not None:
                    from pisub.api.lane_evidence import settled_children

                    again = settled_children(lane, home)  # the evidence right before removing
                removed += remove_safe(root, entries, lambda rid: is_active(h, rid), again.__contains__)
    return plan, removed


def _of_repo(repo: str | Path | None) -> Callable[[Path, PlanEntry], bool]:
    """Whether a cleanup entry of a root belongs to ``repo`` (every entry without one)."""
    if repo is None:
        return lambda _root, _entry: True
    from pisub.worktrees.records import list_records
    from pisub.worktrees.repo import repo_root

    top = os.path.realpath(repo_root(Path(repo)))

    def mine(root: Path, entry: PlanEntry) -> bool:
        if root.name != os.path.basename(top):
            return False
        records = {p.name.removesuffix(".json"): r for p, r in list_records(root) if not isinstance(r, str)}
        record = records.get(entry.name)
        return record is None or os.path.realpath(record.repo) == top

    return mine


def _lane_held(lane: str | None, home: Path | None) -> AbstractContextManager[None]:
    """The lane's evidence lock while its worktrees are removed (none without a lane)."""
    if lane is None:
        return nullcontext()
    from pisub.api.lane_evidence import holding

    return holding(lane, home)


def _run_id(ref: str, home: Path | None) -> str:
    from pisub.api.client import Run

    return Run(ref, home=home).id
