"""``pisub schedule ...``: workflows that fire later or every interval (``spec/schedules.md``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from pisub.cli.render import json_line, out, out_block
from pisub.cli.schedule_timer import register as register_timer
from pisub.termsafe import printable

app = typer.Typer(
    help="Schedules: workflows fired later or every interval by `pisub schedule tick`.", no_args_is_help=True
)

JSON = typer.Option(False, "--json", help="Machine-readable output (documented in spec/cli.md).")
ID = typer.Argument(
    ...,
    metavar="ID|NAME",
    help="The schedule: its id, its name, or a unique id prefix of 4+ characters (pisub schedule list).",
)


# ---- human output -------------------------------------------------------------------------


def _span(seconds: float) -> str:
    seconds = int(abs(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, _ = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def _when(value: str | None, now: float | None = None) -> str:
    """An ISO time in local time, with how far it is from now (``in 5m``, ``3m ago``)."""
    import datetime as dt

    from pisub.protocol.schedule import epoch

    if value is None:
        return "-"
    try:
        ts = epoch(value)
    except ValueError:
        return value
    moment = time.time() if now is None else now
    local = dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    delta = ts - moment
    near = "now" if abs(delta) < 1 else (f"in {_span(delta)}" if delta > 0 else f"{_span(delta)} ago")
    return f"{local} ({near})"


def _trigger(schedule: Any) -> str:
    if schedule.trigger.kind == "every":
        return f"every {schedule.trigger.every}"
    return "once"


def _state(schedule: Any, *, short: bool = False) -> str:
    if schedule.active is not None:
        run = schedule.active.run_id or "?"
        return f"firing {run[:8]}" if short else f"firing (run {run})"
    if schedule.paused:
        return "paused"
    if schedule.done:
        return "done"
    if schedule.next_run_at is not None and _overdue(schedule.next_run_at):
        if short:
            return "due"
        return "due (fired by the next pisub schedule tick: pisub schedule timer says whether one runs)"
    return "waiting"


TIMER_STALE_S = 180.0
"""A timer that has not ticked for this long is not ticking (three ticks of a one-minute timer)."""


def _timer_ticking() -> bool:
    """Whether a timer (cron, systemd) ticked this home in the last :data:`TIMER_STALE_S`."""
    from pisub.api.schedules import schedule_last_tick
    from pisub.protocol.schedule import epoch

    tick = schedule_last_tick()
    if tick is None or tick.source not in ("cron", "systemd"):
        return False
    try:
        return time.time() - epoch(tick.at) <= TIMER_STALE_S
    except ValueError:
        return False


def _near(value: str | None) -> str:
    """How far an ISO time is from now: ``in 5m``, ``3m ago``, ``now``; ``-`` for none."""
    from pisub.protocol.schedule import epoch

    if value is None:
        return "-"
    try:
        delta = epoch(value) - time.time()
    except ValueError:
        return value
    return "now" if abs(delta) < 1 else (f"in {_span(delta)}" if delta > 0 else f"{_span(delta)} ago")


def list_table(schedules: list[Any], width: int | None) -> str:
    """``schedule list``: one header row and aligned columns (ID NAME TRIGGER NEXT STATE LAST),
    fitted to ``width`` (None: nothing is cut)."""
    from pisub.cli.render import _table

    rows: list[tuple[str, ...]] = [("ID", "NAME", "TRIGGER", "NEXT", "STATE", "LAST")]
    for s in schedules:
        nxt = "-" if s.done or s.next_run_at is None else _near(s.next_run_at)
        if s.paused and not s.done:
            nxt = "paused"
        last = "never"
        if s.last is not None:
            fire = s.last
            last = f"{fire.state.value} {_near(fire.ended_at or fire.claimed_at or fire.planned_at)}"
        rows.append((s.id, s.name, _trigger(s), nxt, _state(s, short=True), last))
    return _table(rows, width=width, shrink=[(1, 10), (5, 12), (0, 8), (1, 6)])


def _overdue(value: str) -> bool:
    from pisub.protocol.schedule import epoch

    try:
        return epoch(value) <= time.time()
    except ValueError:
        return False


def _fire_line(fire: Any) -> str:
    state = fire.state.value
    if fire.count > 1:
        state += f" x{fire.count}"
    run = f"  run {fire.run_id}" if fire.run_id else ""
    why = f"  ({fire.error})" if fire.error else ""
    return f"{_when(fire.planned_at)}  {fire.due_reason.value:<7}  {state}{run}{why}"


def _last(schedule: Any) -> str:
    fire = schedule.last
    if fire is None:
        return "never fired"
    return f"{fire.state.value} ({_when(fire.ended_at or fire.claimed_at or fire.planned_at)})"


def _show_text(detail: Any) -> str:
    from pisub.cli.render import one_line

    s = detail.schedule
    lines = [
        f"schedule  {one_line(s.id)}  {one_line(s.name)}",
        f"state     {_state(s)}",
        f"trigger   {_trigger(s)}" + (f" (at {_when(s.trigger.at)})" if s.trigger.kind == "at" else ""),
        "next      " + ("-" if s.done or s.next_run_at is None else _when(s.next_run_at)),
        f"catch-up  {s.catch_up.value}  overlap skip" + ("  quiet" if s.quiet else ""),
        f"cwd       {one_line(s.cwd)}",
        f"script    {one_line(s.target.source or 'inline')} ({s.target.language}; its copy taken at "
        f"create runs: {s.target.copy_name})",
    ]
    if s.owner_session:
        lines.append(
            f"session   {s.owner_session}" + ("  (fires only while it is open)" if s.session_only else "")
        )
    lines.append(f"last      {_last(s)}")
    lines.append(f"fires     {s.fires} run(s) launched")
    if detail.recent:
        lines.append("recent:")
        lines.extend("  " + one_line(_fire_line(f)) for f in detail.recent)
    return "\n".join(lines)


# ---- commands -------------------------------------------------------------------------------


@app.command("create")
def create(
    workflow: Path | None = typer.Option(
        None, "--workflow", readable=False, help="The workflow script: FILE.js or FILE.py."
    ),
    workflow_script: str | None = typer.Option(
        None, "--workflow-script", metavar="TEXT|-", help="The JavaScript script itself ('-' reads stdin)."
    ),
    at: str | None = typer.Option(
        None, "--at", metavar="WHEN", help="Once: +N(s|m|h|d), or an ISO time with a zone."
    ),
    every: str | None = typer.Option(
        None, "--every", metavar="N(m|h|d|w)", help="Every interval (from now)."
    ),
    name: str | None = typer.Option(None, "--name", help="A name to show (default: the script's)."),
    schedule_id: str | None = typer.Option(None, "--id", help="The id (default: 8 hex digits)."),
    catch_up: str = typer.Option(
        "latest", "--catch-up", help="Missed slots: latest (fire the newest once) or none."
    ),
    quiet: bool = typer.Option(
        False, "--quiet", help="Intervals: a successful fire's notice starts no turn."
    ),
    session_only: bool = typer.Option(
        False, "--session-only", help="Fire only while the pi session is open."
    ),
    session_key: str | None = typer.Option(
        None, "--session-key", help="The creating pi session's key (32 hex)."
    ),
    cwd: Path | None = typer.Option(
        None, "--cwd", readable=False, help="Where the workflow runs (default: here)."
    ),
    args_json: str | None = typer.Option(
        None, "--args", metavar="JSON", help="The workflow's args (an object)."
    ),
    timeout: str | None = typer.Option(
        None, "--timeout", metavar="DURATION", help="Runtime limit: 90, 30s, 10m, 2h."
    ),
    base_ref: str | None = typer.Option(None, "--base-ref", help="The commit worktrees start from."),
    label: str | None = typer.Option(None, "--label", help="The label of each fire's run."),
    as_json: bool = JSON,
) -> None:
    """Create a schedule: a workflow fired once (--at) or every interval (--every)."""
    from pisub.api.schedules import schedule_create
    from pisub.cli.runs import _json_option, _script_text

    args = _json_option(args_json, "--args") if args_json is not None else None
    schedule = schedule_create(
        workflow=workflow,
        text=_script_text(workflow_script),
        at=at,
        every=every,
        name=name,
        schedule_id=schedule_id,
        catch_up=catch_up,
        quiet=quiet,
        session_only=session_only,
        session_key=session_key,
        cwd=cwd,
        args=args,
        timeout=_duration(timeout),
        base_ref=base_ref,
        label=label,
    )
    if as_json:
        json_line(schedule)
    else:
        out(f"created schedule {schedule.id} ({_trigger(schedule)}): next fire {_when(schedule.next_run_at)}")


def _duration(text: str | None) -> float | None:
    """``--timeout``: seconds, or N(s|m|h|d)."""
    import re

    from pisub.errors import InvalidInput

    if text is None:
        return None
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", text)
    if found is None:
        raise InvalidInput(f"--timeout: {text[:30]!r} is not a duration (90, 30s, 10m, 2h, 1d)")
    return float(found[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[found[2]]


@app.command("list")
def list_(
    all_projects: bool = typer.Option(False, "--all", help="Every project's schedules, not only this one's."),
    as_json: bool = typer.Option(False, "--json", help="A JSON array of schedule records."),
) -> None:
    """This project's schedules (--all: every one): next fire, state, last fire."""
    from pisub.api.schedules import schedule_list

    schedules = schedule_list(all_projects=all_projects)
    if as_json:
        json_line(schedules)
        return
    if not schedules:
        out("no schedules" + ("" if all_projects else " in this project (--all shows every project's)"))
        return
    from pisub.cli.render import out_block, terminal_width

    out_block(list_table(schedules, terminal_width()))
    if any(_state(s, short=True) == "due" for s in schedules) and not _timer_ticking():
        out(
            "due: fired by the next `pisub schedule tick`; no timer ticked in the last 3 minutes "
            "(pisub schedule install)"
        )


