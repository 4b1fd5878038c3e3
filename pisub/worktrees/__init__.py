"""Worktree isolation, the git half: a child run works in its own ``git worktree`` on its own
branch, and at its end its work is captured as an exact patch (and a commit under
``refs/pisub/``) so that nothing it wrote is ever lost.

Modules, one job each: :mod:`~pisub.worktrees.git` runs git (hardened, timed, errors
translated), :mod:`~pisub.worktrees.repo` asks a repository questions,
:mod:`~pisub.worktrees.records` stores ownership records, :mod:`~pisub.worktrees.patches`
makes, proves and applies patches, :mod:`~pisub.worktrees.isolation` is the life of one
worktree and :mod:`~pisub.worktrees.cleanup` judges and removes finished ones.
"""

from pisub.errors import WorktreeError
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
from pisub.worktrees.isolation import allocate, apply, branch_name, capture, capture_ref, discard
from pisub.worktrees.records import list_records, load_record, record_path, save_record
from pisub.worktrees.repo import check_source, dirty_paths, preflight, repo_root, resolve_base

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
