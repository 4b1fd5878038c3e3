"""``pisub mission ...``: mission records that hold a goal across workflows (``spec/missions.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from pisub.cli.render import (
    _cut,
    _table,
    age,
    cell,
    colour_wanted,
    columns_of,
    err,
    json_line,
    out,
    out_painted,
    paint,
    short_path,
    terminal_width,
)

if TYPE_CHECKING:
    from pisub.api.missions import MissionView
    from pisub.protocol.mission import Mission

app = typer.Typer(
    help="Missions: a goal, its runs, decisions and state across workflows (spec/missions.md).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


JSON = typer.Option(False, "--json", help="Machine-readable output (documented in spec/cli.md).")
MISSION = typer.Argument(..., metavar="ID", help="A mission id (12 hex digits: pisub mission list).")
CWD = typer.Option(None, "--cwd", help="The project's directory (default: here).")

MISSION_HUES = {
    "completed": "complete",
    "failed": "failed",
    "cancelled": "stopped",
    "waiting": "paused",
    "needs_decision": "paused",
    "active": "running",
    "planned": "pending",
}
"""A mission state's colour: the run state whose hue it shares."""


def _record(mission: Mission) -> dict[str, Any]:
    import msgspec

    data: dict[str, Any] = msgspec.to_builtins(mission)
    return data


def _one(mission: Mission, as_json: bool) -> None:
    """What update, resolve-decision, attach-run and close print: the record, or one line."""
    if as_json:
        json_line(mission)
        return
    out(f"{mission.id}  {mission.status}  {mission.title}")


@app.command("create")
def create(
    title: str | None = typer.Option(None, "--title", help="The mission's title (one line)."),
    summary: str | None = typer.Option(None, "--summary", help="Or a summary as its title (the seed's)."),
    objective: str | None = typer.Option(None, "--objective", help="What done looks like."),
    goal: bool = typer.Option(False, "--goal", help="A goal mission: continuation notices (needs a budget)."),
    budget_tokens: int | None = typer.Option(None, "--budget-tokens", help="The goal's token budget."),
    label: list[str] = typer.Option([], "--label", help="A label (repeat for more)."),
    cwd: str | None = CWD,
    session_key: str | None = typer.Option(
        None, "--session-key", help="The owner pi session (32 hex): its idle turns get the notices."
    ),
    as_json: bool = JSON,
) -> None:
    """Create a planned mission in this project (the git repository, or the directory)."""
    from pisub.api.missions import mission_create

    mission = mission_create(
        title=title,
        summary=summary,
        objective=objective,
        goal=goal,
        budget_tokens=budget_tokens,
        labels=label,
        cwd=cwd,
        session_key=session_key,
    )
    _one(mission, as_json)


@app.command("list")
def list_(
    scope: str = typer.Option("project", "--scope", help="project (this repository's) or global (all)."),
    cwd: str | None = CWD,
    as_json: bool = JSON,
) -> None:
    """The missions of this project (--scope global: of every project), newest first, their
    runs read now."""
    from pisub.api.missions import mission_list

    listing = mission_list(scope=scope, cwd=cwd)
    for note in listing.skipped:
        err(f"pisub: skipped {note}")
    if as_json:
        json_line(listing.missions)
        return
    if not listing.missions:
        out("no missions" + (" in this project" if scope == "project" else ""))
        return
    colour = colour_wanted()
    rows: list[tuple[str, ...]] = [("ID", "STATE", "RUNS", "TOKENS", "UPDATED", "TITLE")]
    rows[0] += ("PROJECT",) if scope == "global" else ()
    for m in listing.missions:
        live = sum(1 for r in m.runs if r.status in ("starting", "queued", "running"))
        runs = f"{len(m.runs)}" + (f" ({live} live)" if live else "")
        tokens = f"{m.usage.tokens}" + (f"/{m.budget.tokens}" if m.budget else "")
        row: tuple[str, ...] = (m.id, str(m.status), runs, tokens, age(m.updated_at), m.title)
        if scope == "global":
            row += (short_path(listing.roots.get(m.project, m.project)),)
        rows.append(row)
    text = _table(rows, width=terminal_width(), shrink=[(5, 12), (6, 12)], cut_left=[6])
    out_painted(_paint_states(text, colour) if colour else text)


