"""A review gate, run by the runner of the reviewed run once its child completed and every
other check passed: the reviewer agent is started as a real run (a child of the reviewed run,
key ``review``, acceptance ``none``) on the task, the criteria and the diff, and the runner
waits for its result and reads its verdict (:mod:`pisub.acceptance.review`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pisub.errors import PisubError
from pisub.protocol.acceptance import Acceptance, AcceptanceSpec, Check, Finding, Level, Outcome
from pisub.protocol.manifest import LimitValues, Manifest
from pisub.store.paths import RunPaths

REVIEW_KEY = "review"
DEFAULT_REVIEWER = "reviewer"
POLL_S = 0.2
REVIEW_SLACK_S = 15.0
"""How much longer than the reviewer's own timeout and grace its run is waited for."""


@dataclass
class ReviewOutcome:
    check: Check
    finished: bool
    """Whether the reviewer gave a verdict (else the work still needs a review)."""


def reviewer_name(spec: AcceptanceSpec, configured: str | None) -> str:
    agent = spec.review.agent if spec.review is not None else None
    return agent or configured or DEFAULT_REVIEWER


def run_review(
    paths: RunPaths,
    manifest: Manifest,
    reviewer: str,
    diff: str | None,
    *,
    started: Callable[[str], None],
    stop_requested: Callable[[], bool],
) -> ReviewOutcome:
    """Run the reviewer to its end (or until ``stop_requested``, which stops it) and judge its
    verdict. Never raises: a reviewer that cannot start or gives no verdict is a failed check."""
    from pisub.acceptance.review import review_task

    assert manifest.acceptance is not None
    task = review_task(manifest.acceptance.spec, manifest.task, diff)
    try:
        review_paths = _start(paths, manifest, reviewer, task)
    except PisubError as exc:
        return _unfinished(f"the reviewer {reviewer!r} could not start: {exc.message}")
    except Exception as exc:
        return _unfinished(f"the reviewer {reviewer!r} could not start: {type(exc).__name__}: {exc}"[:500])
    started(review_paths.run_id)
    try:
        return _await(review_paths, stop_requested)
    except Exception as exc:  # whatever the reviewer wrote, the reviewed run's runner goes on
        why = exc.message if isinstance(exc, PisubError) else f"{type(exc).__name__}: {exc}"
        return _unfinished(f"the review could not be read: {why}"[:500], review_paths.run_id)


def _start(paths: RunPaths, manifest: Manifest, reviewer: str, task: str) -> RunPaths:
    """The reviewer's run, of the agent definition taken at launch (never what the scopes hold
    now: the reviewed child could have written a project agent of that name)."""
    from pisub.agents.catalog import Catalog, parse_agent
    from pisub.errors import InvalidInput
    from pisub.runs.launch import plan_run, start_run
    from pisub.store.lineage import Lineage

    home = paths.home
    cwd = Path(manifest.cwd)
    taken = manifest.acceptance.reviewer if manifest.acceptance is not None else None
    if taken is None:
        raise InvalidInput("the launch recorded no reviewer agent")
    scope = taken.scope if taken.scope in ("builtin", "user", "project") else "user"
    agent = parse_agent(taken.text, Path(taken.path), scope)  # type: ignore[arg-type]
    catalog = Catalog(agents={agent.name: agent})
    here = Lineage(manifest.parent_run_id, manifest.root_run_id, manifest.depth, manifest.max_depth)
    plan = plan_run(
        home,
        agent.name,
        task,
        cwd=cwd,
        caller=LimitValues(),
        lineage=here.child(manifest.run_id),
        key=REVIEW_KEY,
        catalog=catalog,
        acceptance=Acceptance(spec=AcceptanceSpec(level=Level.NONE, reason="a reviewer"), explicit=True),
    )
    return start_run(home, plan)


def _await(review: RunPaths, stop_requested: Callable[[], bool]) -> ReviewOutcome:
    """Wait for the reviewer's run to end, at most its own timeout and grace plus
    :data:`REVIEW_SLACK_S` (a runner that is alive but never ends — stopped, wedged — is not
    waited for for ever): past that it is asked to stop and the review fails closed."""
    from pisub.core.polling import poll
    from pisub.protocol.control import Stop
    from pisub.runs.reconcile import observe
    from pisub.store.mailbox import write_request

    stopping = False

    def stop(reason: str) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            with contextlib.suppress(PisubError):  # it has ended meanwhile
                write_request(review, Stop(v=1, reason=reason, source="review"))

    def ended() -> bool | None:
        if not stopping and stop_requested():
            stop("the reviewed run was stopped")
        try:
            return True if observe(review).state.is_terminal else None
        except PisubError:
            return True  # gone or unreadable: judged below

    bound = _bound(review)
    if poll(ended, bound, interval=POLL_S, first=0.02, first_for=1.0) is None:
        stop("the review ran past the reviewer's timeout")
        return _unfinished(
            f"the reviewer did not end within its timeout and grace (+{REVIEW_SLACK_S:g}s, {bound:g}s "
            "in all): asked to stop; the work is not reviewed",
            review.run_id,
        )
    return _judge(review)


def _bound(review: RunPaths) -> float:
    """Longest wait for the reviewer's run: its timeout and grace plus the slack."""
    from pisub.defaults import DEFAULT_GRACE_S, DEFAULT_TIMEOUT_S
    from pisub.store.runs import load_manifest

    try:
        limits = load_manifest(review).limits
        timeout, grace = limits.timeout or DEFAULT_TIMEOUT_S, limits.grace
    except PisubError:
        timeout, grace = DEFAULT_TIMEOUT_S, DEFAULT_GRACE_S
    return timeout + grace + REVIEW_SLACK_S


def _judge(review: RunPaths) -> ReviewOutcome:
    from pisub.acceptance.review import extract, parse, rejection
    from pisub.store.runs import load_result

    try:
        result = load_result(review)
    except PisubError as exc:
        return _unfinished(f"the reviewer's result cannot be read: {exc.message}", review.run_id)
    if result is None or result.state != "complete":
        state = result.state if result is not None else "no result"
        return _unfinished(f"the reviewer ended {state}", review.run_id)
    output = result.details.results[0].output if result.details.results else ""
    try:
        text = extract(output or "")
    except PisubError as exc:  # two verdicts: neither is taken
        return _unfinished(exc.message, review.run_id)
    if text is None:
        return _unfinished("the reviewer gave no review-verdict block", review.run_id)
    try:
        verdict = parse(text)
    except PisubError as exc:
        return _unfinished(exc.message, review.run_id)
    findings = [Finding(severity=f.severity, message=f.message, file=f.file) for f in verdict.findings]
    why = rejection(verdict)
    check = Check(
        id="review",
        kind="review",
        outcome=Outcome.FAILED if why else Outcome.PASSED,
        reason=why,
        run_id=review.run_id,
        findings=findings,
    )
    return ReviewOutcome(check, finished=True)


def _unfinished(why: str, run_id: str | None = None) -> ReviewOutcome:
    return ReviewOutcome(
        Check(id="review", kind="review", outcome=Outcome.FAILED, reason=why, run_id=run_id), finished=False
    )
