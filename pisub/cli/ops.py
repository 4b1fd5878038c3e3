"""``pisub doctor`` and ``pisub gc``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from pisub.cli.render import json_line, out, print_report

if TYPE_CHECKING:
    from pisub.api.doctor import GcResult

JSON = typer.Option(False, "--json", help="Machine-readable output (documented in spec/cli.md).")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    app.command("gc")(gc)


def doctor(as_json: bool = JSON) -> None:
    """Check the home, inotify limits, the pi binary, stuck runs, orphaned leases and agent files."""
    from pisub.api.admin import doctor as diagnose

    report = diagnose()
    print_report(report, as_json, width=8)
    for check in report.checks:
        out(f"{'ok ' if check.ok else 'BAD'}  {check.name:<8} {check.detail}")
        if not check.ok and check.fix:
            out(f"           fix: {check.fix}")
    out("healthy" if report.healthy else "problems found")
    raise typer.Exit(0 if report.healthy else 1)


def gc(
    older_than: str = typer.Option(
        "30d", "--older-than", help="Age of finished runs to remove (30d, 12h, ...)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be removed."),
    as_json: bool = JSON,
) -> None:
    """Remove finished runs (never a live one) and sweep stale inbox/tmp files."""
    from pisub.api.admin import gc as collect
    from pisub.api.admin import parse_age
    from pisub.cli.progress import progress

    parse_age(older_than)  # refused before the progress bar shows
    with progress() as update:
        result = collect(older_than, dry_run=dry_run, progress=update)
    if as_json:
        json_line(
            {
                "dryRun": dry_run,
                "removed": result.removed,
                "swept": [str(path) for path in result.swept_tmp],
                "keptLive": result.kept_live,
                "keptRecent": result.kept_recent,
                "keptWithTree": result.kept_with_tree,
            }
        )
        return
    verb = "would remove" if dry_run else "removed"
    for run_id in result.removed:
        out(f"{verb} run {run_id}")
    for path in result.swept_tmp:
        out(f"{verb} stale {path}")
    removed = f"{verb} {len(result.removed)} run(s) and {len(result.swept_tmp)} temp file(s)"
    out(f"{removed}; {kept_text(result, older_than)}")


def kept_text(result: GcResult, older_than: str) -> str:
    """What ``gc`` kept, by why: ``kept 22 run(s) that ended less than 30d ago, 1 live run(s)``."""
    if older_than.strip().replace(".", "", 1).isdigit():
        older_than += "s"  # a bare number of seconds
    kept = [
        (result.kept_recent, f"run(s) that ended less than {older_than} ago"),
        (result.kept_live, "live run(s)"),
        (result.kept_with_tree, "ended run(s) their trees need"),
    ]
    said = [f"{len(runs)} {why}" for runs, why in kept if runs]
    return "kept " + ", ".join(said) if said else "kept no run"
