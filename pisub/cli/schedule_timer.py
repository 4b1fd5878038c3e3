"""``pisub schedule install`` / ``uninstall`` / ``timer``: the real timer (cron or a systemd user
timer) that calls ``pisub schedule tick`` every minute (``spec/schedule-timer.md``)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

import typer

from pisub.cli.render import json_line, out

if TYPE_CHECKING:
    from pisub.api.schedule_timer import Installed, LastTick, Plan, TimerStatus

JSON = typer.Option(False, "--json", help="Machine-readable output (documented in spec/cli.md).")


def register(app: typer.Typer) -> None:
    """Add the timer commands to the ``schedule`` command group."""
    app.command("install")(install)
    app.command("uninstall")(uninstall)
    app.command("timer")(timer)


def install(
    cron: bool = typer.Option(
        False, "--cron", help="A line in your crontab (default when no systemd user manager)."
    ),
    systemd: bool = typer.Option(
        False, "--systemd", help="A systemd user timer (default when `systemctl --user` answers)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be written."),
    as_json: bool = JSON,
) -> None:
    """Install the timer that runs `pisub schedule tick` every minute for this home."""
    from pisub.api.schedule_timer import install as install_timer
    from pisub.errors import InvalidInput
    from pisub.protocol.schedule_timer import TimerKind

    if cron and systemd:
        raise InvalidInput("--cron and --systemd exclude each other: give one (or neither: the machine's)")
    kind = TimerKind.CRON if cron else TimerKind.SYSTEMD if systemd else None
    plan = install_timer(kind, dry_run=dry_run)
    if as_json:
        json_line(_plan_json(plan))
        return
    where = (
        f"the crontab of {plan.owner}"
        if plan.kind is TimerKind.CRON
        else f"{plan.owner}'s systemd user manager"
    )
    if plan.dry_run:
        verb = "would install" if plan.changed else "already installed (nothing would change)"
    else:
        verb = "installed" if plan.changed else "already installed (unchanged)"
    out(f"{verb}: {plan.kind.value} timer in {where}, every minute, for home {plan.home}")
    if plan.kind is TimerKind.CRON:
        out(f"  entry: {plan.entry}")
    else:
        for unit in plan.files:
            out(f"  {unit.path}:")
            for line in unit.text.splitlines():
                out(f"    {line}")
    out(f"  runs: {shlex.join(plan.command)}")
    for gone in plan.removed:
        out(f"  removed the {gone.kind.value} entry it replaces: {gone.entry}")
    for note in plan.notes:
        out(f"note: {note}")


def uninstall(as_json: bool = JSON) -> None:
    """Remove this home's timer entry (every other crontab line and unit stays)."""
    from pisub.api.schedule_timer import uninstall as uninstall_timer

    done = uninstall_timer()
    if as_json:
        json_line({"home": done.home, "removed": [_installed_json(r) for r in done.removed]})
        return
    if not done.removed:
        out(f"nothing to remove: no timer of home {done.home} is installed")
    for gone in done.removed:
        out(f"removed: {gone.kind.value} {gone.entry}")


def timer(as_json: bool = JSON) -> None:
    """Say which timer ticks this home (kind, entry, the pisub it runs) and its last tick."""
    from pisub.api.schedule_timer import NO_TIMER, ago
    from pisub.api.schedule_timer import status as timer_status

    state = timer_status()
    if as_json:
        json_line(_status_json(state))
        return
    if not state.installed:
        out(f"timer: none for home {state.home}: {NO_TIMER.removeprefix('no timer installed: ')}")
        if state.available is None:
            out("  this machine has neither a systemd user manager nor a crontab command")
        else:
            out(f"  pisub schedule install would use {state.available.value}")
    for entry in state.installed:
        out(f"timer: {entry.kind.value} for home {state.home}")
        out(f"  entry: {entry.entry}")
        if entry.pisub:
            gone = "" if entry.pisub_exists else "  (missing)"
            out(f"  runs: {shlex.join(entry.pisub)} schedule tick --from {entry.kind.value} --quiet{gone}")
    tick = state.last_tick
    if tick is None:
        out("last tick: never")
    else:
        out(f"last tick: {tick.at} ({ago(tick.age_s)} ago), from {tick.source}, fired {tick.fired}")
    for warning in state.warnings:
        out(f"warning: {warning}")
    for note in state.notes:
        out(f"note: {note}")


def _installed_json(entry: Installed) -> dict[str, Any]:
    return {
        "kind": entry.kind.value,
        "entry": entry.entry,
        "pisub": entry.pisub,
        "pisubExists": entry.pisub_exists,
        "active": entry.active,
    }


def _tick_json(tick: LastTick | None) -> dict[str, Any] | None:
    if tick is None:
        return None
    return {"at": tick.at, "ageSeconds": round(tick.age_s, 1), "source": tick.source, "fired": tick.fired}


def _plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "kind": plan.kind.value,
        "home": plan.home,
        "dryRun": plan.dry_run,
        "changed": plan.changed,
        "owner": plan.owner,
        "entry": plan.entry,
        "pisub": plan.pisub,
        "command": plan.command,
        "files": [{"path": f.path, "text": f.text} for f in plan.files],
        "removed": [_installed_json(r) for r in plan.removed],
        "notes": plan.notes,
    }


def _status_json(state: TimerStatus) -> dict[str, Any]:
    return {
        "home": state.home,
        "installed": [_installed_json(e) for e in state.installed],
        "lastTick": _tick_json(state.last_tick),
        "warnings": state.warnings,
        "notes": state.notes,
        "available": None if state.available is None else state.available.value,
    }
