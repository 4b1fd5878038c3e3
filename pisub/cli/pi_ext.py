"""``pisub pi-extension path|install``, ``pisub guide [TOPIC]`` and ``pisub home``."""

from __future__ import annotations

from pathlib import Path

import typer

from pisub.cli.render import out, out_block

app = typer.Typer(
    help="The subagent tool for pi (a pi extension).", no_args_is_help=True, add_completion=False
)


@app.command("path")
def path() -> None:
    """Print the packaged extension's path (for pi -e PATH; it runs pisub from PATH or $PISUB_ARGV)."""
    from pisub.api.pi_integration import extension_path

    out(str(extension_path()))


@app.command("install")
def install(
    into: str | None = typer.Option(None, "--into", help="A directory instead of pi's extensions directory."),
) -> None:
    """Install the extension into pi's extensions directory ($PI_CODING_AGENT_DIR/extensions or
    ~/.pi/agent/extensions), set to run this pisub; prints where it went."""
    from pisub.api.pi_integration import install_extension
    from pisub.errors import InvalidInput

    if into is not None and not into.strip():
        raise InvalidInput("--into: give a directory")
    out(str(install_extension(Path(into) if into is not None else None)))


def guide(topic: str | None = typer.Argument(None, help="overview, workflows, agents, control, ...")) -> None:
    """Print a guide topic (an unknown topic lists the valid ones)."""
    from pisub.api.pi_integration import guide as text

    out_block(text(topic).rstrip("\n"))


def home() -> None:
    """Print the pisub home directory (created if missing)."""
    from pisub.api.admin import home_dir

    out(str(home_dir()))


def models(
    search: str | None = typer.Argument(None, help="Only models matching this (as pi --list-models)."),
    agent: str | None = typer.Option(None, "--agent", help="Also say which model this agent uses."),
    as_json: bool = typer.Option(False, "--json", help="One {provider, id, name, ...} object per line."),
) -> None:
    """The models pi knows (pi --list-models); with --agent, the agent's model and thinking level.
    None at all (or none matching): one line with the fix, exit 1."""
    from dataclasses import asdict

    from pisub.api.client import agent_catalog, pi_models
    from pisub.cli.render import json_line

    found = pi_models(search, required=True)
    chosen = agent_catalog().get(agent).frontmatter if agent is not None else None
    for m in found:
        mark = chosen is not None and chosen.model in (m.name, m.id)
        if as_json:
            json_line({**asdict(m), "name": m.name, **({"agent": True} if mark else {})})
        else:
            thinks = "yes" if m.thinking else "no"
            out(f"{'*' if mark else ' '} {m.name:<40} context {m.context or '?':<6} thinking {thinks}")
    if chosen is not None and not as_json:
        model = chosen.model or "(pi's default)"
        out(f"agent {agent}: model {model}, thinking {chosen.thinking or '(default)'}")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="pi-extension")
    root.command("guide")(guide)
    root.command("home")(home)
    root.command("models")(models)
