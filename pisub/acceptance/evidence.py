"""The acceptance judge: what a run's runner checks of a child that completed, before it writes
the result — its report (read from its final output, which then loses the block), its
``verify`` commands on its tree and a review gate — and the evidence status that makes.

The judge knows nothing of processes or runs: the runner gives it the child's environment, a
way to end what the checks left running, to answer control requests meanwhile, and to run the
reviewer (:class:`Host`). A stop request (or a signal) that arrives while the checks run ends
them, and the run ends ``stopped``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pisub.errors import PisubError

if TYPE_CHECKING:  # imported where used: a launch waits only for what its start-up needs
    from pisub.acceptance.review import ReviewOutcome
    from pisub.protocol.acceptance import (
        Acceptance,
        AcceptanceRecord,
        AcceptanceSpec,
        Check,
        EvidenceStatus,
        Level,
    )

MAX_CHECKED_CLAIMS = 2000
"""The most changed files a ``checked`` report may claim (each may cost a git call)."""


class Output(Protocol):
    """The child's outcome as the judge sees it: its final output (the report is taken out)."""

    output: str


class Host(Protocol):
    """What the judge needs from the runner of the checked run."""

    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        """Append to the run's ``events.jsonl``."""

    def poll_stop(self) -> bool:
        """Answer the control requests waiting now (a stop calls :meth:`Judge.stop`); whether a
        signal asks the run to stop."""

    def end_descendants(self) -> None:
        """End whatever the ``verify`` commands left running."""

    def review(self, spec: AcceptanceSpec, stop_requested: Callable[[], bool]) -> ReviewOutcome:
        """Run the review gate until it ends or ``stop_requested()``."""


@dataclass(frozen=True)
class Place:
    """Where the checks run: the child's tree and environment, and the run's files."""

    cwd: Path
    home: Path
    """The pisub home (its config names the environment ``verify`` may keep)."""
    cache: Path
    acceptance_dir: Path
    env: dict[str, str]
    """The child's environment (``verify`` runs marked as the child is)."""
    not_before: float
    """When the child started (wall clock): a cached check older than that does not count."""


@dataclass(frozen=True)
class Judgement:
    record: AcceptanceRecord
    stopped: bool
    """A stop request or a signal came while the checks ran: the run ends ``stopped``."""
    gate_failed: str | None
    """Why an explicit acceptance failed (the run ends ``failed``), else None."""


