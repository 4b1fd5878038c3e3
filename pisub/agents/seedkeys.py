"""The keys and shapes of pi-subagents' agent files (the seed), read into what pisub runs.

A key pisub can honour is mapped onto pisub's own (comma strings become lists, the seed's
``runner:`` mapping becomes ``runner``/``command``/``args``, ``timeoutMs`` becomes ``timeout``,
``maxSubagentDepth`` lowers ``maxDepth``, ``systemPromptMode`` and ``inherit*`` choose pi's
prompt and context files). A key it cannot honour is kept as an :class:`Ignored` entry with one
line why: ``pisub agents show`` prints them, every launch records them in the manifest
(``agent.ignored``) and the first launch of each agent file version prints them once.

Files found in pi's agent directories (``~/.pi/agent/agents``, ``.pi/agents``, ``.agents``) are
read with pi-subagents' defaults (:data:`Dialect` ``pi``): ``runner: pi``, the name normalised
as pi-subagents does, the system prompt replacing pi's, no context files, no skills. Files in
pisub's own scopes keep pisub's defaults (``external-cli``, the prompt appended, context files
and skills as pi loads them).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import msgspec

from pisub.errors import InvalidInput
from pisub.protocol.agent import AgentFrontmatter, RunnerProfile
from pisub.protocol.manifest import AgentRunner

Dialect = Literal["pisub", "pi"]
PromptMode = Literal["append", "replace"]
MAX_LIST = 256
"""Entries a comma string or list may hold."""
NOT_LOADED = "pisub loads no extension an agent file names (only pi's discovery: extensions: true)"


class Ignored(msgspec.Struct, frozen=True):
    """A key pisub reads but does not act on, and why (one line)."""

    key: str
    reason: str


class Effective(msgspec.Struct, frozen=True):
    """What an agent file means to pisub once the seed's shapes and defaults are applied."""

    runner: AgentRunner
    command: str | None
    args: list[str]
    tools: list[str] | None
    aliases: list[str]
    extensions: bool
    skills: bool
    system_prompt_mode: PromptMode
    context_files: bool
    timeout: float | None
    max_depth: int | None
    ignored: list[Ignored] = msgspec.field(default_factory=list)


def normalise_name(value: str) -> str:
    """pi-subagents' name rule: lowercased, whitespace runs to ``-``, only ``[a-z0-9-]`` kept."""
    return re.sub(r"[^a-z0-9-]", "", re.sub(r"\s+", "-", value.strip().lower()))


def prepare(data: dict[str, Any], path: Path, dialect: Dialect) -> dict[str, Any]:
    """The raw frontmatter of a file in pi's agent directories with pi-subagents' name rules
    applied (the name defaults to the file's stem); ``tools:`` given empty means no tools."""
    if dialect != "pi":
        return data
    data = dict(data)
    for key in ("name", "package"):
        value = data.get(key, path.stem if key == "name" else None)
        if isinstance(value, str):
            _visible(value, key, path)
            data[key] = normalise_name(value)
            if not data[key]:
                raise InvalidInput(f"{path}: {key} {value[:64]!r} has no letter or digit left")
    if "tools" in data and data["tools"] is None:
        data["tools"] = []
    return data


def _visible(value: str, key: str, path: Path) -> None:
    """A name with an invisible or control character is refused, never normalised into another
    agent's name (``re\u200bviewer`` would become ``reviewer``).

    Raises:
        InvalidInput: :func:`pisub.termsafe.invisible_char` finds one.
    """
    from pisub.termsafe import invisible_char

    char = invisible_char(value)
    if char is not None:
        raise InvalidInput(
            f"{path}: {key} holds an invisible or control character (U+{ord(char):04X}): "
            "not used, so that it cannot pass for another agent's name"
        )


def comma_list(value: list[str] | str | bool | None, where: str) -> list[str] | None:
    """A list, or the seed's ``"a, b"`` (empty entries dropped); None for absent or false.

    Raises:
        InvalidInput: more than :data:`MAX_LIST` entries.
    """
    if value is None or value is False:
        return None
    if value is True:
        raise InvalidInput(f"{where}: give names, not true")
    items = value.split(",") if isinstance(value, str) else value
    out = [item.strip() for item in items if item.strip()]
    if len(out) > MAX_LIST:
        raise InvalidInput(f"{where}: more than {MAX_LIST} entries")
    return out


def resolve(fm: AgentFrontmatter, path: Path, dialect: Dialect) -> Effective:
    """Raises: InvalidInput (naming the key and the file)."""
    ignored: list[Ignored] = []
    runner, command, args = _runner(fm, path, dialect)
    pi = runner == "pi"
    tools = _tools(fm, path, ignored)
    aliases = [a for a in comma_list(fm.aliases, f"{path}: aliases") or [] if a != fm.name]
    mode, context_files, skills = _prompt_and_context(fm, path, dialect, ignored)
    timeout = fm.timeout
    if fm.timeout_ms is not None:
        if timeout is not None:
            raise InvalidInput(f"{path}: give timeout (seconds) or timeoutMs, not both")
        timeout = fm.timeout_ms / 1000
    depths = [d for d in (fm.max_depth, fm.max_subagent_depth) if d is not None]
    _extensions_ignored(fm, ignored)
    _unsupported(fm, ignored)
    if not pi:
        for key in ("systemPromptMode", "inheritProjectContext", "inheritGlobalContext", "inheritSkills"):
            if getattr(fm, _snake(key)) is not None:
                ignored.append(
                    Ignored(key, "applies to pi agents; an external-cli agent gets its prompt on stdin")
                )
    return Effective(
        runner=runner,
        command=command,
        args=args,
        tools=tools,
        aliases=aliases,
        extensions=fm.extensions is True,
        skills=skills,
        system_prompt_mode=mode,
        context_files=context_files,
        timeout=timeout,
        max_depth=min(depths) if depths else None,
        ignored=ignored,
    )


