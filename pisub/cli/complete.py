"""The RUN argument of the commands, completed by :mod:`pisub.api.completion`."""

from __future__ import annotations

from typing import Any

from pisub.api.completion import agent_names, run_ids

__all__ = ["RUN", "agent_names", "run_ids"]


def _run_argument() -> Any:
    import typer

    return typer.Argument(..., metavar="RUN", autocompletion=run_ids)


RUN: Any = _run_argument()
"""A command's RUN argument (a run id or prefix), completed with :func:`run_ids`."""
