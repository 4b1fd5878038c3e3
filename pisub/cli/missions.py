"""``pisub mission ...``: mission records that hold a goal across workflows (``spec/missions.md``)."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Missions: a goal, its runs, decisions and state across workflows.", no_args_is_help=True
)
