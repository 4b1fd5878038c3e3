"""What the commands' arguments share: the RUN argument, completed by
:mod:`pisub.api.completion`, and the check of a number of seconds (:func:`finite_seconds`)."""

from __future__ import annotations

from typing import Any

from pisub.api.completion import agent_names, run_ids

__all__ = ["RUN", "agent_names", "finite_seconds", "run_ids"]


def _run_argument() -> Any:
    import typer

    return typer.Argument(..., metavar="RUN", autocompletion=run_ids)


RUN: Any = _run_argument()
"""A command's RUN argument (a run id or prefix), completed with :func:`run_ids`."""


def finite_seconds(value: float | None) -> float | None:
    """A NaN or infinite wait (or timeout) is refused as ``-5`` is, by the parser: a usage
    error, before anything is written (a NaN wait would never end)."""
    import math

    if value is not None and not math.isfinite(value):
        import typer

        raise typer.BadParameter(f"{value} is not a finite number of seconds.")
    return value