class Judge:
    """Judges one completed child's evidence (built when the child has ended)."""

    def __init__(self, wanted: Acceptance, place: Place, host: Host) -> None:
        self.wanted = wanted
        self.place = place
        self.host = host
        self.accepting = False
        """The ``verify`` commands or the review run: a stop request ends them."""
        self.stopped = False

    def stop(self, reason: str | None) -> bool:
        """A stop request: taken (True) while the checks run."""
        if not self.accepting:
            return False
        self.stopped = True
        self.host.event("acceptance.stop", 0, reason=reason)
        return True

    def judge(self, outcome: Output) -> Judgement:
        """Run the checks; ``outcome.output`` loses its report block."""
        from pisub.acceptance.infer import runs_review
        from pisub.protocol.acceptance import AcceptanceRecord, Outcome

        wanted, where_ = self.wanted, self.place
        checks = _guarded("report", lambda: _report_checks(wanted.spec, outcome, where_.cwd))
        if wanted.spec.verify:  # (the config, and the checks' module, only for checks to run)
            from pisub.acceptance.verify import place, run_checks
            from pisub.store.config import load_config

            try:
                allowed = load_config(where_.home).acceptance.verify_env or []
            except PisubError:
                allowed = []
            where = place(where_.cwd, allowed, where_.env)
            self.accepting = True
            try:
                checks += run_checks(
                    wanted.spec.verify,
                    where,
                    where_.cache,
                    where_.acceptance_dir,
                    where_.env,
                    where_.not_before,
                    self._stop_requested,
                )
            finally:
                self.accepting = False
                # what a command left running (setsid included: the runner is their subreaper)
                self.host.end_descendants()
        failed = [c for c in checks if c.outcome is Outcome.FAILED]
        review = None
        asked = wanted.spec.review is not None and wanted.spec.review.required
        if asked and not runs_review(wanted) and not failed:
            review = _not_run()  # recorded, not run: review-required
            checks.append(review.check)
        if runs_review(wanted) and not failed and not self.stopped:
            self.accepting = True
            try:
                review = self.host.review(wanted.spec, self._stop_requested)
            finally:
                self.accepting = False
            checks.append(review.check)
            failed += [review.check] if review.check.outcome is Outcome.FAILED else []
        status = _evidence_status(wanted.spec.level, checks, failed, review)
        why = "; ".join(f"{c.id}: {c.reason}" for c in failed) or None
        inferred = None if wanted.explicit else wanted.spec.reason
        record = AcceptanceRecord(
            level=wanted.spec.level,
            explicit=wanted.explicit,
            evidence_status=status,
            checks=checks,
            reason="; ".join(r for r in (inferred, why) if r) or None,
        )
        self.host.event(
            "acceptance.checked",
            0,
            status=status.value,
            checks=[{"id": c.id, "outcome": c.outcome.value, "cache": c.cache} for c in checks],
        )
        gate_failed = f"acceptance gate failed: {why}" if failed and wanted.explicit else None
        return Judgement(record, self.stopped, gate_failed)

    def _stop_requested(self) -> bool:
        """While the checks run: whether a stop request (answered now, not after the checks) or
        a signal asks the run to stop."""
        if self.host.poll_stop():
            self.stopped = True
        return self.stopped


def take_report_out(spec: AcceptanceSpec, outcome: Output) -> None:
    """A run that did not complete is not checked, but a report it was asked for is still
    taken out of the output the caller gets (the raw log keeps it)."""
    from pisub.acceptance.report import wants_report, without_report

    if wants_report(spec):
        outcome.output = without_report(outcome.output)


def _report_checks(spec: AcceptanceSpec, outcome: Output, cwd: Path) -> list[Check]:
    """The report's checks (none when the spec asks for no report); the block is taken out
    of ``outcome.output``."""
    from pisub.acceptance.report import extract, missing_evidence, parse, unterminated, wants_report
    from pisub.protocol.acceptance import Check, Level, Outcome

    if not wants_report(spec):
        return []
    if unterminated(outcome.output):
        why = "the last acceptance-report block is not closed (no ``` line after it)"
        return [Check(id="report", kind="report", outcome=Outcome.FAILED, reason=why)]
    text, outcome.output = extract(outcome.output)
    if text is None:
        why = "no acceptance-report block"
        return [Check(id="report", kind="report", outcome=Outcome.FAILED, reason=why)]
    try:
        report = parse(text)
    except PisubError as exc:
        return [Check(id="report", kind="report", outcome=Outcome.FAILED, reason=exc.message)]
    checks = [Check(id="report", kind="report", outcome=Outcome.PASSED)]
    missing = missing_evidence(spec, report)
    if missing:
        checks.append(
            Check(
                id="evidence",
                kind="report",
                outcome=Outcome.FAILED,
                reason="missing: " + ", ".join(missing),
            )
        )
    if spec.level is Level.CHECKED:
        checks.append(_checked_claims(report, cwd))
    return checks