@app.command("show")
def show(schedule_id: str = ID, as_json: bool = JSON) -> None:
    """One schedule: its trigger, next fire, state and recent fires."""
    from pisub.api.schedules import schedule_show

    detail = schedule_show(schedule_id)
    if as_json:
        import msgspec

        shown = msgspec.to_builtins(detail.schedule)
        shown["recent"] = msgspec.to_builtins(detail.recent)
        json_line(shown)
    else:
        out_block(_show_text(detail))


@app.command("history")
def history(
    schedule_id: str = ID,
    limit: int = typer.Option(20, "--limit", help="How many fires (the history keeps 100)."),
    as_json: bool = typer.Option(False, "--json", help="A JSON array of fires, newest first."),
) -> None:
    """The schedule's fires, newest first: slot, reason, state, run."""
    from pisub.api.schedules import schedule_history

    fires = schedule_history(schedule_id, limit=limit)
    if as_json:
        json_line(fires)
    elif not fires:
        out(f"schedule {printable(schedule_id, one_line=True)} has not fired yet")
    else:
        for fire in fires:
            out(_fire_line(fire))


@app.command("pause")
def pause(schedule_id: str = ID, as_json: bool = JSON) -> None:
    """Fire no slot until resumed (a fire going on goes on)."""
    from pisub.api.schedules import schedule_pause

    schedule = schedule_pause(schedule_id)
    json_line(schedule) if as_json else out(f"paused schedule {schedule.id}")


