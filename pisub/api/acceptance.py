"""What acceptance adds to a launch, in words: the line ``pisub run`` prints on stderr before
anything costs a token (``manifest.acceptance_plan`` holds the same as data)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pisub.protocol.acceptance import AcceptancePlan

if TYPE_CHECKING:
    from pisub.api.client import Run
    from pisub.runs.reviews import ReviewRun

REVIEW_HINT = "--review turns them on"


def launch_lines(plan: AcceptancePlan | None) -> list[str]:
    """The launch's acceptance line (none when it adds nothing), and a warning at every launch
    whose review runs start a reviewer that is not the one pisub ships (a user's or a
    project's: its file and what it may do)."""
    if plan is None:
        return []
    reports = _reports(plan)
    if plan.tasks is not None and not (reports or plan.reviews or plan.recorded_reviews):
        return []
    lines = [f"acceptance: {reports or 'no report block'}; {_reviews(plan)}"]
    warning = reviewer_warning(plan)
    return lines + ([warning] if warning else [])


def reviewer_warning(plan: AcceptancePlan) -> str | None:
    """The warning when the plan's review runs start a reviewer other than pisub's."""
    runs = plan.reviews or (plan.reviews is None and plan.review_runs)
    if not runs or plan.reviewer is None:
        return None
    if plan.reviewer_scope in (None, "builtin") and not plan.reviewer_overrides_builtin:
        return None
    scope = f"the {plan.reviewer_scope}'s agent" if plan.reviewer_scope else "the agent"
    overrides = " (it takes the name of pisub's: rename it to keep the builtin)"
    return (
        f"pisub: warning: review runs start {scope} {plan.reviewer!r} ({plan.reviewer_path}), not the "
        f"reviewer pisub ships: {plan.reviewer_access or 'see its file'}"
        f"{overrides if plan.reviewer_overrides_builtin else ''}"
    )


def _reports(plan: AcceptancePlan) -> str | None:
    if plan.report_blocks is None:
        return "report block added to each writer child the script starts"
    if not plan.report_blocks:
        return None
    of = f"{plan.report_blocks} of {plan.tasks} tasks" if (plan.tasks or 0) > 1 else "the task"
    return f"report block added to {of}"


def _reviews(plan: AcceptancePlan) -> str:
    agent = f"agent {plan.reviewer!r}, real tokens" if plan.reviewer else "real tokens"
    if plan.tasks is None:  # a script: what each child it starts gets
        who = "each writer child the script starts (and any child that asks)"
        if plan.report_blocks is not None:  # [acceptance] infer = false: only what children ask
            who = "each child the script starts that asks for review"
        if plan.review_runs:
            return f"review runs: on — {who} gets a reviewer run ({agent})"
        return f"review runs: off — {who} is recorded review-required, not run ({REVIEW_HINT})"
    if plan.reviews:
        runs = "1 reviewer run" if plan.reviews == 1 else f"{plan.reviews} reviewer runs"
        return f"review runs: {runs} ({agent})"
    if plan.review_runs:
        return f"review runs: on, none ({plan.no_review or 'no writer'})"
    recorded = plan.recorded_reviews or 0
    if recorded == 1:
        return (
            "review runs: off — the review asked for is recorded review-required, not run (--review runs it)"
        )
    if recorded:
        return (
            f"review runs: off — {recorded} reviews asked for are recorded review-required, not run "
            "(--review runs them)"
        )
    return f"review runs: off ({REVIEW_HINT})"


def review_runs_of(run: Run) -> list[ReviewRun]:
    """The reviewer runs a run started: a single run's own, or its children's for a workflow
    (``pisub status RUN`` lists them)."""
    from pisub.runs.reviews import review_runs

    return review_runs(run.home, run.status())
