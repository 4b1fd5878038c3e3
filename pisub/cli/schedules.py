"""``pisub schedule ...``: workflows that fire later or every interval (``spec/schedules.md``)."""

from __future__ import annotations

import typer

from pisub.cli.schedule_timer import register as register_timer

app = typer.Typer(
    help="Schedules: workflows fired later or every interval by `pisub schedule tick`.", no_args_is_help=True
)

register_timer(app)
