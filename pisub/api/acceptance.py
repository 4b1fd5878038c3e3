"""What acceptance adds to a launch, in words: the line ``pisub run`` prints on stderr before
anything costs a token (``manifest.acceptance_plan`` holds the same as data)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pisub.protocol.acceptance import AcceptancePlan

if TYPE_CHECKING:
    from pisub.api.client import Run
    from pisub.runs.reviews import ReviewRun

REVIEW_HINT = "--review turns them on"


def launch_lines(plan: AcceptancePlan | None, *, workflow: bool) -> list[str]:
    """The launch's acceptance line (none when it adds nothing), and for a workflow a warning
    when its reviewer is a user's or project's agent that overrides the one pisub ships (a
    single run's is said once by :func:`pisub.api.agents.reviewer_notice`)."""
    if plan is None:
        return []
    reports = _reports(plan)
    reviews = _reviews(plan)
    if reports is None and reviews is None:
        return []
    lines = [f"acceptance: {reports or 'no report block'}; {reviews or f'review runs: off ({REVIEW_HINT})'}"]
    if (
        workflow
        and plan.reviewer_overrides_builtin
        and (plan.reviews or (plan.reviews is None and plan.review_runs))
    ):
        lines.append(
            f"pisub: warning: review runs start your agent {plan.reviewer!r} ({plan.reviewer_path}), "
            f"which overrides the reviewer pisub ships (rename yours to keep the builtin)"
        )
    return lines


def _reports(plan: AcceptancePlan) -> str | None:
    if plan.report_blocks is None:
        return "report block added to each writer child the script starts"
    if not plan.report_blocks:
        return None
    of = f"{plan.report_blocks} of {plan.tasks} tasks" if (plan.tasks or 0) > 1 else "the task"
    return f"report block added to {of}"


def _reviews(plan: AcceptancePlan) -> str | None:
    agent = f"agent {plan.reviewer!r}, real tokens" if plan.reviewer else "real tokens"
    if plan.reviews is None:
        return f"review runs: on, one per writer child ({agent})" if plan.review_runs else None
    if plan.reviews:
        runs = "1 reviewer run" if plan.reviews == 1 else f"{plan.reviews} reviewer runs"
        return f"review runs: {runs} ({agent})"
    return "review runs: on, none (no writer)" if plan.review_runs else None


def review_runs_of(run: Run) -> list[ReviewRun]:
    """The reviewer runs a workflow's children started (``pisub status WORKFLOW`` lists them;
    none for a run that is not a workflow)."""
    from pisub.runs.reviews import review_runs

    status = run.status()
    if status.runner != "workflow":
        return []
    return review_runs(run.home, status)
