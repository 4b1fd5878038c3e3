"""``pisub agents list|show``."""

from __future__ import annotations

import typer

from pisub.cli.render import err, json_line, out

app = typer.Typer(help="List and show agent definitions.", no_args_is_help=True, rich_markup_mode=None)


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="One JSON object per line.")) -> None:
    """List every agent visible from the current directory."""
    from pisub.client import agent_catalog

    catalog = agent_catalog()
    if as_json:
        for agent in sorted(catalog.agents.values(), key=lambda a: a.name):
            json_line(
                {
                    "name": agent.name,
                    "description": agent.frontmatter.description,
                    "runner": agent.frontmatter.runner,
                    "scope": agent.scope,
                    "path": str(agent.path),
                }
            )
    else:
        if not catalog.agents:
            out("no agents (add <home>/agents/NAME.md or .pisub/agents/NAME.md)")
        for agent in sorted(catalog.agents.values(), key=lambda a: a.name):
            desc = f"  {agent.frontmatter.description}" if agent.frontmatter.description else ""
            out(f"{agent.name:<20} {agent.frontmatter.runner:<13} {agent.scope:<8}{desc}")
    for path, problem in sorted(catalog.problems.items()):
        err(f"pisub: skipped {path}: {problem}")


@app.command()
def show(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show one agent: its settings and system prompt."""
    from pisub.client import agent_catalog

    agent = agent_catalog().get(name)
    if as_json:
        json_line({"scope": agent.scope, "path": str(agent.path), "spec": agent.spec()})
        return
    fm = agent.frontmatter
    out(f"name         {fm.name}\nscope        {agent.scope} ({agent.path})\nrunner       {fm.runner}")
    if fm.description:
        out(f"description  {fm.description}")
    if fm.command:
        out(f"command      {fm.command} {' '.join(fm.args)}".rstrip())
    for label, value in (("timeout", fm.timeout), ("idleTimeout", fm.idle_timeout)):
        if value is not None:
            out(f"{label:<12} {value:g}s")
    if agent.system_prompt.strip():
        out("\n" + agent.system_prompt.strip())
