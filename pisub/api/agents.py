"""Agents as the faces list them (``pisub agents list``, the tool's ``list``) and the project's
refinement overlays (``pisub agents refine``, the tool's ``refine``/``refine.show``/
``refine.rollback``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pisub.agents.catalog import Agent, Catalog
from pisub.errors import InvalidInput, PisubError

ListScope = Literal["user", "project", "both", "builtin"]
LIST_SCOPES: tuple[ListScope, ...] = ("user", "project", "both", "builtin")
MAX_REASON = 300
"""Characters of a ``runner.unavailableReason`` (bounded, as the seed says)."""


def list_scope(value: str) -> ListScope:
    """Raises: InvalidInput: not one of :data:`LIST_SCOPES`."""
    for scope in LIST_SCOPES:
        if value == scope:
            return scope
    raise InvalidInput(f"scope: {value[:32]!r} is not one of {', '.join(LIST_SCOPES)}")


def list_agents(
    scope: str = "both",
    *,
    capabilities: bool = False,
    home: Path | None = None,
    cwd: Path | None = None,
) -> tuple[list[dict[str, Any]], dict[Path, str]]:
    """The agents of ``scope`` as JSON objects (sorted by name), and the files skipped (why).

    ``both`` (the default) is every agent that resolves from ``cwd`` — the project over the user
    over pisub's shipped ones. ``user``, ``project``, ``builtin``: that scope's agents, an
    overridden one marked ``"shadowed": true``. ``capabilities`` adds each agent's
    ``capabilities`` (:func:`capabilities_of`); no system prompt is ever in the listing.

    Raises:
        InvalidInput: an unknown scope. HomeUnusable.
    """
    from pisub.api.client import agent_catalog

    chosen = list_scope(scope)
    where = Path(cwd or os.getcwd()).resolve()
    catalog = agent_catalog(home=home, cwd=where)
    shown: list[tuple[Agent, bool]] = [(a, False) for a in catalog.agents.values()]
    if chosen != "both":
        shown = [(a, False) for a in catalog.agents.values() if a.scope == chosen]
        shown += [(a, True) for a in catalog.shadowed if a.scope == chosen]
    rows = []
    for agent, shadowed in sorted(shown, key=lambda pair: (pair[0].name, pair[1])):
        row = agent_row(agent, catalog)
        if shadowed:
            row["shadowed"] = True
        if capabilities:
            row["capabilities"] = capabilities_of(agent, where, home=home)
        rows.append(row)
    return rows, catalog.problems


def agent_row(agent: Agent, catalog: Catalog) -> dict[str, Any]:
    """``{name, description, runner, scope, path, source, aliases, ignored}`` (``refined`` when
    the project has an overlay for it, ``shadowsBuiltin`` when it takes the name of an agent
    pisub ships)."""
    row: dict[str, Any] = {
        "name": agent.name,
        "description": agent.frontmatter.description,
        "runner": agent.effective.runner,
        "scope": agent.scope,
        "path": str(agent.path),
        "source": agent.dialect,
        "aliases": list(agent.effective.aliases),
        "ignored": [{"key": i.key, "reason": i.reason} for i in agent.effective.ignored],
    }
    if agent.frontmatter.disabled:
        row["disabled"] = True
    if agent.refinement:
        row["refined"] = True
    if agent.scope != "builtin" and any(
        a.scope == "builtin" and a.name == agent.name for a in catalog.shadowed
    ):
        row["shadowsBuiltin"] = True
    return row


def capabilities_of(agent: Agent, cwd: Path, *, home: Path | None = None) -> dict[str, Any]:
    """``{tools, models, timeouts, runner: {type, command, available, unavailableReason},
    ceilings}`` — what the agent declares (or gets by default) and whether its command is found
    by a passive lookup (PATH, ``X_OK``; nothing is run: a launch's own checks stay the
    authority)."""
    fm, eff = agent.frontmatter, agent.effective
    pi = eff.runner == "pi"
    return {
        "tools": {
            "allow": eff.tools if pi else None,
            "default": pi and eff.tools is None,
            "extensions": eff.extensions if pi else None,
            "skills": eff.skills if pi else None,
        },
        "models": {
            "model": fm.model,
            "thinking": fm.thinking,
            "fallbackModels": _fallbacks(agent),
        },
        "timeouts": _timeouts(agent, home),
        "runner": _runner(agent, cwd),
        "ceilings": _ceilings(agent),
    }


def _fallbacks(agent: Agent) -> list[str]:
    from pisub.agents.seedkeys import comma_list

    try:
        return comma_list(agent.frontmatter.fallback_models, "fallbackModels") or []
    except InvalidInput:
        return []


def _timeouts(agent: Agent, home: Path | None) -> dict[str, Any]:
    """The agent's limits, with the config file's where the agent sets none (seconds)."""
    from msgspec import to_builtins

    from pisub.protocol.manifest import Limits, LimitValues
    from pisub.store.config import config_limits, env_limits, load_config
    from pisub.store.paths import open_home

    declared = agent.limits()
    try:
        root = open_home(home, create=False).root
        limits = Limits.resolve(
            (LimitValues(), "the call"),
            (declared, str(agent.path)),
            (config_limits(load_config(root)), "config"),
            (env_limits(), "environment"),
        )
        effective: Any = to_builtins(limits)
    except PisubError as exc:
        effective = {"error": str(exc)[:MAX_REASON]}
    return {"declared": to_builtins(declared), "effective": effective}


def _runner(agent: Agent, cwd: Path) -> dict[str, Any]:
    from pisub.errors import LaunchFailed

    eff = agent.effective
    command = eff.command
    reason = None
    try:
        if eff.runner == "pi":
            from pisub.children.pi.rpc import find_pi

            command = find_pi()
        else:
            from pisub.runs.launch import check_command

            check_command(command, cwd)
    except (LaunchFailed, InvalidInput) as exc:
        reason = " ".join(str(exc).split())[:MAX_REASON]
    return {
        "type": eff.runner,
        "command": command if eff.runner == "pi" else eff.command,
        "args": list(eff.args),
        "available": reason is None,
        "unavailableReason": reason,
    }


def _ceilings(agent: Agent) -> dict[str, Any]:
    """Whether a launch from here may start this agent: not disabled, not past the depth limit."""
    from pisub.store.lineage import caller_lineage

    why = None
    depth = limit = None
    try:
        lineage = caller_lineage(os.environ)
        depth, limit = lineage.depth, lineage.max_depth
    except PisubError as exc:
        why = str(exc)[:MAX_REASON]
    if why is None and agent.frontmatter.disabled:
        why = f"agent {agent.name!r} is disabled (pisub agents enable {agent.name})"
    return {
        "depth": depth,
        "depthLimit": limit,
        "agentMaxDepth": agent.effective.max_depth,
        "allowed": why is None,
        "reason": why,
    }


def _project(cwd: Path | None) -> Path:
    from pisub.agents.catalog import project_root

    return project_root(Path(cwd or os.getcwd()).resolve())


def _agent_name(name: str, home: Path | None, cwd: Path | None) -> str:
    """The runtime name of ``name`` (an alias resolves); ``name`` itself when no agent has it
    but the project holds an overlay of that name (to show or roll back after a removal).

    Raises:
        UnknownAgent.
    """
    from pisub.agents import refine as rf
    from pisub.api.client import agent_catalog
    from pisub.errors import UnknownAgent

    catalog = agent_catalog(home=home, cwd=cwd)
    try:
        return catalog.get(name).name
    except UnknownAgent:
        if rf.current(_project(cwd), name) is not None:
            return name
        raise


def _overlay_of(name: str, home: Path | None, cwd: Path | None) -> tuple[str, Path, str]:
    """The agent's runtime name, the project, and the path of its overlay file."""
    from pisub.agents import refine as rf

    agent = _agent_name(name, home, cwd)
    project = _project(cwd)
    return agent, project, str(rf.folder(project) / f"{agent}.md")


