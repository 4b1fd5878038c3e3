"""``pisub --version`` and ``pisub version``: the package's version."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("version")(version)


def _print_version(given: bool) -> None:
    if given:
        from pisub import __version__
        from pisub.cli.render import out

        out(f"pisub {__version__}")
        raise typer.Exit(0)


def root(
    show_version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        expose_value=True,
        callback=_print_version,
        help="Print pisub's version and exit.",
    ),
) -> None:
    """Detached background runs of coding sub-agents, controlled through plain files."""


def version(
    as_json: bool = typer.Option(
        False, "--json", help="Machine-readable output (documented in spec/cli.md)."
    ),
) -> None:
    """Print pisub's version (and, with --json, the Python running it)."""
    import platform

    from pisub import __version__
    from pisub.cli.render import json_line, out

    if as_json:
        json_line({"version": __version__, "python": platform.python_version()})
    else:
        out(f"pisub {__version__}")
