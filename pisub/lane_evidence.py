"""Lane evidence: what people record about a finished lane's work (a merge, or a supersession
by another lane), checked against the lane's facts whenever it is read. A lane is a workflow
run; its facts are its children's worktrees. Any change to them after the evidence was
recorded makes it stale; ``pisub lane status`` then blocks the cleanup it would have allowed.
pisub never runs that cleanup itself, and never asks a forge: the evidence is what people
attest."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pisub.errors import InvalidInput, PisubError
from pisub.paths import Home, open_home
from pisub.protocol.codec import encode_pretty, now_iso
from pisub.protocol.handoff import (
    Handoff,
    LaneState,
    LaneStatus,
    MergeEvidence,
    PostMergeChecks,
    Supersession,
)
from pisub.protocol.status import Status
from pisub.protocol.worktree import WorktreeRecord, WorktreeState

MAX_HANDOFF = 64 * 1024


@dataclass
class Fact:
    """One child's worktree as the evidence sees it."""

    run_id: str
    key: str | None
    record: WorktreeRecord | None
    problem: str | None = None
    change: str | None = None

    def as_json(self) -> list[object]:
        rec = self.record
        patch = rec.patch.sha256 if rec is not None and rec.patch is not None else None
        commit = rec.capture_commit if rec is not None else None
        return [self.run_id, self.key, patch, commit, self.change is not None]


def lane_status(ref: str, home: Path | None = None) -> LaneStatus:
    """What the lane's evidence allows now.

    Raises:
        RunNotFound: no such run. InvalidInput: it is not a workflow run.
    """
    h = open_home(home)
    workflow, children = _lane(h, ref)
    status = LaneStatus(run_id=workflow.run_id, state=LaneState.UNKNOWN)
    if not workflow.state.is_terminal or any(not c.state.is_terminal for c in children):
        status.state, status.reason = LaneState.ACTIVE, "the workflow or a child still runs"
        return status
    facts = [_fact(h, c) for c in children]
    status.children = [f.run_id for f in facts]
    status.digest = digest(facts)
    blocked = _facts_problem(facts)
    if blocked is not None:
        status.state, status.reason = blocked
        return status
    try:
        handoff = _load_handoff(h, workflow.run_id)
    except PisubError as exc:
        status.reason = exc.message
        return status
    if handoff is None:
        status.state = LaneState.TERMINAL_BLOCKED
        status.reason = "no merge or supersession recorded (pisub lane record-merge / record-supersession)"
        return status
    status.merge, status.supersession = handoff.merge, handoff.supersession
    if handoff.digest != status.digest:
        status.state = LaneState.TERMINAL_BLOCKED
        status.reason = "stale: the lane's patches or worktrees changed since the evidence was recorded"
        return status
    status.state, status.reason = _judge_evidence(h, handoff)
    if status.state in (LaneState.TERMINAL_ELIGIBLE, LaneState.SUPERSEDED_ELIGIBLE):
        status.cleanup_command = f"pisub worktree cleanup --apply --lane {workflow.run_id}"
    return status


def record_merge(
    ref: str,
    *,
    pr: int,
    reviewed_head: str,
    merge_commit: str,
    tree_equivalent: bool,
    post_merge_checks: str,
    by: str,
    home: Path | None = None,
) -> LaneStatus:
    """Record that the lane's work was merged (pull request ``pr``).

    Raises:
        InvalidInput: a bad field (named), or the lane is active or holds uncaptured work.
    """
    from pisub.protocol.codec import convert

    evidence = {
        "pr": pr,
        "reviewedHead": reviewed_head.lower(),
        "mergeCommit": merge_commit.lower(),
        "treeEquivalent": tree_equivalent,
        "postMergeChecks": post_merge_checks,
        "attestedBy": by,
        "attestedAt": now_iso(),
    }
    try:
        PostMergeChecks(post_merge_checks)
        merge = convert(evidence, MergeEvidence, "the merge evidence")
    except ValueError:
        raise InvalidInput("--post-merge-checks must be recorded, skipped or failed") from None
    except PisubError as exc:
        raise InvalidInput(exc.message) from None
    return _record(ref, home, merge=merge)


def record_supersession(ref: str, *, by_lane: str, by: str, home: Path | None = None) -> LaneStatus:
    """Record that lane ``by_lane``'s work replaces this lane's.

    Raises:
        InvalidInput: a bad name, the same lane, not a workflow, or this lane is active.
        RunNotFound: no such lane.
    """
    from pisub.client import Run

    other = Run(by_lane, home=home)
    if other.manifest().workflow is None:
        raise InvalidInput(f"run {other.id} is not a workflow run (a lane is one)")
    if not isinstance(by, str) or not 1 <= len(by) <= 128:
        raise InvalidInput("--by must be 1 to 128 characters")
    return _record(
        ref, home, supersession=Supersession(by_lane=other.id, attested_by=by, attested_at=now_iso())
    )


def settled_children(ref: str, home: Path | None = None) -> set[str]:
    """The child runs whose captured work the lane's evidence accounts for: all of them when
    the lane is eligible now, else none."""
    status = lane_status(ref, home)
    if status.state in (LaneState.TERMINAL_ELIGIBLE, LaneState.SUPERSEDED_ELIGIBLE):
        return set(status.children)
    return set()