def refine(
    name: str, config: dict[str, Any], *, home: Path | None = None, cwd: Path | None = None
) -> dict[str, Any]:
    """Give agent ``name`` a new revision of the project's overlay: ``config`` is
    ``{"guidance": TEXT, "reason"?: TEXT}``. The revision as JSON (with its ``path``).

    Raises:
        InvalidInput: a bad config (the key named), a symlinked overlay folder.
        UnknownAgent: no such agent here. StorageError.
    """
    from pisub.agents import refine as rf

    guidance, reason = rf.check_config(config)
    agent, project, where = _overlay_of(name, home, cwd)
    return {**rf.refine(project, agent, guidance, reason).as_json(), "path": where}


def refine_show(name: str, *, home: Path | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """``{agent, path, current, history}``: the overlay in force (or null) and every revision,
    oldest first."""
    from pisub.agents import refine as rf

    agent, project, where = _overlay_of(name, home, cwd)
    now = rf.current(project, agent)
    history = [r.as_json() for r in rf.history(project, agent)]
    return {"agent": agent, "path": where, "current": now.as_json() if now else None, "history": history}


def refine_rollback(name: str, *, home: Path | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """Put back the guidance before the current revision: ``{agent, path, current}`` (``current``
    null when the overlay is gone).

    Raises:
        InvalidInput: no overlay to roll back. UnknownAgent.
    """
    from pisub.agents import refine as rf

    agent, project, where = _overlay_of(name, home, cwd)
    rev = rf.rollback(project, agent)
    return {"agent": agent, "path": where, "current": rev.as_json() if rev else None}


def first_launch_warnings(run: Any, home: Path | None = None) -> list[str]:
    """The lines to show once for a run just started: the keys its agent file sets that pisub
    does not act on (recorded in its manifest's ``agent.ignored``), a review gate's reviewer
    that is not the one pisub ships, and a refinement overlay of its agent that is not used —
    each the first time this version of that file is launched from this home (a marker under
    ``<home>/cache/agent-warnings``)."""
    try:
        manifest = run.manifest()
    except (PisubError, OSError):
        return []
    agent = manifest.agent
    lines: list[str] = []
    if agent.ignored:
        listed = "; ".join(f"{i.key}: {i.reason}" for i in agent.ignored)
        head = f"pisub: agent {agent.name!r} ({agent.source}) sets keys pisub does not act on (shown once):"
        lines += _once(
            home,
            f"{agent.source}\n{listed}",
            [head, *(f"pisub:   {i.key}: {i.reason}" for i in agent.ignored)],
        )
    reviewer = reviewer_notice(manifest)
    if reviewer is not None:
        lines += _once(home, f"reviewer\n{reviewer}", [reviewer])
    overlay = overlay_notice(agent.name, Path(manifest.cwd))
    if overlay is not None:
        lines += _once(home, f"overlay\n{overlay[1]}\n{overlay[0]}", [overlay[0]])
    return lines


def _once(home: Path | None, key: str, lines: list[str]) -> list[str]:
    """``lines`` unless a marker says they were shown for ``key`` from this home (then none)."""
    import hashlib

    from pisub.core.fsio import atomic_write
    from pisub.store.paths import open_home

    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
    try:
        marker = open_home(home, create=False).cache / "agent-warnings" / digest[:32]
    except PisubError:
        return lines
    if marker.exists():
        return []
    try:
        marker.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(marker, b"", durable=False)
    except OSError:
        pass  # a warning shown again is better than none
    return lines


def reviewer_notice(manifest: Any) -> str | None:
    """A line when the run's review gate runs a reviewer other than the one pisub ships (say, a
    project's ``.pi/agents/reviewer.md``), naming its file and whether its tools are limited;
    the text of the file taken at launch makes the line differ for each version."""
    import hashlib

    taken = manifest.acceptance.reviewer if manifest.acceptance is not None else None
    if taken is None or taken.scope == "builtin":
        return None
    digest = hashlib.sha256(taken.text.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return (
        f"pisub: note: this run's review gate runs the reviewer in {taken.path} ({taken.scope} scope, "
        f"sha256 {digest}), not the one pisub ships (tools read, grep, find, ls); {_tools_of(taken)} "
        "(shown once)"
    )


def _tools_of(taken: Any) -> str:
    from pisub.agents.catalog import parse_agent

    try:
        agent = parse_agent(taken.text, Path(taken.path), "project")
    except (PisubError, RecursionError):
        return "its file no longer parses"
    return reviewer_tools(agent)


def reviewer_tools(agent: Agent) -> str:
    """What a reviewer other than pisub's may do: its command, its tools, or pi's default ones
    (a reviewer without ``tools`` gets what pi-subagents gives it: pi's default tools)."""
    eff = agent.effective
    if eff.runner != "pi":
        return f"it runs {eff.command!r} (external-cli)"
    if eff.tools is None:
        return "it sets no tools, so it gets pi's default tools and can change files"
    return f"its tools: {', '.join(eff.tools) or '(none)'}"


def overlay_notice(name: str, cwd: Path) -> tuple[str, str] | None:
    """A line when the project's refinement overlay of agent ``name`` exists but is not used
    (why), and the version of that file (its device, inode, size and change time), or None."""
    from pisub.agents import refine as rf
    from pisub.agents.catalog import project_root

    _, broken = rf.overlays(project_root(cwd), [name])
    for path, why in broken.items():
        try:
            st = os.lstat(path)
            version = f"{path}\n{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}-{st.st_ctime_ns}"
        except OSError:
            version = f"{path}\ngone"
        text = " ".join(f"{path}: {why}".split())[:500]
        return f"pisub: warning: the refinement overlay {text} — not used (shown once)", version
    return None


def shadow_warning(path: Path) -> str | None:
    """A line when the agent file just written takes the name of an agent pisub ships (the
    seed's ``create`` warns of builtin shadowing): ``reviewer`` is the one review gates run."""
    from pisub.agents.files import shipped_names

    name = path.stem
    if name not in shipped_names():
        return None
    gates = " (review gates run the agent named reviewer)" if name == "reviewer" else ""
    return f"pisub: note: {path} overrides the agent pisub ships as {name!r}{gates}"
