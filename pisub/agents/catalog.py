"""Agent definitions: Markdown files with a YAML frontmatter header.

User scope is ``<home>/agents/*.md``; project scope is ``.pisub/agents/*.md`` in the
working directory or its git root. On a name clash the project wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pisub.core.fsio import read_bytes
from pisub.errors import InvalidInput, PisubError, UnknownAgent
from pisub.protocol.agent import AgentFrontmatter
from pisub.protocol.codec import convert
from pisub.protocol.manifest import AgentSpec, LimitValues, seconds_of_ms

Scope = Literal["builtin", "user", "project"]

SHIPPED_DIR = Path(__file__).parent / "builtin"
"""The agents pisub ships (scope ``builtin``: every other scope wins over them)."""
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_AGENT_FILE = 1024 * 1024


@dataclass(frozen=True)
class Agent:
    """One agent definition and where it came from."""

    frontmatter: AgentFrontmatter
    system_prompt: str
    path: Path
    scope: Scope

    @property
    def name(self) -> str:
        """The runtime name: ``package.name`` when the agent has a package."""
        fm = self.frontmatter
        return f"{fm.package}.{fm.name}" if fm.package else fm.name

    def limits(self) -> LimitValues:
        """The limits this agent file sets (each may be absent)."""
        return limits_of(self.frontmatter)

    def spec(self) -> AgentSpec:
        """The snapshot of this agent that goes into a run's manifest."""
        fm = self.frontmatter
        return AgentSpec(
            name=self.name,
            description=fm.description,
            runner=fm.runner,
            command=fm.command,
            args=list(fm.args),
            system_prompt=self.system_prompt,
            source=str(self.path),
            model=fm.model,
            tools=list(fm.tools) if fm.tools is not None else None,
            thinking=fm.thinking,
            extensions=fm.extensions,
            skills=fm.skills,
            prompt_templates=fm.prompt_templates,
            trust_project=fm.trust_project,
            max_depth=fm.max_depth,
        )


@dataclass
class Catalog:
    """Every agent found, and the files that could not be read (with why)."""

    agents: dict[str, Agent] = field(default_factory=dict)
    problems: dict[Path, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    """Alias → runtime name."""

    def get(self, name: str) -> Agent:
        """The agent called ``name``.

        Raises:
            UnknownAgent: listing the names that exist.
        """
        if name in self.agents:
            return self.agents[name]
        if name in self.aliases and self.aliases[name] in self.agents:
            return self.agents[self.aliases[name]]
        available = ", ".join(sorted(self.agents)) or "(none)"
        broken = [f"{path}: {why}" for path, why in self.problems.items() if path.stem == name]
        hint = f" (unreadable: {'; '.join(broken)})" if broken else ""
        raise UnknownAgent(f"Unknown agent: {name}. Available agents: {available}{hint}")


def parse_agent(text: str, path: Path, scope: Scope = "user") -> Agent:
    """Parse an agent file's text.

    Raises:
        InvalidInput: no frontmatter, bad YAML, unknown or mistyped keys, a bad name,
            or an external-cli agent without ``command``.
    """
    import yaml

    if not text.startswith("---"):
        raise InvalidInput(f"{path}: no YAML frontmatter (the file must start with '---')")
    parts = re.split(r"^---[ \t]*$", text, maxsplit=2, flags=re.MULTILINE)
    if len(parts) < 3:
        raise InvalidInput(f"{path}: the frontmatter has no closing '---' line")
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data: Any = yaml.load(parts[1], Loader=loader)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{path}: frontmatter is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: frontmatter must be a mapping of keys to values")
    try:
        fm = convert(data, AgentFrontmatter, str(path))
    except PisubError as exc:
        raise InvalidInput(str(exc)) from exc
    _check(fm, path)
    return Agent(frontmatter=fm, system_prompt=parts[2].strip("\n"), path=path, scope=scope)


def _check(fm: AgentFrontmatter, path: Path) -> None:
    for what, value in [
        ("name", fm.name),
        ("package", fm.package),
        *(("aliases", a) for a in fm.aliases or []),
    ]:
        if value is not None and not NAME_RE.fullmatch(value):
            raise InvalidInput(f"{path}: agent {what} {value!r} must match {NAME_RE.pattern}")
    if fm.runner == "external-cli" and not fm.command:
        raise InvalidInput(f"{path}: an external-cli agent needs a 'command'")
    if fm.runner == "external-cli":
        pi_only = [k for k in ("model", "tools", "thinking") if getattr(fm, k) is not None]
        pi_only += [
            camel
            for k, camel in (
                ("tool_timeout_ms", "toolTimeoutMs"),
                ("checkpoint_before_deadline_ms", "checkpointBeforeDeadlineMs"),
                ("tool_budget", "toolBudget"),
            )
            if getattr(fm, k) is not None
        ]
        pi_only += ["trustProject"] if fm.trust_project else []
        if pi_only:
            raise InvalidInput(f"{path}: {', '.join(pi_only)} only apply to runner: pi")
    limits_of(fm).check(str(path))
    if any("\0" in arg for arg in [fm.command or "", *fm.args]):
        raise InvalidInput(f"{path}: command and args must not contain NUL bytes")


def limits_of(fm: AgentFrontmatter) -> LimitValues:
    return LimitValues(
        timeout=fm.timeout,
        idle_timeout=fm.idle_timeout,
        output_cap=fm.output_cap,
        output_hard_cap=fm.output_hard_cap,
        tool_timeout=seconds_of_ms(fm.tool_timeout_ms),
        checkpoint_before_deadline=seconds_of_ms(fm.checkpoint_before_deadline_ms),
        tool_budget=fm.tool_budget.budget() if fm.tool_budget is not None else None,
    )


def project_agent_dirs(cwd: Path) -> list[Path]:
    """``.pisub/agents`` of ``cwd`` and of its git root (cwd first), where they exist."""
    dirs = [cwd / ".pisub" / "agents"]
    for parent in [cwd, *cwd.parents]:
        if (parent / ".git").exists():
            if parent != cwd:
                dirs.append(parent / ".pisub" / "agents")
            break
    return [d for d in dirs if d.is_dir()]


def discover(user_dir: Path, cwd: Path) -> Catalog:
    """Every agent visible from ``cwd``; project agents override user agents, which override the
    agents pisub ships."""
    catalog = Catalog()
    scoped: list[tuple[Scope, Path]] = [("builtin", SHIPPED_DIR), ("user", user_dir)]
    # The git root comes before cwd so that the nearest project scope wins.
    scoped += [("project", d) for d in reversed(project_agent_dirs(cwd))]
    for scope, directory in scoped:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.md")):
            try:
                data = read_bytes(path, limit=MAX_AGENT_FILE)
                if len(data) > MAX_AGENT_FILE:
                    raise InvalidInput(f"{path}: larger than {MAX_AGENT_FILE} bytes")
                agent = parse_agent(data.decode("utf-8"), path, scope)
            except OSError as exc:
                catalog.problems[path] = f"cannot read: {exc.strerror or exc}"
                continue
            except (UnicodeDecodeError, RecursionError, InvalidInput) as exc:
                why = str(exc) if isinstance(exc, InvalidInput) else f"{type(exc).__name__}: {exc}"
                catalog.problems[path] = " ".join(why.split())  # one line, whatever YAML said
                continue
            catalog.agents[agent.name] = agent
    for agent in catalog.agents.values():
        for alias in agent.frontmatter.aliases or []:
            if alias not in catalog.agents:
                catalog.aliases[alias] = agent.name
    return catalog
