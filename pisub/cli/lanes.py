"""``pisub lane``: the evidence of what became of a lane's work."""

from __future__ import annotations

from typing import Any

import typer

from pisub.cli.complete import RUN
from pisub.cli.render import json_line, out

app = typer.Typer(help="Lane evidence: merges and supersessions.", no_args_is_help=True, add_completion=False)
JSON = typer.Option(False, "--json", help="JSON on stdout.")
HANDOFF = typer.Option(
    None, "--handoff", help="The lane's hand-off file (<run dir>/handoff.json): refused unless it is RUN's."
)
AT = typer.Option(None, "--at", help="When it was attested: ISO 8601 with a zone (default now).")


def _lane(ref: str, handoff: str | None) -> str:
    """RUN, checked against ``--handoff`` when given."""
    if handoff is None:
        return ref
    from pisub.api.lane_evidence import lane_of_handoff

    return lane_of_handoff(handoff, ref)


def _show(status: Any, as_json: bool) -> None:
    import msgspec

    if as_json:
        json_line(msgspec.to_builtins(status))
        return
    code = f" [{status.code}]" if status.code else ""
    out(f"{status.run_id}  {status.state.value}" + (f": {status.reason}" if status.reason else "") + code)
    if status.merge is not None:
        m = status.merge
        out(f"merge: PR {m.pr}, reviewed {m.reviewed_head}, merged {m.merge_commit}, by {m.attested_by}")
    if status.supersession is not None:
        out(f"superseded by lane {status.supersession.by_lane}, by {status.supersession.attested_by}")
    if status.cleanup_command is not None:
        out(f"allows: {status.cleanup_command}")


@app.command("status")
def status(ref: str = RUN, handoff: str | None = HANDOFF, as_json: bool = JSON) -> None:
    """The lane's state (active, terminal-eligible, terminal-blocked, superseded-eligible,
    evidence-mismatch, unknown) and the cleanup command its evidence allows (never run by pisub)."""
    from pisub.api.lane_evidence import lane_status

    _show(lane_status(_lane(ref, handoff)), as_json)


@app.command("record-merge")
def record_merge(
    ref: str = RUN,
    pr: int = typer.Option(..., "--pr", help="The pull request's number."),
    reviewed_head: str = typer.Option(..., "--reviewed-head", help="The commit that was reviewed."),
    merge_commit: str = typer.Option(..., "--merge-commit", help="The merge commit."),
    tree_equivalent: bool = typer.Option(
        False, "--tree-equivalent", help="The merged tree is the lane's reviewed work."
    ),
    post_merge_checks: str = typer.Option(..., "--post-merge-checks", help="recorded, skipped or failed."),
    by: str = typer.Option(..., "--by", help="Who attests it."),
    at: str | None = AT,
    handoff: str | None = HANDOFF,
    as_json: bool = JSON,
) -> None:
    """Record that the lane's work was merged (with a digest of the lane's facts now)."""
    from pisub.api.lane_evidence import record_merge as record

    _show(
        record(
            _lane(ref, handoff),
            pr=pr,
            reviewed_head=reviewed_head,
            merge_commit=merge_commit,
            tree_equivalent=tree_equivalent,
            post_merge_checks=post_merge_checks,
            by=by,
            at=at,
        ),
        as_json,
    )


@app.command("record-supersession")
def record_supersession(
    ref: str = RUN,
    by_lane: str = typer.Option(..., "--by-lane", help="The lane (workflow run) whose work replaces it."),
    by: str = typer.Option(..., "--by", help="Who attests it."),
    at: str | None = AT,
    handoff: str | None = HANDOFF,
    as_json: bool = JSON,
) -> None:
    """Record that another lane's work replaces this one's."""
    from pisub.api.lane_evidence import record_supersession as record

    _show(record(_lane(ref, handoff), by_lane=by_lane, by=by, at=at), as_json)
