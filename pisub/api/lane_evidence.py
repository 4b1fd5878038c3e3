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
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pisub.errors import EvidenceMismatch, InvalidInput, PisubError, StaleEvidence
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
from pisub.protocol.worktree import WorktreeLink, WorktreeRecord, WorktreeState
from pisub.store.paths import Home, is_run_id, open_home

MAX_HANDOFF = 64 * 1024
_FULL_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
MAX_SUPERSESSION_CHAIN = 64
"""Supersessions followed from a lane before the chain counts as a cycle."""
HANDOFF_LOCK_S = 30.0


@dataclass
class Fact:
    """One child's worktree as the evidence sees it."""

    run_id: str
    key: str | None
    record: WorktreeRecord | None
    problem: str | None = None
    change: str | None = None
    mismatch: str | None = None
    """Why the stored patch is not the captured one (hashed again every time)."""

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
        if status.state is LaneState.EVIDENCE_MISMATCH:
            status.code = EvidenceMismatch.code
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
    at: str | None = None,
    home: Path | None = None,
) -> LaneStatus:
    """Record that the lane's work was merged (pull request ``pr``), attested by ``by`` at
    ``at`` (an ISO 8601 time with a zone; default now).

    Raises:
        InvalidInput: a bad field (named; commit ids must be full), or the lane is active or
            holds uncaptured work.
        EvidenceMismatch: a child's stored patch is not the one captured.
        StaleEvidence: a merge with another reviewed head, merge commit or pull request is
            recorded for the same facts (the same merge again changes nothing).
        LockBusy: another recorder held the lane too long.
    """
    from pisub.protocol.codec import convert

    for option, value in (("--reviewed-head", reviewed_head), ("--merge-commit", merge_commit)):
        if not _FULL_COMMIT.fullmatch(value.lower()):
            raise InvalidInput(
                f"{option} must be a full commit id (40 hex digits, or 64 in a SHA-256 repository), "
                f"not {value[:80]!r}; git rev-parse gives it"
            )
        if not value.strip("0"):
            raise InvalidInput(f"{option} is the null id (all zeros), which names no commit")
    evidence = {
        "pr": pr,
        "reviewedHead": reviewed_head.lower(),
        "mergeCommit": merge_commit.lower(),
        "treeEquivalent": tree_equivalent,
        "postMergeChecks": post_merge_checks,
        "attestedBy": by,
        "attestedAt": attested_at(at),
    }
    try:
        PostMergeChecks(post_merge_checks)
        merge = convert(evidence, MergeEvidence, "the merge evidence")
    except ValueError:
        raise InvalidInput("--post-merge-checks must be recorded, skipped or failed") from None
    except PisubError as exc:
        raise InvalidInput(exc.message) from None
    return _record(ref, home, merge=merge)


def record_supersession(
    ref: str, *, by_lane: str, by: str, at: str | None = None, home: Path | None = None
) -> LaneStatus:
    """Record that lane ``by_lane``'s work replaces this lane's.

    Raises:
        InvalidInput: a bad name, the same lane (or a resume of it), a cycle of supersessions,
            not a workflow, or this lane is active.
        RunNotFound: no such lane.
        EvidenceMismatch, StaleEvidence: as :func:`record_merge`.
    """
    from pisub.api.client import Run

    other = Run(by_lane, home=home)
    if other.manifest().workflow is None:
        raise InvalidInput(f"run {other.id} is not a workflow run (a lane is one)")
    if not isinstance(by, str) or not 1 <= len(by) <= 128:
        raise InvalidInput("--by must be 1 to 128 characters")
    return _record(
        ref, home, supersession=Supersession(by_lane=other.id, attested_by=by, attested_at=attested_at(at))
    )


def attested_at(at: str | None) -> str:
    """The attestation time: ``at`` (ISO 8601 with a zone, as the person gave it) or now.

    Raises:
        InvalidInput: ``at`` is not such a time.
    """
    from datetime import datetime

    if at is None:
        return now_iso()
    try:
        when = datetime.fromisoformat(at.replace("Z", "+00:00")) if len(at) <= 64 else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InvalidInput(
            f"--at must be an ISO 8601 time with a zone (2026-08-27T16:23:00Z), not {at[:80]!r}"
        )
    return at


