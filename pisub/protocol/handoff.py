"""``handoff.json`` of a lane (a workflow run whose children worked in worktrees): the evidence
people record about what became of its work — a merge, or a supersession by another lane —
with a digest of the facts it attests. Input from the CLI is strict; the file is
forward-compatible."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

import msgspec

from pisub.protocol.codec import Record

CommitId = Annotated[str, msgspec.Meta(pattern=r"^(?!0+$)(?:[0-9a-f]{40}|[0-9a-f]{64})$")]
"""A full commit id: 40 hex digits (SHA-1 repositories) or 64 (SHA-256); never abbreviated,
never the null id (all zeros), which names no commit."""
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class PostMergeChecks(enum.StrEnum):
    RECORDED = "recorded"
    """The checks after the merge ran and their results are recorded (where the team keeps them)."""
    SKIPPED = "skipped"
    FAILED = "failed"


class MergeEvidence(Record, kw_only=True):
    pr: Annotated[int, msgspec.Meta(ge=1, le=10**12)]
    reviewed_head: CommitId
    merge_commit: CommitId
    tree_equivalent: bool
    """The merged tree is the lane's captured work (as reviewed)."""
    post_merge_checks: PostMergeChecks
    attested_by: Name
    attested_at: str


class Supersession(Record, kw_only=True):
    by_lane: str
    """The workflow run whose work replaces this lane's."""
    attested_by: Name
    attested_at: str


class Handoff(Record, kw_only=True):
    v: Literal[1] = 1
    run_id: str
    digest: str
    """SHA-256 of the lane's facts when the evidence was recorded (every child's worktree:
    run id, key, patch hash, capture commit, whether it holds more)."""
    merge: MergeEvidence | None = None
    supersession: Supersession | None = None
    updated_at: str


class LaneState(enum.StrEnum):
    ACTIVE = "active"
    """The workflow or one of its children still runs."""
    TERMINAL_ELIGIBLE = "terminal-eligible"
    """A merge is recorded, tree-equivalent, checks recorded, and nothing changed since."""
    TERMINAL_BLOCKED = "terminal-blocked"
    """Finished, but its worktrees may not be cleaned up (the reason says why)."""
    SUPERSEDED_ELIGIBLE = "superseded-eligible"
    """Another lane's work replaces it, recorded, and nothing changed since."""
    UNKNOWN = "unknown"
    """Its files cannot be read or judged."""
    EVIDENCE_MISMATCH = "evidence-mismatch"
    """A child's stored patch, hashed again now, is not the one its record says was captured
    (replaced, truncated, gone): the evidence would attest bytes that are not there. Blocks
    cleanup and new evidence (``EVIDENCE_MISMATCH``) until the patch is restored."""


class LaneStatus(Record, kw_only=True):
    """What ``pisub lane status`` says."""

    run_id: str
    state: LaneState
    reason: str | None = None
    code: str | None = None
    """A stable code when the state needs one (``EVIDENCE_MISMATCH``)."""
    children: list[str] = []
    """The child runs with worktrees (their work is what the evidence is about)."""
    digest: str | None = None
    merge: MergeEvidence | None = None
    supersession: Supersession | None = None
    cleanup_command: str | None = None
    """The exact command that the evidence allows (never run by pisub)."""