def _checked_claims(report: dict[str, object], cwd: Path) -> Check:
    """``checked``: what the runner can see of the report's claims holds (the files it says
    it changed exist or are deleted in git; no staged files when it says so)."""
    from pisub.protocol.acceptance import Check, Outcome

    changed = report.get("changedFiles") or []
    assert isinstance(changed, list)
    if len(changed) > MAX_CHECKED_CLAIMS:
        why = f"{len(changed)} changed files claimed; at most {MAX_CHECKED_CLAIMS} can be checked"
        return Check(id="claims", kind="report", outcome=Outcome.FAILED, reason=why)
    absent = [f for f in changed if not _changed_file_ok(cwd, str(f))]
    if absent:
        return Check(
            id="claims",
            kind="report",
            outcome=Outcome.FAILED,
            reason=f"no such changed file: {absent[0]}",
        )
    if report.get("noStagedFiles") is True and _has_staged(cwd):
        return Check(
            id="claims",
            kind="report",
            outcome=Outcome.FAILED,
            reason="it says nothing is staged; git has staged changes",
        )
    return Check(id="claims", kind="report", outcome=Outcome.PASSED)


def _guarded(what: str, checks: Callable[[], list[Check]]) -> list[Check]:
    """``checks()``, or one failed check when it raised: what a child or a model wrote never
    ends the runner."""
    from pisub.protocol.acceptance import Check, Outcome

    try:
        return checks()
    except Exception as exc:
        why = exc.message if isinstance(exc, PisubError) else f"{type(exc).__name__}: {exc}"
        return [
            Check(id=what, kind="report", outcome=Outcome.FAILED, reason=f"could not be checked: {why}"[:500])
        ]


def _evidence_status(
    level: Level, checks: list[Check], failed: list[Check], review: ReviewOutcome | None
) -> EvidenceStatus:
    from pisub.protocol.acceptance import EvidenceStatus, Level

    if review is not None and not review.finished:
        return EvidenceStatus.REVIEW_REQUIRED
    if failed:
        return EvidenceStatus.REJECTED
    if review is not None:
        return EvidenceStatus.REVIEWED
    if any(c.kind == "verify" for c in checks):
        return EvidenceStatus.VERIFIED
    if level is Level.CHECKED:
        return EvidenceStatus.CHECKED
    if level is Level.ATTESTED:
        return EvidenceStatus.ATTESTED
    return EvidenceStatus.CLAIMED


def _not_run() -> ReviewOutcome:
    """An inferred review the person did not opt in to run: no reviewer run, a skipped check."""
    from pisub.acceptance.infer import REVIEW_RUNS_OFF
    from pisub.acceptance.review import ReviewOutcome
    from pisub.protocol.acceptance import Check, Outcome

    check = Check(id="review", kind="review", outcome=Outcome.SKIPPED, reason=f"not run: {REVIEW_RUNS_OFF}")
    return ReviewOutcome(check, finished=False)


def _git_quiet(cwd: Path, args: list[str]) -> int | None:
    """git's exit code in ``cwd`` (hardened, timed: :func:`pisub.worktrees.git.run_git`);
    None when git could not run."""
    from pisub.errors import WorktreeError
    from pisub.worktrees.git import run_git

    try:
        return run_git(cwd, args, what="check the report's claims", check=False).returncode
    except WorktreeError:
        return None


def _deleted_in_git(cwd: Path, name: str) -> bool:
    """Whether ``name`` is tracked at HEAD (so its absence is a deletion)."""
    return _git_quiet(cwd, ["cat-file", "-e", f"HEAD:./{name}"]) == 0


def _has_staged(cwd: Path) -> bool:
    return _git_quiet(cwd, ["diff", "--cached", "--quiet"]) == 1


def _changed_file_ok(cwd: Path, name: str) -> bool:
    """A claimed changed file: a relative path inside the tree (not in ``.git``), naming a
    regular file there or one deleted from HEAD."""
    if not name.strip() or os.path.isabs(name):
        return False
    root = os.path.realpath(cwd)
    target = os.path.realpath(os.path.join(root, name))
    if not target.startswith(root + os.sep) or ".git" in Path(os.path.relpath(target, root)).parts:
        return False
    if os.path.isfile(target):
        return True
    return not os.path.lexists(target) and _deleted_in_git(cwd, name)


def started_at(started_monotonic: float) -> float:
    """The wall-clock time of a monotonic instant in the past (when the child started)."""
    return time.time() - (time.monotonic() - started_monotonic)
