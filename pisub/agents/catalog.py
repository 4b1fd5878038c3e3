"""Agent definitions: Markdown files with a YAML frontmatter header.

Scopes, lowest first (a later one wins a name):

* ``builtin``: the agents pisub ships;
* ``user``: pi's ``$PI_CODING_AGENT_DIR/agents/**`` (default ``~/.pi/agent/agents``), then
  pisub's ``<home>/agents/*.md``;
* ``project``: the nearest ``.agents/**`` (legacy), then ``.pi/agents/**``, found from the
  working directory up to its git root; then ``.pisub/agents/*.md`` of the git root, then of the
  working directory.

Every directory is untrusted input (:mod:`pisub.agents.walk`): a file that cannot be an agent is
skipped with the reason in :attr:`Catalog.problems`, never an error of the whole listing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from pisub.agents.seedkeys import Dialect, Effective, prepare, resolve
from pisub.core.fsio import read_bytes
from pisub.errors import InvalidInput, PisubError, UnknownAgent
from pisub.protocol.agent import AgentFrontmatter
from pisub.protocol.codec import convert
from pisub.protocol.manifest import AgentSpec, IgnoredKey, LimitValues, seconds_of_ms

Scope = Literal["builtin", "user", "project"]

SHIPPED_DIR = Path(__file__).parent / "builtin"
"""The agents pisub ships (scope ``builtin``: every other scope wins over them)."""
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_AGENT_FILE = 1024 * 1024
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class Agent(msgspec.Struct, frozen=True):
    """One agent definition and where it came from."""

    frontmatter: AgentFrontmatter
    system_prompt: str
    path: Path
    scope: Scope
    effective: Effective
    """What the frontmatter means once the seed's shapes and defaults are applied."""
    dialect: Dialect = "pisub"
    """``pi`` for a file found in pi's agent directories (pi-subagents' defaults apply)."""
    refinement: str | None = None
    """The project's refinement overlay for this agent (``pisub agents refine``), if any: the
    block appended to the system prompt at launch."""

    @property
    def name(self) -> str:
        """The runtime name: ``package.name`` when the agent has a package."""
        fm = self.frontmatter
        return f"{fm.package}.{fm.name}" if fm.package else fm.name

    def access(self) -> str:
        """What it may do, in words: its command (an external CLI), its tools, or pi's default
        ones (a pi agent without ``tools`` gets what pi-subagents gives it)."""
        eff = self.effective
        if eff.runner != "pi":
            return f"it runs {eff.command!r} (external-cli)"
        if eff.tools is None:
            return "it sets no tools, so it gets pi's default tools and can change files"
        return f"its tools: {', '.join(eff.tools) or '(none)'}"

    def limits(self) -> LimitValues:
        """The limits this agent file sets (each may be absent)."""
        return limits_of(self.frontmatter, self.effective)

    def spec(self) -> AgentSpec:
        """The snapshot of this agent that goes into a run's manifest."""
        fm, eff = self.frontmatter, self.effective
        pi = eff.runner == "pi"
        prompt = self.system_prompt
        if self.refinement:
            prompt = f"{prompt}\n\n{self.refinement}".strip("\n")
        return AgentSpec(
            name=self.name,
            description=fm.description,
            runner=eff.runner,
            command=eff.command,
            args=(["--no-context-files"] if pi and not eff.context_files else []) + list(eff.args),
            system_prompt=prompt,
            source=str(self.path),
            model=fm.model,
            tools=list(eff.tools) if eff.tools is not None else None,
            thinking=fm.thinking,
            extensions=eff.extensions,
            skills=eff.skills,
            prompt_templates=fm.prompt_templates,
            trust_project=fm.trust_project,
            max_depth=eff.max_depth,
            system_prompt_mode=eff.system_prompt_mode if pi else "append",
            ignored=[IgnoredKey(key=i.key, reason=i.reason) for i in eff.ignored],
        )


class Catalog(msgspec.Struct):
    """Every agent found, and the files that could not be read (with why)."""

    agents: dict[str, Agent] = msgspec.field(default_factory=dict)
    problems: dict[Path, str] = msgspec.field(default_factory=dict)
    aliases: dict[str, str] = msgspec.field(default_factory=dict)
    """Alias → runtime name."""
    shadowed: list[Agent] = msgspec.field(default_factory=list)
    """Agents a later scope (or a nearer folder) overrides, in the order found."""
    overlay_problems: dict[Path, str] = msgspec.field(default_factory=dict)
    """The refinement overlays of agents found that are not used, with why (also in
    :attr:`problems`)."""

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
        mean = did_you_mean(name, [*self.agents, *self.aliases])
        raise UnknownAgent(f"Unknown agent: {shown_name(name)}.{mean} Available agents: {available}{hint}")


MAX_SHOWN = 80
"""How much of an unknown name an error echoes."""


