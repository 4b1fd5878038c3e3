"""``pisub resources``: the named workflow resources (``spec/resources.md``)."""

from __future__ import annotations

import typer

from pisub.cli.render import cell, json_line, out_block

JSON = typer.Option(False, "--json", help="Machine-readable output (documented in spec/cli.md).")


def register(app: typer.Typer) -> None:
    app.command("resources")(resources)


def resources(as_json: bool = JSON) -> None:
    """List the named workflow resources (pisub run --resource NAME): the builtins, then those
    of your config.toml ([workflows.resources.NAME]), one line each."""
    from pisub.api.resources import list_resources

    rows = list_resources()
    if as_json:
        for row in rows:
            json_line(
                {
                    "name": row.name,
                    "source": row.source,
                    "description": row.description,
                    "commands": row.commands,
                    "path": row.path,
                }
            )
        return
    lines = []
    for row in rows:
        where = f"  {cell(row.path)}" if row.path else ""
        lines.append(f"{cell(row.name):<12} {row.source:<8} {cell(row.description)}{where}")
    out_block("\n".join(lines))