def lane_of_handoff(handoff: str | Path, ref: str | None = None, home: Path | None = None) -> str:
    """The lane (workflow run id) whose hand-off file ``handoff`` is: pisub keeps a lane's
    hand-off at ``<run dir>/handoff.json`` (the file need not exist yet). With ``ref``, the
    hand-off must be that lane's.

    Raises:
        InvalidInput: the path is not a lane's hand-off (naming where it is), or another lane's.
        RunNotFound: no such run.
    """
    from pisub.api.client import Run
    from pisub.termsafe import printable

    h = open_home(home)
    given = Path(os.path.realpath(os.path.abspath(handoff)))
    runs = Path(os.path.realpath(h.root / "runs"))
    run_id = given.parent.name
    if given.parent.parent != runs or given.name != "handoff.json" or not is_run_id(run_id):
        where = f"{h.run(Run(ref, home=h.root).id).handoff}" if ref is not None else "<run dir>/handoff.json"
        raise InvalidInput(
            f"{printable(os.fspath(handoff))[:200]} is not a lane's hand-off: pisub keeps it at {where}"
        )
    lane = Run(run_id, home=h.root).id
    if ref is not None and Run(ref, home=h.root).id != lane:
        shown = printable(os.fspath(handoff))[:200]
        raise InvalidInput(f"the hand-off {shown} is lane {lane}'s, not {ref}'s")
    return lane


def settled_children(ref: str, home: Path | None = None) -> set[str]:
    """The child runs whose captured work the lane's evidence accounts for: all of them when
    the lane is eligible now, else none.

    Raises:
        EvidenceMismatch: a child's stored patch is not the one captured (nothing of the lane
            may be cleaned up on its evidence; the message says how to fix it).
    """
    status = lane_status(ref, home)
    if status.state is LaneState.EVIDENCE_MISMATCH:
        raise EvidenceMismatch(f"lane {status.run_id}: {status.reason}")
    if status.state in (LaneState.TERMINAL_ELIGIBLE, LaneState.SUPERSEDED_ELIGIBLE):
        return set(status.children)
    return set()


@contextmanager
def holding(ref: str, home: Path | None = None) -> Iterator[None]:
    """Hold lane ``ref``'s ``handoff.lock``: no evidence is recorded meanwhile.

    Raises:
        LockBusy: a recorder held it too long. RunNotFound: no such run.
    """
    from pisub.api.client import Run
    from pisub.core.locks import exclusive

    h = open_home(home)
    with exclusive(h.run(Run(ref, home=h.root).id).handoff_lock, HANDOFF_LOCK_S):
        yield


def digest(facts: list[Fact]) -> str:
    data = json.dumps(sorted(f.as_json() for f in facts), separators=(",", ":"), default=str)
    return hashlib.sha256(data.encode()).hexdigest()


# == the lane's parts ==============================================================
def _lane(home: Home, ref: str) -> tuple[Status, list[Status]]:
    from pisub.api.client import Run, list_runs

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
    from pisub.store.runs import load_manifest

    try:
        workflow = load_manifest(home.run(run_id)).workflow
    except PisubError:
        return None
    return workflow.journal if workflow is not None else None


def _worktree_link(home: Home, run_id: str) -> str | None:
    from pisub.store.runs import load_manifest

    try:
        link = load_manifest(home.run(run_id)).worktree
    except PisubError:
        return None
    return link.record if link is not None else None


def _fact(home: Home, child: Status) -> Fact:
    from pisub.worktrees import load_record
    from pisub.worktrees.cleanup import uncaptured_change
    from pisub.worktrees.isolation import patch_mismatch

    where = Path(_worktree_link(home, child.run_id) or "")
    removed = where.parent / ".removed" / where.name
    for path in (where, removed):
        if not os.path.lexists(path):
            continue
        try:
            record = load_record(path)
        except (PisubError, OSError) as exc:
            return Fact(child.run_id, child.key, None, problem=str(exc))
        mismatch = patch_mismatch(record)
        return Fact(child.run_id, child.key, record, change=uncaptured_change(record), mismatch=mismatch)
    return Fact(child.run_id, child.key, None, problem=f"its worktree record {where} is gone")


def _facts_problem(facts: list[Fact]) -> tuple[LaneState, str] | None:
    for fact in facts:
        if fact.problem is not None:
            return LaneState.UNKNOWN, f"child {fact.key or fact.run_id}: {fact.problem}"
    for fact in facts:
        if fact.mismatch is not None:
            return LaneState.EVIDENCE_MISMATCH, mismatch_reason(fact)
    for fact in facts:
        assert fact.record is not None
        if fact.record.state is WorktreeState.ALLOCATED:
            return LaneState.TERMINAL_BLOCKED, f"child {fact.key or fact.run_id} holds uncaptured work"
        if fact.change is not None:
            return LaneState.TERMINAL_BLOCKED, f"child {fact.key or fact.run_id}'s worktree {fact.change}"
    return None


