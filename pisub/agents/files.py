"""Writing agent files: create, update, delete, disable/enable, and ejecting (or resetting) an
agent shipped with pisub (scope ``builtin``) into a scope for editing.

Every write is checked first (the new file must parse as an agent, strictly), made atomically
under the scope directory's lock, and refuses to replace a file it did not expect: an update or
delete names the file's SHA-256 it read (or reads it itself and checks it again under the lock),
and a file that changed since is an :class:`~pisub.errors.AgentConflict`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pisub.agents.catalog import NAME_RE, SHIPPED_DIR, Agent, parse_agent
from pisub.agents.seedkeys import Dialect
from pisub.errors import AgentConflict, InvalidInput, UnknownAgent, storage_error

Scope = Literal["user", "project"]
"""The scopes pisub writes (the shipped agents are read-only: eject one to edit it)."""
SCOPES: tuple[Scope, ...] = ("user", "project")
LOCKS = ".locks"
"""The folder of ``<home>/agents`` that holds the lock of every agent folder pisub writes (one per
folder, named by its device and inode): never a file in a repository (a stray lock there makes the
tree dirty, and ``--isolation worktree`` refuses a dirty tree)."""
COMMA_KEYS = frozenset(
    {"tools", "excludeTools", "aliases", "fallbackModels", "extensions", "subagentOnlyExtensions"}
    | {"skillPath", "skills", "skill", "reads", "defaultReads"}
)
"""Keys pi-subagents reads as a comma string: a list of names is written so in pi's folders."""
MAX_AGENT_BYTES = 256 * 1024
PROMPT_KEY = "systemPrompt"
UNCHANGEABLE = ("name", "package", "scope")
_SEED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 \t_-]{0,127}")
"""A display name the seed's ``create`` normalises (``Code Scout``); never a path."""


@dataclass(frozen=True)
class AgentFile:
    """An agent file as read: where, its bytes' SHA-256, and the agent."""

    scope: Scope
    path: Path
    sha256: str
    agent: Agent


def as_scope(scope: str) -> Scope:
    """Raises: InvalidInput: not user or project."""
    if scope == "user":
        return "user"
    if scope == "project":
        return "project"
    raise InvalidInput(f"scope: {scope[:32]!r} is not user or project")


def scope_dir(agents_home: Path, scope: str, cwd: Path) -> Path:
    """Where a scope's agent files are: ``<home>/agents`` (user) or ``.pisub/agents`` of the git
    root of ``cwd``, else of ``cwd`` (project).

    Raises:
        InvalidInput: an unknown scope.
    """
    if as_scope(scope) == "user":
        return agents_home
    root = next((p for p in [cwd, *cwd.parents] if (p / ".git").exists()), cwd)
    return root / ".pisub" / "agents"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.md"))


def find(agents_home: Path, cwd: Path, ref: str, scope: str | None = None) -> AgentFile:
    """The file of the agent called ``ref`` (runtime name or alias) — in ``scope``, or in the
    one scope that has it. pi's agent folders count (``~/.pi/agent/agents``, ``.pi/agents``,
    ``.agents``): in a scope, the file that wins at launch is the one edited.

    Raises:
        UnknownAgent: no such agent there. InvalidInput: it is in both scopes and none was named.
    """
    found: list[AgentFile] = []
    broken: list[Path] = []
    for each in SCOPES if scope is None else (as_scope(scope),):
        winner: AgentFile | None = None
        for directory, dialect, recursive in _scope_roots(agents_home, each, cwd):
            match = _match(directory, dialect, recursive, each, ref, broken)
            winner = match or winner  # a later folder wins, as at launch
        found += [winner] if winner else []
    if not found:
        where = f" in the {scope} scope" if scope else ""
        if broken:
            raise InvalidInput(
                f"{broken[0]} cannot be read as an agent (pisub agents list says why): fix or remove it"
            )
        raise UnknownAgent(f"no agent file for {ref[:128]!r}{where}")
    if len(found) > 1:
        raise InvalidInput(f"agent {ref!r} is in both scopes: give the scope (user or project)")
    return found[0]


def _scope_roots(agents_home: Path, scope: Scope, cwd: Path) -> list[tuple[Path, Dialect, bool]]:
    """The folders of a scope, lowest first, how their files read, and whether each is
    searched recursively."""
    from pisub.agents.catalog import roots

    listed = [(d, dialect, deep) for s, d, dialect, deep in roots(agents_home, cwd) if s == scope]
    if scope == "project":
        # The git root's .pisub/agents is the one pisub writes: it is searched even before it exists.
        main = scope_dir(agents_home, scope, cwd)
        listed = [entry for entry in listed if entry[0] != main] + [(main, "pisub", False)]
    return listed


