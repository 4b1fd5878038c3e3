"""Cleaning up isolated worktrees: a plan that judges every entry of the root without changing
anything, and a removal that re-checks each entry right before removing it and removes only
those whose work is safe (applied or discarded, nothing changed since the capture).

A removed worktree's record is stamped ``removedAt`` and moved to ``<root>/.removed/`` (kept
as history; listing and planning no longer see it). Patch files are never deleted.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from msgspec.structs import replace

from pisub.core.fsio import private_mkdir
from pisub.errors import PisubError, storage_error
from pisub.protocol.codec import now_iso
from pisub.protocol.worktree import Decision, PlanEntry, Reason, Removal, WorktreeRecord, WorktreeState
from pisub.store.paths import is_run_id
from pisub.termsafe import printable
from pisub.worktrees.git import WorktreeError, run_git
from pisub.worktrees.isolation import capture_ref, delete_ref, patch_mismatch, remove_worktree, root_lock
from pisub.worktrees.records import (
    RECORD_SUFFIX,
    REMOVED_DIR,
    entry_names,
    is_plain_dir,
    list_records,
    ownership_problem,
    private_problem,
    read_entry,
    record_path,
    save_record,
)
from pisub.worktrees.repo import is_worktree_top, snapshot_tree, tree_of

Active = Callable[[str], bool]
"""Whether the run with this id is still live (the caller knows)."""


def _show(path: Path | str) -> str:
    return printable(os.fspath(path), one_line=True)


def _unknown(
    name: str, detail: str, *, record: Path | None = None, worktree: Path | None = None
) -> PlanEntry:
    return PlanEntry(
        name=printable(name, one_line=True),
        record=_show(record) if record is not None else None,
        worktree=_show(worktree) if worktree is not None else None,
        decision=Decision.UNKNOWN,
        reason=Reason.UNKNOWN,
        detail=detail,
    )


def uncaptured_change(record: WorktreeRecord) -> str | None:
    """What the worktree holds beyond its capture (its base when never captured), or None when
    nothing: compared as trees, staged in a temporary index (the worktree's own index is not
    touched). Ignored files do not count. A worktree that cannot be inspected counts as changed.
    """
    path = Path(record.path)
    if not os.path.lexists(path):
        return None
    if not is_worktree_top(path):
        return "the worktree directory is not a git worktree"
    repo = Path(record.repo)
    expected = tree_of(repo, record.capture_commit or record.base_commit)
    if expected is None:
        return "its captured commit is missing from the repository"
    try:
        actual = snapshot_tree(path)
    except WorktreeError as exc:
        return f"cannot inspect it: {exc.message}"
    if actual != expected:
        return "changed since its last capture" if record.capture_commit else "changed and never captured"
    return None


def leftover_work(record: WorktreeRecord) -> str | None:
    """What the worktree holds that no patch can carry (None when nothing): ignored files the
    child wrote, a nested repository, files inside a submodule's directory. A worktree that
    cannot be inspected counts as holding some."""
    path = Path(record.path)
    if not os.path.lexists(path):
        return None
    status = ["status", "--porcelain=v1", "-z", "--ignored=matching", "--untracked-files=all"]
    try:
        out = run_git(path, status, what="list the worktree's ignored files").stdout
        staged = run_git(path, ["ls-files", "-s", "-z"], what="list the worktree's index").stdout
    except WorktreeError as exc:
        return f"cannot inspect it: {exc.message}"
    ignored = [e[3:] for e in out.split(b"\0") if e.startswith(b"!! ")]
    if ignored:
        first = printable(os.fsdecode(ignored[0]), one_line=True)
        return f"{len(ignored)} ignored path(s) not in any patch ({first}...)"
    for entry in staged.split(b"\0"):
        if entry.startswith(b"160000 "):
            inner = os.fsdecode(entry.split(b"\t", 1)[1])
            try:
                holds = bool(os.listdir(path / inner))
            except OSError:
                holds = False
            if holds:
                show = printable(inner, one_line=True)
                return f"a nested repository or submodule at {show}: its files are not in any patch"
    return None


def judge(
    root: Path, rec_path: Path, record: WorktreeRecord, active: Active, settled: Active | None = None
) -> PlanEntry:
    """The cleanup decision for one valid record (see :class:`Reason` for the order).
    ``settled(run_id)``: its captured work is accounted for elsewhere (a lane's recorded merge
    or supersession), so a clean ``captured`` worktree is ``safe`` too (its ``refs/pisub/``
    commit stays)."""
    name = rec_path.name.removesuffix(RECORD_SUFFIX)
    problem = ownership_problem(root, rec_path, record)
    if problem is not None:
        return _unknown(name, problem, record=rec_path)
    entry = PlanEntry(
        name=printable(name, one_line=True),
        run_id=record.run_id,
        record=_show(rec_path),
        worktree=_show(record.path),
        decision=Decision.KEEP,
        reason=Reason.SAFE,
        detail=f"state {record.state.value}",
    )
    if active(record.run_id):
        return replace(entry, reason=Reason.ACTIVE, detail="its run is live")
    if record.state is WorktreeState.ALLOCATED:
        return replace(entry, reason=Reason.UNCAPTURED, detail="allocated and never captured")
    change = uncaptured_change(record) or leftover_work(record)
    if change is not None:
        return replace(entry, reason=Reason.DIRTY, detail=change)
    if record.state is WorktreeState.CAPTURED:
        if settled is not None and settled(record.run_id):
            mismatch = patch_mismatch(record)
            if mismatch is not None:  # the evidence attests a patch that is not there
                return replace(entry, reason=Reason.UNAPPLIED, detail=f"captured, but {mismatch}")
            why = "captured; its lane's evidence is recorded"
            return replace(entry, decision=Decision.REMOVE, detail=why)
        return replace(entry, reason=Reason.UNAPPLIED, detail="captured, neither applied nor discarded")
    return replace(entry, decision=Decision.REMOVE)


def cleanup_plan(root: Path, active: Active, settled: Active | None = None) -> list[PlanEntry]:
    """One entry per record of ``root`` and per other entry without a record (``unknown``):
    ``remove`` only when ``safe``. Changes nothing; never follows a symlink or blocks on a FIFO.

    Raises:
        StorageError: ``root`` cannot be listed.
    """
    entries: list[PlanEntry] = []
    accounted: set[str] = set()
    problem = private_problem(root, "worktree root")
    if problem is not None:  # someone else could have written anything here: nothing is judged
        return [_unknown(name, problem, worktree=root / name) for name in entry_names(root)]
    for rec_path, found in list_records(root):
        name = rec_path.name.removesuffix(RECORD_SUFFIX)
        accounted.add(name)
        if isinstance(found, str):
            entries.append(_unknown(name, found, record=rec_path))
        else:
            entries.append(judge(root, rec_path, found, active, settled))
    for name in entry_names(root):
        if name.endswith(RECORD_SUFFIX) or name in accounted:
            continue
        kind = "directory" if is_plain_dir(root / name) else "file or link"
        entries.append(_unknown(name, f"a {kind} without a record", worktree=root / name))
    return entries


def _recheck(
    root: Path, run_id: str, active: Active, settled: Active | None
) -> tuple[PlanEntry, WorktreeRecord | None]:
    rec_path = record_path(root, run_id)
    found = read_entry(rec_path)
    if isinstance(found, str):
        return _unknown(run_id, found, record=rec_path), None
    return judge(root, rec_path, found, active, settled), found


def remove_safe(
    root: Path, entries: list[PlanEntry], active: Active | None = None, settled: Active | None = None
) -> list[Removal]:
    """Remove the worktrees of the ``remove`` entries of a plan, each re-judged right before
    (with ``active`` when given): a worktree that changed, became live or lost its record since
    the plan is kept. Removing = ``git worktree remove --force``, ``git worktree prune``, delete
    its branch, delete ``refs/pisub/<run_id>`` when the work was applied to its own repository,
    then move the record (stamped ``removedAt``) to ``<root>/.removed/``. One
    :class:`Removal` per ``remove`` entry; a failure is reported in it, not raised.

    Raises:
        InvalidInput: there is something to remove and ``root`` is not a directory.
        LockBusy: another state change under ``root`` held the lock too long.
    """
    is_active = active if active is not None else (lambda _run_id: False)
    run_ids = [e.run_id for e in entries if e.decision is Decision.REMOVE and e.run_id is not None]
    done: list[Removal] = []
    if not run_ids:
        return done
    with root_lock(root):
        for run_id in run_ids:
            if not is_run_id(run_id):
                done.append(Removal(entry=_unknown(run_id, "not a run id"), removed=False))
                continue
            fresh, record = _recheck(root, run_id, is_active, settled)
            if fresh.decision is not Decision.REMOVE or record is None:
                done.append(Removal(entry=fresh, removed=False))
                continue
            try:
                _remove(root, record)
            except PisubError as exc:
                done.append(Removal(entry=fresh, removed=False, error=exc.message))
                continue
            done.append(Removal(entry=fresh, removed=True))
    return done


def _remove(root: Path, record: WorktreeRecord) -> None:
    remove_worktree(record)
    delete_ref(record, f"refs/heads/{record.branch}")
    if record.state is WorktreeState.APPLIED and record.applied_into == record.repo:
        delete_ref(record, capture_ref(record.run_id))
    removed_dir = root / REMOVED_DIR
    now = now_iso()
    try:
        private_mkdir(removed_dir)
    except OSError as exc:
        raise storage_error(exc, "create", removed_dir) from exc
    save_record(record_path(removed_dir, record.run_id), replace(record, removed_at=now, updated_at=now))
    source = record_path(root, record.run_id)
    try:
        os.unlink(source)
    except OSError as exc:
        raise storage_error(exc, "remove the worktree record", source) from exc