def mismatch_reason(fact: Fact) -> str:
    """The line of a tampered patch: what, where the captured work still is, and the fix."""
    record = fact.record
    assert record is not None and fact.mismatch is not None
    kept = f" (its captured work is commit {record.capture_commit}, {record.ref})" if record.ref else ""
    return (
        f"child {fact.key or fact.run_id}: {fact.mismatch}{kept}; restore the patch file as captured "
        f"or discard the worktree (pisub worktree discard {fact.run_id} --force), then record the "
        "evidence again"
    )


def _judge_evidence(home: Home, handoff: Handoff) -> tuple[LaneState, str | None]:
    merge = handoff.merge
    if merge is not None:
        if not merge.tree_equivalent:
            return LaneState.TERMINAL_BLOCKED, "the recorded merge is not tree-equivalent to the lane's work"
        if merge.post_merge_checks is not PostMergeChecks.RECORDED:
            return LaneState.TERMINAL_BLOCKED, f"post-merge checks {merge.post_merge_checks.value}"
        return LaneState.TERMINAL_ELIGIBLE, None
    assert handoff.supersession is not None
    if not is_run_id(handoff.supersession.by_lane):
        return LaneState.UNKNOWN, "the supersession does not name a run"
    if not home.run(handoff.supersession.by_lane).root.is_dir():
        return LaneState.TERMINAL_BLOCKED, f"the superseding lane {handoff.supersession.by_lane} is gone"
    cycle = _supersession_cycle(home, handoff.run_id, handoff.supersession.by_lane)
    if cycle is not None:
        return LaneState.TERMINAL_BLOCKED, cycle
    return LaneState.SUPERSEDED_ELIGIBLE, None


def _supersession_cycle(home: Home, lane: str, by_lane: str) -> str | None:
    """Why superseding ``lane`` by ``by_lane`` would leave nobody's work standing: it is the
    lane itself (or a resume of it), or the chain of supersessions from ``by_lane`` comes back
    to ``lane`` (or loops, or is longer than :data:`MAX_SUPERSESSION_CHAIN`)."""
    journal = _journal(home, lane)
    seen: list[str] = []
    current = by_lane
    for _ in range(MAX_SUPERSESSION_CHAIN):
        if not is_run_id(current):
            return f"the supersession chain names {current[:80]!r}, not a run"
        if current == lane or (journal is not None and _journal(home, current) == journal):
            if not seen:
                return f"lane {lane} cannot be superseded by itself (or by a resume of itself)"
            chain = " -> ".join([lane, *seen, current])
            return f"a supersession cycle ({chain}): no lane's work would stand"
        if current in seen:
            return f"a supersession cycle through {current}: no lane's work would stand"
        seen.append(current)
        try:
            found = _load_handoff(home, current)
        except PisubError:
            return None
        if found is None or found.supersession is None:
            return None
        current = found.supersession.by_lane
    return f"a supersession chain longer than {MAX_SUPERSESSION_CHAIN} lanes from {by_lane}"


def _load_handoff(home: Home, run_id: str) -> Handoff | None:
    from pisub.core.fsio import load_json

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
    """Judge the lane, check the new evidence against what is recorded, write it: all under
    the lane's ``handoff.lock``, so two recorders never both read the old evidence."""
    from pisub.api.client import Run

    h = open_home(home)
    lane = Run(ref, home=h.root).id
    with holding(lane, home):
        now = lane_status(lane, home)
        if now.state is LaneState.ACTIVE:
            raise InvalidInput(f"lane {now.run_id} is active: record evidence once it and its children ended")
        if now.state is LaneState.EVIDENCE_MISMATCH:
            raise EvidenceMismatch(f"lane {now.run_id} cannot take evidence: {now.reason}")
        if now.state is LaneState.UNKNOWN or (now.reason or "").startswith("child "):
            raise InvalidInput(f"lane {now.run_id} cannot take evidence: {now.reason}")
        if supersession is not None:
            cycle = _supersession_cycle(h, now.run_id, supersession.by_lane)
            if cycle is not None:
                raise InvalidInput(f"refused: {cycle}")
        if merge is not None:
            _check_ids(h, now.children, merge)
        old = _load_handoff(h, now.run_id)
        assert now.digest is not None
        held = old if old is not None and old.digest == now.digest else None
        if supersession is not None and held is not None and held.supersession is not None:
            if held.supersession.by_lane != supersession.by_lane:
                raise StaleEvidence(
                    f"lane {now.run_id} is already recorded as superseded by lane "
                    f"{held.supersession.by_lane} (by {held.supersession.attested_by}); "
                    f"{supersession.by_lane} contradicts it for the same facts"
                )
            return now  # the same supersession again: nothing is rewritten
        if merge is not None and held is not None and held.merge is not None:
            _check_not_conflicting(now.run_id, held.merge, merge)
            if _same_merge(held.merge, merge):
                return now  # the same evidence again: nothing is rewritten
        handoff = Handoff(
            run_id=now.run_id,
            digest=now.digest,
            merge=merge or (held.merge if held is not None else None),
            supersession=supersession or (held.supersession if held is not None else None),
            updated_at=now_iso(),
        )
        _write_handoff(h, handoff)
        return lane_status(lane, home)