def _match(
    directory: Path, dialect: Dialect, recursive: bool, scope: Scope, ref: str, broken: list[Path]
) -> AgentFile | None:
    """The one file in ``directory`` named ``ref`` (else the one with that alias).

    Raises:
        InvalidInput: several are.
    """
    from pisub.agents.walk import agent_files

    named: list[AgentFile] = []
    aliased: list[AgentFile] = []
    files, _ = agent_files(directory, recursive=recursive, follow_root=scope != "project")
    for path in files:
        try:
            entry = read(path, scope, dialect)
        except (OSError, InvalidInput):
            broken += [path] if path.stem == ref else []
            continue
        if ref == entry.agent.name:
            named.append(entry)
        elif ref in entry.agent.effective.aliases:
            aliased.append(entry)
    found = named or aliased  # a real name wins over an alias
    if len(found) > 1:
        paths = ", ".join(str(f.path) for f in found[:4])
        kind = "are named" if named else "have the alias"
        raise InvalidInput(f"several agent files {kind} {ref!r} in the {scope} scope: {paths}")
    return found[0] if found else None


def read(path: Path, scope: Scope, dialect: Dialect | None = None) -> AgentFile:
    """Raises: OSError, InvalidInput (not an agent file)."""
    from pisub.core.fsio import read_bytes

    data = read_bytes(path, limit=MAX_AGENT_BYTES)
    if len(data) > MAX_AGENT_BYTES:
        raise InvalidInput(f"{path}: larger than {MAX_AGENT_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path}: not UTF-8 ({exc})") from None
    agent = parse_agent(text, path, scope, dialect)
    return AgentFile(scope, path, hashlib.sha256(data).hexdigest(), agent)


def create(agents_home: Path, cwd: Path, config: dict[str, Any]) -> AgentFile:
    """A new agent file from ``config`` (frontmatter keys in camelCase, ``scope``,
    ``systemPrompt``); false or "" leaves an optional key out.

    Raises:
        InvalidInput: a bad key or value (named). AgentConflict: the agent exists in that scope.
    """
    config = dict(config)
    scope = as_scope(str(config.pop("scope", "user")))
    prompt = _prompt(config.pop(PROMPT_KEY, ""))
    fields = {k: v for k, v in config.items() if v is not False and v != ""}
    _seed_defaults(fields)
    name, package = fields.get("name"), fields.get("package")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidInput(f"config.name: give the agent's name ({NAME_RE.pattern})")
    if package is not None and (not isinstance(package, str) or not NAME_RE.fullmatch(package)):
        raise InvalidInput(f"config.package: must match {NAME_RE.pattern}")
    directory = scope_dir(agents_home, scope, cwd)
    path = directory / f"{package + '.' if package else ''}{name}.md"
    text = _render(fields, _body(prompt), "pisub")
    parse_agent(text, path, scope, "pisub")
    with _locked(agents_home, directory):
        if os.path.lexists(path):
            raise AgentConflict(f"{path} exists already: update it, or delete it first")
        _write(path, text)
    return read(path, scope, "pisub")


def _seed_defaults(fields: dict[str, Any]) -> None:
    """The seed's ``create``: a config without ``runner`` or ``command`` makes a pi agent, and
    a name such as ``Code Scout`` is normalised as pi-subagents does (``code-scout``)."""
    from pisub.agents.seedkeys import normalise_name

    if "runner" not in fields and "command" not in fields:
        fields["runner"] = "pi"
    for key in ("name", "package"):
        value = fields.get(key)
        if isinstance(value, str) and not NAME_RE.fullmatch(value) and _SEED_NAME.fullmatch(value):
            fields[key] = normalise_name(value)


def update(
    agents_home: Path,
    cwd: Path,
    ref: str,
    config: dict[str, Any],
    *,
    scope: str | None = None,
    expect: str | None = None,
) -> AgentFile:
    """Change the agent's keys (``false`` or ``""`` clears one) and/or its ``systemPrompt``.

    Raises:
        InvalidInput: a bad key or value, or a change of name, package or scope.
        AgentConflict: the file is not the one ``expect`` names, or changed meanwhile.
    """
    import yaml

    current = find(agents_home, cwd, ref, scope)
    _expect(current, expect)
    for key in UNCHANGEABLE:
        if key in config:
            raise InvalidInput(f"config.{key}: cannot change; create a new agent and delete this one")
    head, body = _split(current.path.read_text(encoding="utf-8"))
    fields = dict(yaml.safe_load(head) or {})
    for key, value in config.items():
        if key == PROMPT_KEY:
            body = _body(_prompt(value))
        elif value is False or value == "":
            fields.pop(key, None)
        else:
            fields[key] = value
    return _replace(agents_home, current, _render(fields, body, current.agent.dialect))


def delete(
    agents_home: Path, cwd: Path, ref: str, *, scope: str | None = None, expect: str | None = None
) -> Path:
    """Raises: UnknownAgent, AgentConflict (as :func:`update`)."""
    current = find(agents_home, cwd, ref, scope)
    _expect(current, expect)
    with _locked(agents_home, current.path.parent):
        _check_unchanged(current)
        try:
            os.unlink(current.path)
        except OSError as exc:
            raise storage_error(exc, "delete the agent file", current.path) from exc
    return current.path