def _paint_states(text: str, colour: bool) -> str:
    lines = text.split("\n")
    for n, line in enumerate(lines[1:], 1):
        parts = line.split("  ", 2)
        if len(parts) >= 2:
            state = parts[1].strip()
            hue = MISSION_HUES.get(state)
            if hue:
                lines[n] = line.replace(state, paint(state, hue, colour), 1)
    return "\n".join(lines)


@app.command("show")
def show(mission_id: str = MISSION, cwd: str | None = CWD, as_json: bool = JSON) -> None:
    """A mission as a person reads it: state, objective, runs and their states, open decisions,
    budget used, artifacts, receipts and the next step (its runs read now)."""
    from pisub.api.missions import mission_show

    view = mission_show(mission_id, cwd=cwd)
    for note in view.notes:
        err(f"pisub: {note}")
    if as_json:
        json_line({**_record(view.mission), "nextStep": view.next_step, "projectRoot": view.root})
        return
    colour = colour_wanted()
    out_painted(show_text(view, width=terminal_width(), colour=colour))


def _line(text: str, width: int | None) -> str:
    """One line of a block, its fields escaped already, cut to ``width``."""
    return text if width is None or columns_of(text) <= width else _cut(text, width)


def show_text(view: MissionView, *, width: int | None = None, colour: bool = False) -> str:
    """``pisub mission show``'s block: every value escaped with ``cell``; lines and tables cut
    to ``width`` (None: a pipe gets everything)."""
    m = view.mission
    hue = MISSION_HUES.get(str(m.status), "")
    kind = "goal mission" if m.goal else "mission"
    closed = ", closed" if m.closed else ""
    lines = [
        f"{kind}  {cell(m.id)}  {cell(m.title)}",
        f"state    {paint(cell(m.status), hue, colour)}{closed}  (updated {age(m.updated_at)}, "
        f"created {age(m.created_at)})",
    ]
    if m.objective:
        objective = m.objective.strip().split("\n")
        lines.append(f"objective  {cell(objective[0])}")
        lines += [f"           {cell(more)}" for more in objective[1:8]]
        if len(objective) > 8:
            lines.append(f"           … {len(objective) - 8} more lines (--json)")
    if m.budget:
        share = 100 * m.usage.tokens / m.budget.tokens if m.budget.tokens else 0
        over = "  EXHAUSTED" if m.usage.tokens >= m.budget.tokens else ""
        lines.append(f"budget   {m.usage.tokens} / {m.budget.tokens} tokens used ({share:.0f}%){over}")
    else:
        lines.append(f"usage    {m.usage.tokens} tokens, {m.usage.turns} turns, ${m.usage.cost_usd:.4f}")
    if m.labels:
        lines.append(f"labels   {', '.join(cell(label) for label in m.labels)}")
    lines.append(f"project  {cell(short_path(view.root or m.cwd))}")
    if m.owner_session:
        lines.append(f"session  {cell(m.owner_session)}")
    if m.summary:
        lines.append(f"summary  {cell(m.summary)}")
    lines = [_line(line, width) for line in lines]
    if m.runs:
        rows: list[tuple[str, ...]] = [("RUN", "MODE", "STATE", "TOKENS", "ENDED")]
        for r in m.runs:
            rows.append((r.run_id, str(r.mode), r.status, str(r.usage.tokens), age(r.ended_at)))
        lines.append(f"runs ({len(m.runs)})")
        lines.append(_indent(_table(rows, width=_less(width), shrink=[(0, 8)])))
    else:
        lines.append("runs     none yet")
    if m.workflow_children:
        rows = [("WORKFLOW", "KEY", "AGENT", "STATE", "RUN")]
        for c in m.workflow_children[-20:]:
            rows.append(
                (
                    c.workflow_run_id[:8],
                    c.key or "-",
                    c.agent or "-",
                    c.status,
                    c.run_id[:8] if c.run_id else "-",
                )
            )
        more = len(m.workflow_children) - 20
        lines.append("workflow children" + (f" (last 20 of {len(m.workflow_children)})" if more > 0 else ""))
        lines.append(_indent(_table(rows, width=_less(width), shrink=[(2, 8), (1, 8)])))
    open_ = [d for d in m.decisions if d.status == "open"]
    settled = [d for d in m.decisions if d.status != "open"]
    if open_:
        lines.append(f"open decisions ({len(open_)})")
        lines += [_line(f"  {cell(d.id)}  {cell(d.title)}", width) for d in open_]
    if settled:
        lines.append(f"resolved decisions ({len(settled)})")
        lines += [
            _line(f"  {cell(d.id)}  {cell(d.title)} → {cell(d.resolution or '-')}", width)
            for d in settled[-10:]
        ]
    if m.artifacts:
        rows = [("KIND", "PATH")]
        rows += [(a.kind, a.path) for a in m.artifacts[-20:]]
        lines.append(f"artifacts ({len(m.artifacts)})")
        lines.append(_indent(_table(rows, width=_less(width), shrink=[(1, 12)], cut_left=[1])))
    if m.receipts:
        rows = [("KIND", "STATUS", "URL")]
        rows += [(str(r.kind), r.status, r.url) for r in m.receipts[-20:]]
        lines.append(f"receipts ({len(m.receipts)})")
        lines.append(_indent(_table(rows, width=_less(width), shrink=[(2, 16)])))
    lines.append(_line(f"next     {cell(view.next_step)}", width))
    return "\n".join(lines)


