"""``pisub agents list|show|create|update|delete|disable|enable|eject|reset``."""

from __future__ import annotations

import typer

from pisub.cli.render import cell, err, json_line, out, out_block

app = typer.Typer(help="List, show and edit agent definitions.", no_args_is_help=True, rich_markup_mode=None)

SCOPE = typer.Option(None, "--scope", help="user or project (needed only when both have the agent).")
EXPECT = typer.Option(None, "--expect", help="The file's sha256 as you read it (agents show --json).")


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="One JSON object per line.")) -> None:
    """List every agent visible from the current directory."""
    from pisub.api.client import agent_catalog

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
            desc = f"  {cell(agent.frontmatter.description)}" if agent.frontmatter.description else ""
            out(f"{cell(agent.name):<20} {cell(agent.frontmatter.runner):<13} {cell(agent.scope):<8}{desc}")
    for path, problem in sorted(catalog.problems.items()):
        err(f"pisub: skipped {path}: {problem}")


@app.command()
def show(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show one agent: its settings and system prompt."""
    from pisub.api.client import agent_catalog, agent_file_sha

    agent = agent_catalog().get(name)
    if as_json:
        sha = agent_file_sha(agent.path)
        json_line({"scope": agent.scope, "path": str(agent.path), "sha256": sha, "spec": agent.spec()})
        return
    fm = agent.frontmatter
    out(f"name         {fm.name}")
    out(f"scope        {agent.scope} ({agent.path})")
    out(f"runner       {fm.runner}")
    if fm.description:
        out(f"description  {fm.description}")
    if fm.command:
        out(f"command      {fm.command} {' '.join(fm.args)}".rstrip())
    for label, value in (("timeout", fm.timeout), ("idleTimeout", fm.idle_timeout)):
        if value is not None:
            out(f"{label:<12} {value:g}s")
    if agent.system_prompt.strip():
        out_block("\n" + agent.system_prompt.strip())  # the body, shown whole


def _config(text: str | None, prompt: str | None) -> dict[str, object]:
    import json

    from pisub.errors import InvalidInput

    try:
        config = json.loads(text) if text else {}
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"--config: not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InvalidInput("--config: give a JSON object of frontmatter keys (camelCase)")
    if prompt is not None:
        config["systemPrompt"] = prompt
    return config


def _done(op: str, path: object) -> None:
    out(f"{op}: {path}")


@app.command()
def create(
    name: str,
    config: str | None = typer.Option(None, "--config", help='JSON: {"runner": "pi", "tools": [...], ...}.'),
    prompt: str | None = typer.Option(None, "--prompt", help="The system prompt (the file's body)."),
    scope: str | None = typer.Option(None, "--scope", help="user (default) or project."),
) -> None:
    """Write a new agent file (refused when the scope has it already)."""
    from pisub.api.client import edit_agent
    from pisub.errors import InvalidInput

    fields = _config(config, prompt)
    if fields.setdefault("name", name) != name:
        raise InvalidInput(f"--config name {str(fields['name'])[:64]!r} is not NAME {name!r}")
    _done("created", edit_agent("create", config=fields, scope=scope))


@app.command()
def update(
    name: str,
    config: str | None = typer.Option(None, "--config", help='JSON: keys to set; false or "" clears one.'),
    prompt: str | None = typer.Option(None, "--prompt", help="A new system prompt."),
    scope: str | None = SCOPE,
    expect: str | None = EXPECT,
) -> None:
    """Change an agent's keys or prompt (refused when the file changed since --expect)."""
    from pisub.api.client import edit_agent

    _done("updated", edit_agent("update", name, config=_config(config, prompt), scope=scope, expect=expect))


@app.command()
def delete(name: str, scope: str | None = SCOPE, expect: str | None = EXPECT) -> None:
    """Delete an agent file."""
    from pisub.api.client import edit_agent

    _done("deleted", edit_agent("delete", name, scope=scope, expect=expect))


@app.command()
def disable(name: str, scope: str | None = SCOPE) -> None:
    """Disable an agent: its runs are refused (SUBAGENT_DISABLED)."""
    from pisub.api.client import edit_agent

    _done("disabled", edit_agent("disable", name, scope=scope))


@app.command()
def enable(name: str, scope: str | None = SCOPE) -> None:
    """Enable a disabled agent."""
    from pisub.api.client import edit_agent

    _done("enabled", edit_agent("enable", name, scope=scope))


@app.command()
def eject(
    name: str, scope: str | None = typer.Option("user", "--scope", help="user (default) or project.")
) -> None:
    """Copy an agent shipped with pisub (reviewer, scout, worker) into a scope for editing."""
    from pisub.api.client import edit_agent

    _done("ejected", edit_agent("eject", name, scope=scope))


@app.command()
def reset(name: str, scope: str | None = SCOPE) -> None:
    """Put the shipped definition of an ejected agent back."""
    from pisub.api.client import edit_agent

    _done("reset", edit_agent("reset", name, scope=scope))
