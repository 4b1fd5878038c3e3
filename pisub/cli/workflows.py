"""``pisub workflow validate`` and ``pisub children list``."""

from __future__ import annotations

from pathlib import Path

import typer

from pisub.cli.render import json_line, out, out_block

app = typer.Typer(help="Workflow scripts.", no_args_is_help=True, add_completion=False)
children_app = typer.Typer(
    help="Finished child runs to continue.", no_args_is_help=True, add_completion=False
)


@app.command("validate")
def validate(
    script: Path = typer.Argument(..., readable=False, help="The workflow's Python file."),
    as_json: bool = typer.Option(False, "--json", help='Print {"ok", "errors": [{line, col, message}]}.'),
) -> None:
    """Check a workflow script without starting anything (exit 0 valid, 1 not)."""
    from pisub.api.admin import validate_workflow

    report = validate_workflow(script)
    if as_json:
        json_line(report.as_json())
    else:
        for problem in report.errors:
            out(f"{script}:{problem.line}:{problem.col}: {problem.message}")
        out("ok" if report.ok else f"{len(report.errors)} problem(s)")
    raise typer.Exit(0 if report.ok else 1)


@children_app.command("list")
def children_list(
    parent: str | None = typer.Option(None, "--parent", help="Only this workflow's children."),
    limit: int = typer.Option(10, "--limit", help="How many, most recent first (1-1000)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON array."),
) -> None:
    """The most recently finished child runs, each resumable or not (and why); continue one
    with runs.run(key, resume=RUN_ID, ...) in a workflow, or pisub resume RUN."""
    import msgspec

    from pisub.api.client import retained_children
    from pisub.cli.render import retained_text

    found = retained_children(parent=parent, limit=limit)
    if as_json:
        json_line(msgspec.to_builtins(found))
        return
    out_block(retained_text(found))
