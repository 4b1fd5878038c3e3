"""The review runs block of ``pisub status WORKFLOW``."""

from __future__ import annotations

from typing import Any

from pisub.cli.render import age, cell, out_block


def print_review_runs(handle: Any) -> None:
    """A table of the reviewer runs the workflow's children started, when there are any."""
    from pisub.api.acceptance import review_runs_of

    found = review_runs_of(handle)
    if not found:
        return
    lines = ["review runs (a reviewer run per reviewed child; real tokens)"]
    lines.append(f"  {'CHILD':<16} {'RUN':<8}  {'AGENT':<12} {'STATE':<10} STARTED")
    for review in found:
        st = review.status
        key = cell(review.child_key or review.child_run_id[:8])
        lines.append(
            f"  {key:<16} {cell(st.run_id[:8]):<8}  {cell(st.agent):<12} {cell(str(st.state)):<10} "
            f"{age(st.started_at)}"
        )
    out_block("\n".join(lines))
