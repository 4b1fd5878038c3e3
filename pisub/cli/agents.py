"""``pisub agents list|show|create|update|delete|disable|enable|eject|reset``."""

from __future__ import annotations

from typing import Any

import typer

from pisub.cli.render import cell, err, json_line, json_lines, out, out_block

app = typer.Typer(help="List, show and edit agent definitions.", no_args_is_help=True, rich_markup_mode=None)

SCOPE = typer.Option(None, "--scope", help="user or project (needed only when both have the agent).")
EXPECT = typer.Option(None, "--expect", help="The file's sha256 as you read it (agents show --json).")


@app.command("list")
def list_(
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
    scope: str = typer.Option(
        "both", "--scope", help="both (every agent that resolves, the default), user, project or builtin."
    ),
    capabilities: bool = typer.Option(
        False, "--capabilities", help="Add tools, models, timeouts, runner availability and ceilings."
    ),
) -> None:
    """List the agents visible from the current directory (pisub's and pi's agent folders)."""
    from pisub.api.agents import list_agents

    rows, problems = list_agents(scope, capabilities=capabilities)
    if as_json:
        json_lines(rows)
    else:
        if not rows:
            out("no agents (add ~/.pi/agent/agents/NAME.md, .pi/agents/NAME.md or <home>/agents/NAME.md)")
        for row in rows:
            _list_line(row, capabilities)
    for path, problem in sorted(problems.items()):
        err(f"pisub: skipped {path}: {problem}")


def _list_line(row: dict[str, Any], capabilities: bool) -> None:
    flags = " (shadowed)" if row.get("shadowed") else ""
    flags += _shadows(row)
    flags += " (disabled)" if row.get("disabled") else ""
    flags += " (refined)" if row.get("refined") else ""
    desc = f"  {cell(row['description'])}" if row["description"] else ""
    out(f"{cell(row['name']):<20} {cell(row['runner']):<13} {cell(row['scope']):<8}{flags}{desc}")
    if capabilities:
        caps = row["capabilities"]
        runner = caps["runner"]
        found = "available" if runner["available"] else f"unavailable: {runner['unavailableReason']}"
        tools = caps["tools"]["allow"]
        shown = "pi's defaults" if tools is None else ", ".join(tools) or "none"
        model = caps["models"]["model"] or "pi's default"
        out(f"    runner {cell(str(runner['command']))} ({found}); tools {cell(shown)}; model {cell(model)}")
    if row["ignored"]:
        keys = ", ".join(i["key"] for i in row["ignored"])
        out(f"    ignores {keys} (pisub agents show {cell(row['name'])} says why)")


def _shadows(row: dict[str, Any]) -> str:
    if not row.get("shadowsBuiltin"):
        return ""
    gates = "; review gates use it" if row["name"] == "reviewer" else ""
    return f" (shadows builtin{gates})"


@app.command()
def show(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show one agent: its settings, the keys pisub does not act on (why), its system prompt."""
    from pisub.api.client import agent_catalog, agent_file_sha

    agent = agent_catalog().get(name)
    if as_json:
        sha = agent_file_sha(agent.path)
        json_line(
            {
                "scope": agent.scope,
                "path": str(agent.path),
                "sha256": sha,
                "source": agent.dialect,
                "spec": agent.spec(),
            }
        )
        return
    fm, eff = agent.frontmatter, agent.effective
    out(f"name         {agent.name}")
    out(f"scope        {agent.scope} ({agent.path})")
    out(f"runner       {eff.runner}")
    if fm.description:
        out(f"description  {fm.description}")
    if eff.command:
        out(f"command      {eff.command} {' '.join(eff.args)}".rstrip())
    if eff.aliases:
        out(f"aliases      {', '.join(eff.aliases)}")
    if eff.runner == "pi":
        files = "on" if eff.context_files else "off"
        out(f"prompt       {eff.system_prompt_mode}s pi's system prompt; context files {files}")
    for label, value in (("timeout", eff.timeout), ("idleTimeout", fm.idle_timeout)):
        if value is not None:
            out(f"{label:<12} {value:g}s")
    for ignored in eff.ignored:
        out(f"ignored      {ignored.key}: {ignored.reason}")
    if agent.refinement:
        out("refined      yes (pisub agents refine NAME --show)")
    if agent.system_prompt.strip():
        out_block("\n" + agent.system_prompt.strip())  # the body, shown whole


@app.command()
def refine(
    name: str,
    config: str | None = typer.Option(
        None, "--config", help='JSON: {"guidance": TEXT, "reason": TEXT} (a new revision).'
    ),
    show_: bool = typer.Option(False, "--show", help="Show the overlay in force and its revisions."),
    rollback: bool = typer.Option(False, "--rollback", help="Put back the revision before the current one."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The project's refinement overlay of an agent: guidance added to its system prompt in this
    project (.pi/subagents/refinements/NAME.md), without editing the agent file."""
    from pisub.api import agents as api
    from pisub.errors import InvalidInput

    if (config is not None) + show_ + rollback != 1:
        raise InvalidInput("give one of --config JSON, --show or --rollback")
    if show_:
        shown = api.refine_show(name)
        if as_json:
            json_line(shown)
            return
        _show_overlay(shown)
        return
    if rollback:
        done = api.refine_rollback(name)
        if as_json:
            json_line(done)
        elif done["current"] is None:
            out(f"rolled back: {done['path']} removed (no refinement left)")
        else:
            out(f"rolled back: {done['path']} (revision {done['current']['revision']})")
        return
    made = api.refine(name, _config(config, None))
    if as_json:
        json_line(made)
    else:
        out(f"refined: {made['path']} (revision {made['revision']})")


def _show_overlay(shown: dict[str, Any]) -> None:
    now = shown["current"]
    out(f"overlay      {shown['path']}" + ("" if now else " (none)"))
    for rev in shown["history"]:
        why = f": {rev['reason']}" if rev["reason"] else ""
        out(f"revision {rev['revision']:<4} {rev['action']:<9} {rev['updatedAt']}{why}")
    if now:
        out_block("\n" + now["guidance"])


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
    from pisub.api.agents import shadow_warning

    path = edit_agent("create", config=fields, scope=scope)
    _done("created", path)
    warning = shadow_warning(path)
    if warning:
        err(warning)


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
    """Copy an agent shipped with pisub (coder, hello, reviewer, scout, worker) into a scope for editing."""
    from pisub.api.client import edit_agent

    _done("ejected", edit_agent("eject", name, scope=scope))


@app.command()
def reset(name: str, scope: str | None = SCOPE) -> None:
    """Put the shipped definition of an ejected agent back."""
    from pisub.api.client import edit_agent

    _done("reset", edit_agent("reset", name, scope=scope))