def set_disabled(
    agents_home: Path, cwd: Path, ref: str, disabled: bool, *, scope: str | None = None
) -> AgentFile:
    return update(agents_home, cwd, ref, {"disabled": bool(disabled)}, scope=scope)


def eject(agents_home: Path, cwd: Path, name: str, scope_name: str = "user") -> AgentFile:
    """Copy the shipped agent ``name`` into ``scope`` for editing.

    Raises:
        UnknownAgent: pisub ships no such agent. AgentConflict: the scope has it already.
    """
    text = _shipped(name)
    scope = as_scope(scope_name)
    directory = scope_dir(agents_home, scope, cwd)
    path = directory / f"{name}.md"
    with _locked(agents_home, directory):
        if os.path.lexists(path):
            raise AgentConflict(
                f"{path} exists already: `pisub agents reset {name}` restores the shipped one"
            )
        _write(path, text)
    return read(path, scope, "pisub")


def reset(agents_home: Path, cwd: Path, name: str, *, scope: str | None = None) -> AgentFile:
    """Put the shipped definition of ``name`` back over its copy in a scope.

    Raises:
        UnknownAgent: pisub ships no such agent, or no scope has a copy. AgentConflict.
    """
    text = _shipped(name)
    return _replace(agents_home, find(agents_home, cwd, name, scope), text)


def _shipped(name: str) -> str:
    if name not in shipped_names():
        raise UnknownAgent(f"pisub ships no agent {name[:128]!r} (shipped: {', '.join(shipped_names())})")
    return (SHIPPED_DIR / f"{name}.md").read_text(encoding="utf-8")


def _replace(agents_home: Path, current: AgentFile, text: str) -> AgentFile:
    dialect = current.agent.dialect
    parse_agent(text, current.path, current.scope, dialect)
    with _locked(agents_home, current.path.parent):
        _check_unchanged(current)
        _write(current.path, text)
    return read(current.path, current.scope, dialect)


def _expect(current: AgentFile, expect: str | None) -> None:
    if expect is not None and expect != current.sha256:
        raise AgentConflict(
            f"{current.path} is not the version you read (sha256 {current.sha256[:12]}…); read it again"
        )


def _check_unchanged(current: AgentFile) -> None:
    try:
        now = read(current.path, current.scope, current.agent.dialect).sha256
    except (OSError, InvalidInput):
        now = None
    if now != current.sha256:
        raise AgentConflict(f"{current.path} changed while it was being updated; read it again and retry")


def _prompt(value: object) -> str:
    if value is False or value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput(f"config.{PROMPT_KEY}: give a string")
    return value


def _split(text: str) -> tuple[str, str]:
    """The frontmatter and the body exactly as written (after the closing line)."""
    parts = re.split(r"^---[ \t]*$", text, maxsplit=2, flags=re.MULTILINE)
    if len(parts) < 3:
        raise InvalidInput("the agent file has no frontmatter")
    return parts[1], parts[2].removeprefix("\n")


def _body(prompt: str) -> str:
    return f"{prompt.strip()}\n"


def _render(fields: dict[str, Any], body: str, dialect: Dialect) -> str:
    """Block style, one ``key: value`` a line (pi-subagents reads its frontmatter line by line,
    ``^([\\w-]+):\\s*(.*)$``); in pi's folders a list of names is the seed's comma string."""
    head = "".join(_line(key, value, dialect) for key, value in fields.items())
    return f"---\n{head}---\n{body}"


def _line(key: str, value: Any, dialect: Dialect) -> str:
    """One line: a plain YAML scalar, else JSON (valid YAML, escapes kept on one line)."""
    import json

    import yaml

    if value is None:
        return f"{key}:\n"
    names = isinstance(value, list) and all(isinstance(v, str) and "," not in v for v in value)
    if dialect == "pi" and key in COMMA_KEYS and names:
        value = ", ".join(value)
    if not isinstance(value, (dict, list)):
        text = yaml.safe_dump({key: value}, allow_unicode=True, default_flow_style=False, width=float("inf"))
        if len(text.splitlines()) == 1:
            return text
    return f"{key}: {json.dumps(value)}\n"


@contextmanager
def _locked(agents_home: Path, directory: Path) -> Iterator[None]:
    """The agent folder (created 0700), locked for a write by a lock file in pisub's own
    ``<home>/agents/.locks`` named by the folder's device and inode (:data:`LOCKS`)."""
    from pisub.core.locks import exclusive

    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(directory)
        locks = agents_home / LOCKS
        locks.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise storage_error(exc, "create the agents directory", directory) from exc
    with exclusive(locks / f"{st.st_dev}-{st.st_ino}.lock", timeout=10):
        yield


def _write(path: Path, text: str) -> None:
    from pisub.core.fsio import atomic_write

    try:
        atomic_write(path, text.encode("utf-8"))
    except OSError as exc:
        raise storage_error(exc, "write the agent file", path) from exc