def _check_ids(home: Home, children: list[str], merge: MergeEvidence) -> None:
    """Refuse commit ids the lane's repository does not hold as commits: of the other object
    format (40 hex digits in a SHA-1 repository, 64 in a SHA-256 one), absent, or not commits.
    Ancestry is not asked: a squash or rebase merge does not hold the reviewed head, and whether
    the merged tree is the reviewed work is what ``--tree-equivalent`` attests. The repository is
    the one its children's worktrees came from (every one of them, when they came from several).

    Raises:
        InvalidInput: naming the option and what is wrong, or the lane has no worktree (no
            repository to check the ids against).
    """
    links = [link for c in children if (link := _link(home, c)) is not None]
    if not links:
        raise InvalidInput(
            "the lane has no child with a worktree: there is no repository to check the commit ids "
            "against, and nothing for a merge to clean up"
        )
    lengths = {len(link.base_commit) for link in links}
    if len(lengths) == 1:
        [length] = lengths
        for option, value in _ids(merge):
            if len(value) != length:
                kind = "SHA-1" if length == 40 else "SHA-256"
                raise InvalidInput(
                    f"{option} has {len(value)} hex digits; the lane's repository uses {kind} ids of {length}"
                )
    for repo in dict.fromkeys(Path(link.repo) for link in links):
        _check_in_repo(repo, merge)


def _check_in_repo(repo: Path, merge: MergeEvidence) -> None:
    """Both ids name commits of ``repo`` (``git cat-file -e <id>^{commit}``, through pisub's one
    git choke point: no program the repository names runs).

    Raises:
        InvalidInput: an id is not a commit there (absent, another object, or the repository is
            gone).
        WorktreeError: git is missing or hung.
    """
    from pisub.termsafe import printable
    from pisub.worktrees.git import run_git

    where = printable(os.fspath(repo), one_line=True)
    for option, value in _ids(merge):
        found = run_git(repo, ["cat-file", "-e", f"{value}^{{commit}}"], what="look up a commit", check=False)
        if not found.ok:
            raise InvalidInput(
                f"{option} {value} is not a commit of the lane's repository {where}; fetch the merge "
                "there first (git fetch), then give the ids git rev-parse prints"
            )


def _ids(merge: MergeEvidence) -> tuple[tuple[str, str], ...]:
    return (("--reviewed-head", merge.reviewed_head), ("--merge-commit", merge.merge_commit))


def _link(home: Home, run_id: str) -> WorktreeLink | None:
    from pisub.store.runs import load_manifest

    try:
        return load_manifest(home.run(run_id)).worktree
    except PisubError:
        return None


def _check_not_conflicting(lane: str, held: MergeEvidence, new: MergeEvidence) -> None:
    """Refuse a merge that contradicts the one recorded for the same facts.

    Raises:
        StaleEvidence: another reviewed head, merge commit or pull request.
    """
    for name, before, after in (
        ("reviewed head", held.reviewed_head, new.reviewed_head),
        ("merge commit", held.merge_commit, new.merge_commit),
        ("pull request", str(held.pr), str(new.pr)),
    ):
        if before != after:
            raise StaleEvidence(
                f"lane {lane} already records a merge with {name} {before} (by {held.attested_by}, "
                f"{held.attested_at}); {after} contradicts it for the same facts: check which is "
                "right; evidence is replaced only once the lane's work changed"
            )


def _same_merge(held: MergeEvidence, new: MergeEvidence) -> bool:
    from msgspec.structs import replace

    return replace(held, attested_at=new.attested_at) == new


def _write_handoff(home: Home, handoff: Handoff) -> None:
    from pisub.core.fsio import atomic_write
    from pisub.errors import storage_error

    target = home.run(handoff.run_id).handoff
    try:
        atomic_write(target, encode_pretty(handoff))
    except OSError as exc:
        raise storage_error(exc, "write", target) from exc
