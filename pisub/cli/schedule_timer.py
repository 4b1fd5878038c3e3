"""``pisub schedule install`` / ``uninstall``: the real timer (cron or a systemd user timer) that
calls ``pisub schedule tick``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the timer commands to the ``schedule`` command group."""
