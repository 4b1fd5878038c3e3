"""A warm runner for a command that starts one run and exits (``pisub run``, ``pisub resume``):
started first, so that the runner's interpreter starts and imports on the other core while the
command line imports its parser, checks the agent and writes the manifest."""

from __future__ import annotations


def prestart_for_one_launch() -> None:
    """Start a warm runner now, keeping no spares (this process launches once)."""
    from pisub.backends import warm

    warm.configure(spares=False)
    warm.prestart()
