"""Worktree isolation: the ownership record of a child's git worktree
(``<root>/<run_id>.json``) and what applying or cleaning up worktrees reports."""

from __future__ import annotations

import enum
from typing import Literal

import msgspec

from pisub.protocol.codec import Record

MAX_LISTED_PATHS = 1000
"""Paths kept in one list of a record (changed files, changed ignored files); the rest are
counted in the list's ``...Omitted`` field, so a record stays small."""


class WorktreeState(enum.StrEnum):
    """Lifecycle of an isolated worktree: ``allocated`` → ``captured`` (again and again) →
    ``applied`` or ``discarded``."""

    ALLOCATED = "allocated"
    """The record and then the worktree were created; nothing captured yet."""
    CAPTURED = "captured"
    """The work is saved as a patch file and as the commit ``refs/pisub/<run_id>``."""
    APPLIED = "applied"
    """The captured patch was applied to a checkout."""
    DISCARDED = "discarded"
    """The worktree, its branch and its ref were deleted on request."""


class PatchInfo(Record, kw_only=True):
    """The captured patch: a binary-safe ``git diff --cached <baseCommit>`` of the worktree."""

    path: str
    """Absolute path of the patch file (0600)."""
    sha256: str
    size: int = msgspec.field(name="bytes")
    files: list[str] = []
    """Paths the patch changes (printable: undecodable bytes and control characters escaped)."""
    files_omitted: int = 0
    ignored_changed: list[str] = []
    """Ignored paths present in the worktree when captured: not in the patch (build output,
    caches, or a secret the child wrote); listed so that nobody is surprised."""
    ignored_omitted: int = 0


class WorktreeRecord(Record, kw_only=True):
    """``<root>/<run_id>.json``: who owns the worktree ``<root>/<run_id>``. Written (0600,
    atomically) before the worktree is created and after every change of state."""

    v: Literal[1] = 1
    run_id: str
    key: str
    repo: str
    """Absolute top level of the repository the worktree belongs to."""
    path: str
    """Absolute path of the worktree directory."""
    branch: str
    """``pisub/<run_id[:8]>/<key>``."""
    base_ref: str | None
    """The base as the caller gave it (None: ``HEAD``)."""
    base_commit: str
    """The full commit id the base resolved to at allocation."""
    state: WorktreeState
    patch: PatchInfo | None = None
    ref: str | None = None
    """``refs/pisub/<run_id>`` once captured: a commit of the captured tree on ``baseCommit``."""
    capture_commit: str | None = None
    """The commit ``ref`` pointed at when captured."""
    applied_into: str | None = None
    """The checkout the patch was applied to."""
    created_at: str
    captured_at: str | None = None
    applied_at: str | None = None
    discarded_at: str | None = None
    removed_at: str | None = None
    """When cleanup removed the worktree (the record then lives in ``<root>/.removed/``)."""
    updated_at: str


class WorktreeLink(Record, kw_only=True):
    """``manifest.worktree``: where a run's worktree and its ownership record are."""

    record: str
    """Absolute path of the ownership record (``<root>/<run_id>.json``)."""
    path: str
    """Absolute path of the worktree."""
    repo: str
    base_commit: str
    branch: str


class ApplyMode(enum.StrEnum):
    """Where an applied patch goes."""

    INDEX = "index"
    """The work tree and the index (``git apply --index``): the target had nothing staged."""
    WORKTREE = "worktree"
    """The work tree only: the target had staged changes, which are left alone."""


class Conflict(Record, kw_only=True):
    """One file of a patch that does not apply, with git's reason."""

    path: str
    reason: str


class ApplyReport(Record, kw_only=True):
    """The outcome of applying a captured patch. When ``ok`` is false nothing was changed."""

    ok: bool
    run_id: str
    target: str
    mode: ApplyMode
    files: list[str] = []
    conflicts: list[Conflict] = []


class Decision(enum.StrEnum):
    """What cleanup does with a worktree."""

    REMOVE = "remove"
    KEEP = "keep"
    UNKNOWN = "unknown"
    """Not pisub's to judge (no valid record): never removed."""


class Reason(enum.StrEnum):
    """Why cleanup decided so."""

    SAFE = "safe"
    """Applied or discarded, and the worktree holds nothing beyond the capture."""
    DIRTY = "dirty"
    """The worktree has changes that neither the patch nor ``refs/pisub/<run_id>`` hold."""
    ACTIVE = "active"
    """Its run is still live."""
    UNAPPLIED = "unapplied"
    """Captured, but neither applied nor discarded."""
    UNCAPTURED = "uncaptured"
    """Allocated and never captured (e.g. its runner was killed mid-edit)."""
    UNKNOWN = "unknown"
    """No valid record: a stray directory or a broken, foreign or hostile entry."""


class PlanEntry(Record, kw_only=True):
    """One entry of the worktree root as cleanup sees it. Paths are printable (undecodable
    bytes escaped); only entries with a valid record carry a ``runId``."""

    name: str
    """The entry's name in the root (without ``.json``)."""
    run_id: str | None = None
    record: str | None = None
    worktree: str | None = None
    decision: Decision
    reason: Reason
    detail: str = ""


class Removal(Record, kw_only=True):
    """What :func:`remove_safe` did with one entry: ``entry`` is the re-check made right
    before removing."""

    entry: PlanEntry
    removed: bool
    error: str | None = None