def shown_name(name: str) -> str:
    """An agent name from outside as an error shows it: at most :data:`MAX_SHOWN` characters
    (then ``…``), a newline as ``\\n``, any other control character or a byte that is not
    UTF-8 escaped (``\\x1b``, ``\\xff``), quoted when it was changed at all."""
    import re

    from pisub.termsafe import printable

    cut = name[:MAX_SHOWN]
    text = cut.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    text = re.sub("[\udc80-\udcff]", lambda m: f"\\x{ord(m[0]) - 0xDC00:02x}", text)
    text = printable(text, one_line=True)
    if text == name:
        return name
    return f"'{text}'" + ("…" if len(name) > MAX_SHOWN else "")


MAX_GUESSED = 256
"""A name longer than this gets no "did you mean" (no agent name is; difflib is quadratic)."""


def did_you_mean(name: str, names: list[str]) -> str:
    """`` Did you mean X?`` — the closest of ``names`` to a mistyped agent name — or ``""``."""
    import difflib

    if len(name) > MAX_GUESSED:
        return ""
    close = difflib.get_close_matches(name, sorted(set(names)), n=1, cutoff=0.6)
    if not close and name.lower() in {n.lower() for n in names}:
        close = [next(n for n in sorted(names) if n.lower() == name.lower())]
    return f" Did you mean {close[0]}?" if close else ""


def parse_agent(text: str, path: Path, scope: Scope = "user", dialect: Dialect | None = None) -> Agent:
    """Parse an agent file's text.

    Raises:
        InvalidInput: no frontmatter, bad YAML, unknown or mistyped keys, a bad name,
            or an external-cli agent without ``command``.
    """
    from pisub.agents.frontmatter import plain

    if not text.startswith("---"):
        raise InvalidInput(f"{path}: no YAML frontmatter (the file must start with '---')")
    parts = re.split(r"^---[ \t]*$", text, maxsplit=2, flags=re.MULTILINE)
    if len(parts) < 3:
        raise InvalidInput(f"{path}: the frontmatter has no closing '---' line")
    data: Any = plain(parts[1])  # the plain form, without importing YAML; else YAML reads it
    if data is None:
        import yaml

        try:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            data = yaml.load(parts[1], Loader=loader)
        except yaml.YAMLError as exc:
            raise InvalidInput(f"{path}: frontmatter is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: frontmatter must be a mapping of keys to values")
    dialect = dialect or dialect_of(path)
    try:
        fm = convert(prepare(data, path, dialect), AgentFrontmatter, str(path))
    except PisubError as exc:
        raise InvalidInput(str(exc)) from exc
    effective = resolve(fm, path, dialect)
    _check(fm, effective, path)
    return Agent(
        frontmatter=fm,
        system_prompt=parts[2].strip("\n"),
        path=path,
        scope=scope,
        effective=effective,
        dialect=dialect,
    )


def pi_agent_dir(env: Mapping[str, str] | None = None) -> Path:
    """pi's config directory: ``$PI_CODING_AGENT_DIR``, else ``~/.pi/agent``."""
    env = os.environ if env is None else env
    configured = env.get("PI_CODING_AGENT_DIR")
    return Path(configured) if configured else Path.home() / ".pi" / "agent"


def dialect_of(path: Path) -> Dialect:
    """``pi`` for a file below a ``.pi/agents``, ``.agents`` or ``.pi/agent/agents`` folder or
    pi's ``$PI_CODING_AGENT_DIR/agents``, else ``pisub`` (for a file whose folder is not known,
    such as a reviewer recorded at launch)."""
    user = pi_agent_dir() / "agents"
    for folder in path.parents:
        if folder.name == ".agents" or folder == user:
            return "pi"
        pi_parent = folder.parent.name == ".pi" or (
            folder.parent.name == "agent" and folder.parent.parent.name == ".pi"
        )
        if folder.name == "agents" and pi_parent:
            return "pi"
    return "pisub"


def _check(fm: AgentFrontmatter, eff: Effective, path: Path) -> None:
    for what, value in [
        ("name", fm.name),
        ("package", fm.package),
        *(("aliases", a) for a in eff.aliases),
    ]:
        if value is not None and not NAME_RE.fullmatch(value):
            raise InvalidInput(f"{path}: agent {what} {value!r} must match {NAME_RE.pattern}")
    if eff.runner == "external-cli" and not eff.command:
        raise InvalidInput(f"{path}: an external-cli agent needs a 'command'")
    if eff.runner == "external-cli":
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
    limits_of(fm, eff).check(str(path))
    bad_tool = next((t for t in eff.tools or [] if not _TOOL_NAME.fullmatch(t)), None)
    if bad_tool is not None:
        raise InvalidInput(f"{path}: tools: {bad_tool[:64]!r} is not a tool name ({_TOOL_NAME.pattern})")
    if any("\0" in arg for arg in [eff.command or "", *eff.args]):
        raise InvalidInput(f"{path}: command and args must not contain NUL bytes")


