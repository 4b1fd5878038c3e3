"""``pisub worktree``: the isolated children's git worktrees."""

from __future__ import annotations

from pathlib import Path

import typer

from pisub.cli.complete import RUN
from pisub.cli.render import json_line, out

app = typer.Typer(help="Isolated children's git worktrees.", no_args_is_help=True, add_completion=False)
JSON = typer.Option(False, "--json", help="JSON on stdout.")


@app.command("list")
def list_(as_json: bool = JSON) -> None:
    """Every worktree: its run, key, state, branch, captured patch, and what cleanup would do."""
    import msgspec

    from pisub.api.worktree_ops import list_worktrees

    rows = list_worktrees()
    if as_json:
        json_line(msgspec.to_builtins(rows))
        return
    if not rows:
        out("no worktrees")
        return
    for row in rows:
        rec, plan = row.record, row.plan
        patch = rec.patch if rec is not None else None
        captured = (
            f"{patch.size} bytes, {len(patch.files)} files, sha256 {patch.sha256[:12]}" if patch else "-"
        )
        state = rec.state.value if rec is not None else "-"
        out(
            f"{(plan.run_id or plan.name)[:8]}  {rec.key if rec else '-'}  {state}  "
            f"{rec.branch if rec else '-'}  patch: {captured}  "
            f"cleanup: {plan.decision.value} ({plan.reason.value}){': ' + plan.detail if plan.detail else ''}"
        )
        if patch is not None and (patch.ignored_changed or patch.ignored_omitted):
            count = len(patch.ignored_changed) + patch.ignored_omitted
            shown = ", ".join(patch.ignored_changed[:5])
            out(f"warning: {count} ignored path(s) in its worktree are not in the patch: {shown}")


@app.command("apply")
def apply(
    ref: str = RUN,
    into: Path | None = typer.Option(
        None, "--into", readable=False, help="The checkout to apply to (default: the source)."
    ),
    as_json: bool = JSON,
) -> None:
    """Apply RUN's captured work onto a checkout; on a conflict nothing changes and each file
    is named (exit 1)."""
    import msgspec

    from pisub.api.worktree_ops import apply_worktree

    report = apply_worktree(ref, into)
    if as_json:
        json_line(msgspec.to_builtins(report))
    elif report.ok:
        out(f"applied {len(report.files)} file(s) to {report.target} ({report.mode.value})")
    else:
        for conflict in report.conflicts:
            out(f"conflict: {conflict.path}: {conflict.reason}")
        out(f"nothing applied: {len(report.conflicts)} conflict(s)")
    raise typer.Exit(0 if report.ok else 1)


@app.command("discard")
def discard(
    ref: str = RUN,
    force: bool = typer.Option(False, "--force", help="Yes: delete the worktree and its branch."),
) -> None:
    """Delete RUN's worktree, branch and refs/pisub ref (its patch file stays in the run)."""
    from pisub.api.worktree_ops import discard_worktree

    discard_worktree(ref, force=force)
    out(f"discarded the worktree of {ref}")


@app.command("cleanup")
def cleanup(
    plan: bool = typer.Option(False, "--plan", help="Only say what would be removed (the default)."),
    apply_: bool = typer.Option(False, "--apply", help="Remove the safe ones (each checked again)."),
    lane: str | None = typer.Option(
        None,
        "--lane",
        help="A lane (workflow run) whose recorded merge or supersession covers its worktrees.",
    ),
    handoff: str | None = typer.Option(
        None,
        "--handoff",
        help="The lane's hand-off file (<run dir>/handoff.json): the lane, or checked against --lane.",
    ),
    repo: Path | None = typer.Option(
        None, "--repo", readable=False, help="Only the worktrees of this repository (a directory in it)."
    ),
    as_json: bool = JSON,
) -> None:
    """Plan each worktree remove|keep|unknown with the reason (safe, dirty, active, unapplied,
    uncaptured, unknown); --apply removes only safe ones. Nothing with work not saved
    elsewhere is ever removed."""
    import msgspec

    from pisub.api.worktree_ops import cleanup_worktrees
    from pisub.errors import InvalidInput

    if plan and apply_:
        raise InvalidInput("give --plan or --apply, not both")
    if handoff is not None:
        from pisub.api.lane_evidence import lane_of_handoff

        lane = lane_of_handoff(handoff, lane)
    entries, removed = cleanup_worktrees(apply=apply_, lane=lane, repo=repo)
    if as_json:
        json_line({"plan": msgspec.to_builtins(entries), "removed": msgspec.to_builtins(removed)})
        return
    for entry in entries:
        detail = f": {entry.detail}" if entry.detail else ""
        out(f"{entry.decision.value}  {entry.name}  ({entry.reason.value}{detail})")
    for removal in removed:
        done = "removed" if removal.removed else f"kept: {removal.error}"
        out(f"{done}  {removal.entry.name}")
    if not entries:
        out("no worktrees")