@app.command("resume")
def resume(schedule_id: str = ID, as_json: bool = JSON) -> None:
    """Fire again from the next slot (slots that fell while paused are recorded missed)."""
    from pisub.api.schedules import schedule_resume

    schedule = schedule_resume(schedule_id)
    if as_json:
        json_line(schedule)
    else:
        nxt = "-" if schedule.done or schedule.next_run_at is None else _when(schedule.next_run_at)
        out(f"resumed schedule {schedule.id}: next fire {nxt}")


@app.command("delete")
def delete(
    schedule_id: str = ID,
    force: bool = typer.Option(
        False, "--force", help="Delete even while a fire runs (the run goes on as an ordinary run)."
    ),
    as_json: bool = JSON,
) -> None:
    """Delete a schedule and its history (refused while one of its fires runs, unless --force)."""
    from pisub.api.schedules import schedule_delete

    deleted = schedule_delete(schedule_id, force=force)
    json_line({"id": deleted, "deleted": True}) if as_json else out(f"deleted schedule {deleted}")


@app.command("run")
def run(
    schedule_id: str = ID,
    quiet: bool = typer.Option(False, "--quiet", help="A successful end's notice starts no turn."),
    as_json: bool = JSON,
) -> None:
    """Fire the schedule now (an interval's next slot is then one interval from now)."""
    from pisub.api.schedules import schedule_run

    fire = schedule_run(schedule_id, quiet=quiet)
    if as_json:
        json_line(fire)
    elif fire.state.value == "failed_launch":
        out(f"schedule {fire.schedule_id}: the launch failed: {fire.error}")
    else:
        out(f"schedule {fire.schedule_id} fired: run {fire.run_id}")


def _report(report: Any, as_json: bool) -> None:
    if as_json:
        from dataclasses import asdict

        import msgspec

        json_line(msgspec.to_builtins(asdict(report)))
        return
    for fire in report.fired:
        what = f"run {fire.run_id}" if fire.state.value != "failed_launch" else f"launch failed: {fire.error}"
        out(f"fired {fire.schedule_id} (slot {_when(fire.planned_at)}): {what}")
    for fire in report.ended:
        out(f"ended {fire.schedule_id}: run {fire.run_id} {fire.state.value}")
    for fire in report.skipped:
        out(f"skipped {fire.schedule_id} (slot {_when(fire.planned_at)}): {fire.error}")
    for fire in report.missed:
        count = f"{fire.count} slots from " if fire.count > 1 else "slot "
        out(f"missed {fire.schedule_id} ({count}{_when(fire.planned_at)}): {fire.error}")
    for schedule_id in report.waiting:
        out(f"waiting {schedule_id}: due, but its pi session is not open")
    for schedule_id in report.busy:
        out(f"busy {schedule_id}: another pisub process held its lock for the whole wait (60 s)")
    for line in report.errors:
        out(f"error {line}")
    done = report.fired or report.ended or report.skipped or report.missed or report.errors
    if not (done or report.waiting or report.busy):
        out("nothing due")


@app.command("run-due")
def run_due(as_json: bool = JSON) -> None:
    """Fire every schedule that is due now."""
    from pisub.api.schedules import schedule_run_due

    _report(schedule_run_due(), as_json)


@app.command("tick")
def tick(
    source: str = typer.Option("manual", "--from", help="Who ticks: cron, systemd or manual."),
    quiet: bool = typer.Option(False, "--quiet", help="Print nothing unless something went wrong."),
    as_json: bool = JSON,
) -> None:
    """Fire what is due (what a timer calls every minute; safe to run any number at once)."""
    from pisub.api.schedules import schedule_tick

    report = schedule_tick(source=source)
    if quiet and not as_json:
        for line in report.errors:
            out(f"error {line}")
        return
    _report(report, as_json)


register_timer(app)
