"""``pisub workflow validate`` and ``pisub children list``."""

from __future__ import annotations

from pathlib import Path

import typer

from pisub.cli.render import json_line, out, out_block

app = typer.Typer(help="Workflow scripts.", no_args_is_help=True, add_completion=False)
children_app = typer.Typer(
    help="Finished child runs to continue.", no_args_is_help=True, add_completion=False
)


STDIN_LIMIT = 1024 * 1024 + 1
"""Read from stdin: one byte more than a script may have (the check says it is too large)."""


@app.command("validate")
def validate(
    script: Path | None = typer.Argument(
        None, readable=False, help="The workflow's file: .js (JavaScript) or .py (Python)."
    ),
    workflow_script: str | None = typer.Option(
        None, "--workflow-script", metavar="TEXT|-", help="The JavaScript script itself ('-' reads stdin)."
    ),
    language: str | None = typer.Option(
        None, "--language", metavar="python|javascript", help="The script's language (default: by suffix)."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Print {"ok", "errors": [{message, line, column, kind?}], "warnings": [...]} (+ "total").',
    ),
) -> None:
    """Check a workflow script without starting anything (exit 0 valid, 1 not)."""
    from pisub.api.admin import validate_workflow

    text = _script_text(workflow_script)
    report = validate_workflow(script, text=text, language=language)
    if as_json:
        json_line(report.as_json())
    else:
        inline = "<stdin>" if workflow_script == "-" else "<workflowScript>"
        shown = _one_line(str(script) if script is not None else inline)
        for problem in report.errors:
            out(f"{shown}:{problem.line}:{problem.col}: {_one_line(problem.message)}")
        for problem in report.warnings:
            out(f"{shown}:{problem.line}:{problem.col}: warning: {_one_line(problem.message)}")
        if report.error_count > len(report.errors):
            out(f"(the first {len(report.errors)} problems are listed)")
        out("ok" if report.ok else f"{report.error_count} problem(s)")
    raise typer.Exit(0 if report.ok else 1)


def _script_text(given: str | None) -> str | None:
    """The inline script (``-``: stdin, read as bytes; text that is not UTF-8 keeps its bytes as
    lone surrogates, which the check refuses in one line)."""
    import sys

    if given != "-":
        return given
    data = sys.stdin.buffer.read(STDIN_LIMIT)
    return data.decode("utf-8", "surrogateescape")


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


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