def limits_of(fm: AgentFrontmatter, eff: Effective) -> LimitValues:
    return LimitValues(
        timeout=eff.timeout,
        idle_timeout=fm.idle_timeout,
        output_cap=fm.output_cap,
        output_hard_cap=fm.output_hard_cap,
        tool_timeout=seconds_of_ms(fm.tool_timeout_ms),
        checkpoint_before_deadline=seconds_of_ms(fm.checkpoint_before_deadline_ms),
        tool_budget=fm.tool_budget.budget() if fm.tool_budget is not None else None,
    )


Root = tuple[Scope, Path, Dialect, bool]
"""A folder searched: its scope, where, how its files read, and whether it is pi's ``**``."""


def git_root(cwd: Path) -> Path | None:
    return next((p for p in [cwd, *cwd.parents] if (p / ".git").exists()), None)


def project_root(cwd: Path) -> Path:
    """The project of ``cwd``: its git root, else ``cwd`` itself."""
    return git_root(cwd) or cwd


def project_agent_dirs(cwd: Path) -> list[Path]:
    """``.pisub/agents`` of ``cwd`` and of its git root (cwd first), where they exist."""
    dirs = [cwd / ".pisub" / "agents"]
    root = git_root(cwd)
    if root is not None and root != cwd:
        dirs.append(root / ".pisub" / "agents")
    return [d for d in dirs if d.is_dir()]


def pi_project_dirs(cwd: Path) -> list[Path]:
    """The nearest folder from ``cwd`` up to its git root (only ``cwd`` outside a repository)
    that has ``.pi/agents`` or ``.agents``: its ``.agents`` (legacy) then ``.pi/agents``, those
    that exist (lowest first). Above the git root is not the project's: a ``.pi`` there is not
    read."""
    stop = git_root(cwd) or cwd
    for folder in [cwd, *cwd.parents]:
        found = [d for d in (folder / ".agents", folder / ".pi" / "agents") if os.path.lexists(d)]
        if found or folder == stop:
            return found
    return []


def roots(user_dir: Path, cwd: Path, pi_dir: Path | None = None) -> list[Root]:
    """Every folder searched, lowest first (a later one wins a name)."""
    pi_user = (pi_dir or pi_agent_dir()) / "agents"
    found: list[Root] = [("builtin", SHIPPED_DIR, "pisub", False), ("user", pi_user, "pi", True)]
    found.append(("user", user_dir, "pisub", False))
    found += [("project", d, "pi", True) for d in pi_project_dirs(cwd)]
    # The git root comes before cwd so that the nearest project scope wins.
    found += [("project", d, "pisub", False) for d in reversed(project_agent_dirs(cwd))]
    return found


def discover(user_dir: Path, cwd: Path, *, pi_dir: Path | None = None) -> Catalog:
    """Every agent visible from ``cwd``; project agents override user agents, which override the
    agents pisub ships (see the module's docstring for the folders, lowest first)."""
    from pisub.agents.refine import overlays
    from pisub.agents.walk import agent_files

    catalog = Catalog()
    for scope, directory, dialect, recursive in roots(user_dir, cwd, pi_dir):
        if (
            scope == "project"
            and directory.parent.name in (".pi", ".pisub")
            and directory.parent.is_symlink()
        ):
            catalog.problems[directory.parent] = "a symlink: a project's agent folder is not followed"
            continue
        files, problems = agent_files(directory, recursive=recursive, follow_root=scope != "project")
        catalog.problems.update(problems)
        here: dict[str, Path] = {}
        for path in files:
            agent = _load(path, scope, dialect, catalog.problems)
            if agent is None:
                continue
            if agent.name in here:
                catalog.problems[path] = f"{agent.name!r} is defined already in {here[agent.name]}: not used"
                continue
            here[agent.name] = path
            if agent.name in catalog.agents:
                catalog.shadowed.append(catalog.agents[agent.name])
            catalog.agents[agent.name] = agent
    refined, broken = overlays(project_root(cwd), list(catalog.agents))
    catalog.problems.update(broken)
    catalog.overlay_problems.update(broken)
    for name, block in refined.items():
        if name in catalog.agents:
            catalog.agents[name] = msgspec.structs.replace(catalog.agents[name], refinement=block)
    for agent in catalog.agents.values():
        for alias in agent.effective.aliases:
            if alias not in catalog.agents:
                catalog.aliases[alias] = agent.name
    return catalog


def _load(path: Path, scope: Scope, dialect: Dialect, problems: dict[Path, str]) -> Agent | None:
    try:
        data = read_bytes(path, limit=MAX_AGENT_FILE)
        if len(data) > MAX_AGENT_FILE:
            raise InvalidInput(f"{path}: larger than {MAX_AGENT_FILE} bytes")
        return parse_agent(data.decode("utf-8"), path, scope, dialect)
    except OSError as exc:
        problems[path] = f"cannot read: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:
        problems[path] = f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
    except (RecursionError, InvalidInput) as exc:
        why = str(exc) if isinstance(exc, InvalidInput) else f"{type(exc).__name__}: {exc}"
        problems[path] = " ".join(why.removeprefix(f"{path}: ").split())  # one line, whatever YAML said
    return None