def _less(width: int | None) -> int | None:
    return None if width is None else width - 2


def _indent(table: str) -> str:
    return "\n".join("  " + line for line in table.split("\n"))


@app.command("update")
def update(
    mission_id: str = MISSION,
    set_: str = typer.Option(
        ...,
        "--set",
        help='The seed\'s missionUpdate as JSON: {"title", "objective", "status", "labels", "budget", '
        '"decisions": [{"id"?, "title", "status"?, "resolution"?}], "artifacts": [{"kind", "path"}], '
        '"receipts": [{"kind", "status", "url"}]} ("-": read it from stdin).',
    ),
    cwd: str | None = CWD,
    as_json: bool = JSON,
) -> None:
    """Change a mission (strict: an unknown field or a bad value names its path). A new open
    decision gates it as needs_decision; a final status closes it."""
    import sys

    from pisub.api.missions import mission_update
    from pisub.protocol.mission import MAX_UPDATE_BYTES

    # (stdin is read up to one byte past the limit: an endless pipe is refused, not buffered)
    text: str | bytes = sys.stdin.buffer.read(MAX_UPDATE_BYTES + 1) if set_ == "-" else set_
    _one(mission_update(mission_id, text, cwd=cwd), as_json)


@app.command("resolve-decision")
def resolve_decision(
    mission_id: str = MISSION,
    decision_id: str = typer.Argument(
        ..., metavar="DECISION_ID", help="The decision's id (pisub mission show)."
    ),
    summary: str = typer.Option(..., "--summary", help="What was decided."),
    cwd: str | None = CWD,
    as_json: bool = JSON,
) -> None:
    """Resolve an open decision; the last one resolved returns the mission to active."""
    from pisub.api.missions import mission_resolve_decision

    _one(mission_resolve_decision(mission_id, decision_id, summary, cwd=cwd), as_json)


@app.command("attach-run")
def attach_run(
    mission_id: str = MISSION,
    run: str = typer.Argument(..., metavar="RUN", help="A run id, a unique prefix (4+) or @LABEL."),
    mode: str | None = typer.Option(None, "--mode", help="workflow or run (default: what the run is)."),
    cwd: str | None = CWD,
    as_json: bool = JSON,
) -> None:
    """Link a run to the mission: its state, usage (and a workflow's children) follow it."""
    from pisub.api.missions import mission_attach_run

    _one(mission_attach_run(mission_id, run, mode=mode, cwd=cwd), as_json)


@app.command("close")
def close(
    mission_id: str = MISSION,
    status: str = typer.Option(..., "--status", help="completed, failed or cancelled."),
    summary: str | None = typer.Option(None, "--summary", help="How it ended."),
    cwd: str | None = CWD,
    as_json: bool = JSON,
) -> None:
    """Close a mission; it keeps this status whatever its runs do later."""
    from pisub.api.missions import mission_close

    _one(mission_close(mission_id, status, summary=summary, cwd=cwd), as_json)


@app.command("next")
def next_(
    session_key: str = typer.Option(..., "--session-key", help="The pi session's key (32 hex)."),
    as_json: bool = JSON,
) -> None:
    """The goal continuation notice for that session's goal missions (at most 180 characters),
    or why there is none (a run is active, no progress since the last notice, ...)."""
    from pisub.api.missions import mission_next

    notice = mission_next(session_key)
    for note in notice.skipped:
        err(f"pisub: skipped {note}")
    if as_json:
        json_line(notice.to_json())
    elif notice.notice is not None:
        out(notice.notice)
    else:
        about = f" (mission {notice.mission_id})" if notice.mission_id else ""
        out(f"no notice: {notice.reason}{about}")
