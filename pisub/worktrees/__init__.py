"""Worktree isolation, the git half: a child run works in its own ``git worktree`` on its own
branch, and at its end its work is captured as an exact patch (and a commit under
``refs/pisub/``) so that nothing it wrote is ever lost.

Modules, one job each: :mod:`~pisub.worktrees.git` runs git (hardened, timed, errors
translated), :mod:`~pisub.worktrees.repo` asks a repository questions,
:mod:`~pisub.worktrees.records` stores ownership records, :mod:`~pisub.worktrees.patches`
makes, proves and applies patches, :mod:`~pisub.worktrees.isolation` is the life of one
worktree, :mod:`~pisub.worktrees.cleanup` judges and removes finished ones, and
:mod:`~pisub.worktrees.workspace` is the seam where a child works (in place or in a worktree).

The names below are imported when first used: a run that works in place never loads git's
machinery (the runner imports just what it uses).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pisub.protocol.worktree import (
        ApplyMode,
        ApplyReport,
        Conflict,
        Decision,
        PatchInfo,
        PlanEntry,
        Reason,
        Removal,
        WorktreeRecord,
        WorktreeState,
    )
    from pisub.worktrees.cleanup import cleanup_plan, remove_safe
    from pisub.worktrees.git import WorktreeError
    from pisub.worktrees.isolation import allocate, apply, branch_name, capture, capture_ref, discard
    from pisub.worktrees.records import list_records, load_record, record_path, save_record
    from pisub.worktrees.repo import check_source, dirty_paths, preflight, repo_root, resolve_base

_HOMES = {
    "pisub.protocol.worktree": (
        "ApplyMode ApplyReport Conflict Decision PatchInfo PlanEntry Reason Removal WorktreeRecord "
        "WorktreeState"
    ),
    "pisub.worktrees.cleanup": "cleanup_plan remove_safe",
    "pisub.worktrees.git": "WorktreeError",
    "pisub.worktrees.isolation": "allocate apply branch_name capture capture_ref discard",
    "pisub.worktrees.records": "list_records load_record record_path save_record",
    "pisub.worktrees.repo": "check_source dirty_paths preflight repo_root resolve_base",
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names.split()}


def __getattr__(name: str) -> object:
    """A public name, imported from its module when first asked for."""
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ApplyMode",
    "ApplyReport",
    "Conflict",
    "Decision",
    "PatchInfo",
    "PlanEntry",
    "Reason",
    "Removal",
    "WorktreeError",
    "WorktreeRecord",
    "WorktreeState",
    "allocate",
    "apply",
    "branch_name",
    "capture",
    "capture_ref",
    "check_source",
    "cleanup_plan",
    "dirty_paths",
    "discard",
    "list_records",
    "load_record",
    "preflight",
    "record_path",
    "remove_safe",
    "repo_root",
    "resolve_base",
    "save_record",
]
