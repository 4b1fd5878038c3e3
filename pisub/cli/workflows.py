"""``pisub workflow validate``."""

from __future__ import annotations

from pathlib import Path

import typer

from pisub.cli.render import json_line, out

app = typer.Typer(help="Workflow scripts.", no_args_is_help=True, add_completion=False)


@app.command("validate")
def validate(
    script: Path = typer.Argument(..., help="The workflow's Python file."),
    as_json: bool = typer.Option(False, "--json", help='Print {"ok", "errors": [{line, col, message}]}.'),
) -> None:
    """Check a workflow script without starting anything (exit 0 valid, 1 not)."""
    import os

    from pisub.client import agent_catalog
    from pisub.workflow.validate import validate_file

    agents = set(agent_catalog(cwd=Path(os.getcwd())).agents)
    report = validate_file(script.absolute(), agents)
    if as_json:
        json_line(report.as_json())
    else:
        for problem in report.errors:
            out(f"{script}:{problem.line}:{problem.col}: {problem.message}")
        out("ok" if report.ok else f"{len(report.errors)} problem(s)")
    raise typer.Exit(0 if report.ok else 1)