def _snake(key: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), key)


def _runner(fm: AgentFrontmatter, path: Path, dialect: Dialect) -> tuple[AgentRunner, str | None, list[str]]:
    profile = fm.runner
    if isinstance(profile, RunnerProfile):
        if profile.type == "external-job":
            raise InvalidInput(
                f"{path}: runner.type external-job needs a provider inside pi-subagents' host; "
                "pisub runs pi or an external-cli command"
            )
        if fm.command is not None or fm.args:
            raise InvalidInput(f"{path}: give command/args inside runner: or beside it, not both")
        return profile.type, profile.command, list(profile.args)
    default: AgentRunner = "pi" if dialect == "pi" else "external-cli"
    return profile or default, fm.command, list(fm.args)


def _tools(fm: AgentFrontmatter, path: Path, ignored: list[Ignored]) -> list[str] | None:
    tools = comma_list(fm.tools, f"{path}: tools")
    excluded = comma_list(fm.exclude_tools, f"{path}: excludeTools") or []
    if tools is None:
        if excluded:
            ignored.append(Ignored("excludeTools", "pi has no deny-list: list the tools to keep in tools"))
        return None
    mcp = [t for t in tools if t.startswith("mcp:")]
    paths = [t for t in tools if not t.startswith("mcp:") and ("/" in t or t.endswith((".ts", ".js")))]
    if mcp:
        ignored.append(
            Ignored("tools", f"{', '.join(mcp)}: direct MCP tools need pi-mcp-adapter in the parent")
        )
    if paths:
        ignored.append(Ignored("tools", f"{', '.join(paths)}: {NOT_LOADED}"))
    return [t for t in tools if t not in mcp and t not in paths and t not in excluded]


def _prompt_and_context(
    fm: AgentFrontmatter, path: Path, dialect: Dialect, ignored: list[Ignored]
) -> tuple[PromptMode, bool, bool]:
    seed = dialect == "pi"
    mode: PromptMode = fm.system_prompt_mode or ("replace" if seed else "append")
    project = fm.inherit_project_context if fm.inherit_project_context is not None else not seed
    global_ = fm.inherit_global_context if fm.inherit_global_context is not None else not seed
    if project and not global_:
        ignored.append(
            Ignored(
                "inheritGlobalContext",
                "pi loads the global context file with the project's: "
                "with inheritProjectContext both are kept",
            )
        )
    skills = fm.skills if isinstance(fm.skills, bool) else None
    if skills is not None and fm.inherit_skills is not None and skills != fm.inherit_skills:
        raise InvalidInput(f"{path}: skills: {skills} and inheritSkills: {fm.inherit_skills} disagree")
    chosen = skills if skills is not None else fm.inherit_skills
    return mode, project, bool(chosen) if chosen is not None else False


def _extensions_ignored(fm: AgentFrontmatter, ignored: list[Ignored]) -> None:
    if not isinstance(fm.extensions, bool) and comma_list(fm.extensions, "extensions"):
        ignored.append(Ignored("extensions", f"{NOT_LOADED}; these stay off"))
    for key, value in (("subagentOnlyExtensions", fm.subagent_only_extensions), ("skillPath", fm.skill_path)):
        if comma_list(value, key):
            ignored.append(Ignored(key, NOT_LOADED if key != "skillPath" else "pisub injects no skill files"))
    for key, names in (("skills", fm.skills), ("skill", fm.skill)):
        if not isinstance(names, bool) and comma_list(names, key):
            ignored.append(
                Ignored(key, "pisub injects no named skills; skills: true keeps pi's own skill discovery")
            )


_UNSUPPORTED: dict[str, str] = {
    "fallbackModels": "pisub does not retry on another model; resume a failed run with --model",
    "output": "the reply is the run's result: pisub result RUN (or status --view transcript)",
    "reads": "pisub pre-reads no files: name them in the task",
    "defaultReads": "pisub pre-reads no files: name them in the task",
    "progress": "pisub keeps status.json and events.jsonl instead of progress.md: pisub status RUN",
    "defaultProgress": "pisub keeps status.json and events.jsonl instead of progress.md: pisub status RUN",
    "mutationTools": "pisub has no completion guard; acceptance checks the evidence",
    "completionGuard": "pisub has no completion guard; acceptance checks the evidence",
    "interactive": "pisub runs are detached; there is no interactive child",
    "allowNestedSubagents": "a child's own pisub calls are governed by maxDepth",
    "memory": "pisub keeps no per-agent memory",
}


def _unsupported(fm: AgentFrontmatter, ignored: list[Ignored]) -> None:
    for key, reason in _UNSUPPORTED.items():
        value = getattr(fm, _snake(key))
        if value is not None and value is not False and value != "" and value != []:
            ignored.append(Ignored(key, reason))
    if fm.async_ is False:
        ignored.append(Ignored("async", "every pisub run is detached: pisub wait RUN blocks until it ends"))