def digest(facts: list[Fact]) -> str:
    data = json.dumps(sorted(f.as_json() for f in facts), separators=(",", ":"), default=str)
    return hashlib.sha256(data.encode()).hexdigest()


# == the lane's parts ==============================================================
def _lane(home: Home, ref: str) -> tuple[Status, list[Status]]:
    from pisub.client import Run, list_runs

    run = Run(ref, home=home.root)
    spec = run.manifest().workflow
    if spec is None:
        raise InvalidInput(f"run {run.id} is not a workflow run (a lane is one)")
    statuses = list(list_runs(home=home.root, children=True))
    # The runs that share its journal (it and its resumes) and their children.
    family = {
        s.run_id for s in statuses if s.runner == "workflow" and _journal(home, s.run_id) == spec.journal
    }
    family.add(run.id)
    children = [s for s in statuses if s.parent_run_id in family and _worktree_link(home, s.run_id)]
    return run.status(), children


def _journal(home: Home, run_id: str) -> str | None:
    from pisub.store import load_manifest

    try:
        workflow = load_manifest(home.run(run_id)).workflow
    except PisubError:
        return None
    return workflow.journal if workflow is not None else None


def _worktree_link(home: Home, run_id: str) -> str | None:
    from pisub.store import load_manifest

    try:
        link = load_manifest(home.run(run_id)).worktree
    except PisubError:
        return None
    return link.record if link is not None else None


def _fact(home: Home, child: Status) -> Fact:
    from pisub.worktrees import load_record
    from pisub.worktrees.cleanup import uncaptured_change

    where = Path(_worktree_link(home, child.run_id) or "")
    removed = where.parent / ".removed" / where.name
    for path in (where, removed):
        if not os.path.lexists(path):
            continue
        try:
            record = load_record(path)
        except (PisubError, OSError) as exc:
            return Fact(child.run_id, child.key, None, problem=str(exc))
        return Fact(child.run_id, child.key, record, change=uncaptured_change(record))
    return Fact(child.run_id, child.key, None, problem=f"its worktree record {where} is gone")


def _facts_problem(facts: list[Fact]) -> tuple[LaneState, str] | None:
    for fact in facts:
        if fact.problem is not None:
            return LaneState.UNKNOWN, f"child {fact.key or fact.run_id}: {fact.problem}"
    for fact in facts:
        assert fact.record is not None
        if fact.record.state is WorktreeState.ALLOCATED:
            return LaneState.TERMINAL_BLOCKED, f"child {fact.key or fact.run_id} holds uncaptured work"
        if fact.change is not None:
            return LaneState.TERMINAL_BLOCKED, f"child {fact.key or fact.run_id}'s worktree {fact.change}"
    return None


def _judge_evidence(home: Home, handoff: Handoff) -> tuple[LaneState, str | None]:
    merge = handoff.merge
    if merge is not None:
        if not merge.tree_equivalent:
            return LaneState.TERMINAL_BLOCKED, "the recorded merge is not tree-equivalent to the lane's work"
        if merge.post_merge_checks is not PostMergeChecks.RECORDED:
            return LaneState.TERMINAL_BLOCKED, f"post-merge checks {merge.post_merge_checks.value}"
        return LaneState.TERMINAL_ELIGIBLE, None
    assert handoff.supersession is not None
    if not home.run(handoff.supersession.by_lane).root.is_dir():
        return LaneState.TERMINAL_BLOCKED, f"the superseding lane {handoff.supersession.by_lane} is gone"
    return LaneState.SUPERSEDED_ELIGIBLE, None


def _load_handoff(home: Home, run_id: str) -> Handoff | None:
    from pisub.fsio import load_json

    try:
        return load_json(home.run(run_id).handoff, Handoff, limit=MAX_HANDOFF)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidInput(f"the lane's handoff.json cannot be read: {exc.strerror or exc}") from exc


def _record(
    ref: str,
    home: Path | None,
    *,
    merge: MergeEvidence | None = None,
    supersession: Supersession | None = None,
) -> LaneStatus:
    from pisub.errors import storage_error
    from pisub.fsio import atomic_write

    h = open_home(home)
    now = lane_status(ref, home)
    if now.state is LaneState.ACTIVE:
        raise InvalidInput(f"lane {now.run_id} is active: record evidence once it and its children ended")
    if now.state is LaneState.UNKNOWN or (now.reason or "").startswith("child "):
        raise InvalidInput(f"lane {now.run_id} cannot take evidence: {now.reason}")
    old = _load_handoff(h, now.run_id)
    assert now.digest is not None
    handoff = Handoff(
        run_id=now.run_id,
        digest=now.digest,
        merge=merge or (old.merge if old is not None and old.digest == now.digest else None),
        supersession=supersession
        or (old.supersession if old is not None and old.digest == now.digest else None),
        updated_at=now_iso(),
    )
    target = h.run(now.run_id).handoff
    try:
        atomic_write(target, encode_pretty(handoff))
    except OSError as exc:
        raise storage_error(exc, "write", target) from exc
    return lane_status(ref, home)
