"""Named workflow resources: the builtin ``review`` and ``run-ci``, and those the user registers
in their own ``config.toml`` (``[workflows.resources.NAME]``). A resource resolves to a script,
the ceiling of its ``runs.host`` commands (a :class:`HostPermit`) and its provenance (a
:class:`ResourceOrigin`, kept in the manifest); see ``spec/resources.md``.

Only a named resource's workflow gets host commands: a raw script has none. A config resource is
safe because only the user's own configuration registers it (never a project or repository
file): the file that registers it must be the user's (or root's) and writable by nobody else,
and its script the user's own regular file (never a symlink), writable by nobody else, under
directories nobody else can change; the script is read once, at launch, and its sha256 kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pisub.core.strict_path import unsafe_ancestor
from pisub.errors import InvalidInput
from pisub.protocol.config import ResourceSection
from pisub.protocol.host import MAX_TIMEOUT_MS
from pisub.protocol.workflow import MAX_SCRIPT_BYTES, HostPermit, ResourceOrigin, ScriptLanguage
from pisub.termsafe import printable
from pisub.workflow.languages import language_of

MAX_ARGS_BYTES = 16 * 1024
RUN_CI_COMMANDS = ("npm test", "npm run typecheck")
RUN_CI_DEFAULT_TIMEOUT_MS = 120_000

REVIEW_SCRIPT = 'return await runs.run("review", { agent: "reviewer", task: args.task });\n'
RUN_CI_SCRIPT = (
    'return await runs.host("ci", { kind: "command", command: args.command, '
    'timeoutMs: args.timeoutMs, role: "ci" });\n'
)


@dataclass(frozen=True)
class Resolved:
    """A resource ready to launch: its script, its language, its permit, where it came from,
    and its checked args (defaults filled in)."""

    text: str
    language: ScriptLanguage
    permit: HostPermit
    origin: ResourceOrigin
    args: dict[str, Any]


@dataclass(frozen=True)
class ResourceInfo:
    """One line of ``pisub resources``."""

    name: str
    source: str
    description: str
    commands: list[str]
    path: str | None = None


BUILTIN_DESCRIPTIONS = {
    "review": "review {task}: one reviewer child reviews the task",
    "run-ci": "run-ci {command?, timeoutMs?}: `npm test` (default) or `npm run typecheck` as a host command",
}


_STARTS = re.compile(r"\bruns\s*(?:\.\s*(?:run|all|lanes)\b|\[)")


def may_start_children(script: str) -> bool:
    """Whether a resource's script may start a child run (it names ``runs.run``, ``runs.all`` or
    ``runs.lanes``, or indexes ``runs``): ``run-ci`` starts none, so its launch says nothing of
    what acceptance adds to children."""
    return _STARTS.search(script) is not None


def check_args(args: object, where: str) -> dict[str, Any]:
    """A resource's args: a plain JSON object of at most 16 KiB.

    Raises:
        InvalidInput: not an object, not JSON, or too large.
    """
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise InvalidInput(f"{where}: args must be a JSON object, not {type(args).__name__}")
    try:
        encoded = json.dumps(args, allow_nan=False, ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(
            f"{where}: args are not plain JSON: {printable(str(exc), one_line=True)[:200]}"
        ) from None
    if len(encoded) > MAX_ARGS_BYTES:
        raise InvalidInput(f"{where}: args are larger than {MAX_ARGS_BYTES} bytes as JSON")
    return dict(args)


def _only(args: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    for name in args:
        if name not in known:
            allowed = ", ".join(known)
            raise InvalidInput(
                f"{where}: unknown arg {printable(repr(name)[:60], one_line=True)} (it takes {allowed})"
            )


def _review(args: dict[str, Any]) -> Resolved:
    where = "resource review"
    _only(args, ("task",), where)
    task = args.get("task")
    if not isinstance(task, str) or not task.strip() or "\0" in task:
        raise InvalidInput(f"{where}: args.task: give the task to review (a non-empty string, no NUL)")
    origin = ResourceOrigin(name="review", source="builtin", sha256=_digest(REVIEW_SCRIPT))
    return Resolved(REVIEW_SCRIPT, ScriptLanguage.JAVASCRIPT, HostPermit(), origin, {"task": task})


def _run_ci(args: dict[str, Any]) -> Resolved:
    where = "resource run-ci"
    _only(args, ("command", "timeoutMs"), where)
    command = args.get("command", RUN_CI_COMMANDS[0])
    if command not in RUN_CI_COMMANDS:
        shown = printable(repr(command)[:80], one_line=True)
        raise InvalidInput(
            f"{where}: args.command {shown}: give `npm test` (the default) or `npm run typecheck`"
        )
    timeout = args.get("timeoutMs", RUN_CI_DEFAULT_TIMEOUT_MS)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= MAX_TIMEOUT_MS:
        raise InvalidInput(
            f"{where}: args.timeoutMs must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}"
        )
    permit = HostPermit(keys=["ci"], commands=[command])
    origin = ResourceOrigin(name="run-ci", source="builtin", sha256=_digest(RUN_CI_SCRIPT))
    return Resolved(
        RUN_CI_SCRIPT, ScriptLanguage.JAVASCRIPT, permit, origin, {"command": command, "timeoutMs": timeout}
    )


BUILTINS = {"review": _review, "run-ci": _run_ci}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def resolve(name: str, args: object, home_root: Path) -> Resolved:
    """The resource ``name`` with ``args``: a builtin, else one of the user's config.

    Raises:
        InvalidInput: no such resource, bad args, or a config resource that is not safe to run
            (naming the file and why).
    """
    if not isinstance(name, str) or not name:
        raise InvalidInput("a workflow resource needs a name (review, run-ci, or one of config.toml's)")
    checked = check_args(args, f"resource {printable(name[:64], one_line=True)}")
    configured = _configured(home_root)  # first: a config resource shadowing a builtin is refused
    builtin = BUILTINS.get(name)
    if builtin is not None:
        return builtin(checked)
    section = configured.get(name)
    if section is None:
        known = ", ".join([*BUILTINS, *sorted(configured)])
        raise InvalidInput(
            f"no workflow resource {printable(repr(name)[:70], one_line=True)} (known: {known})"
        )
    return _from_config(name, section, checked)


def _configured(home_root: Path) -> dict[str, ResourceSection]:
    """The user's config resources (the file that registers them checked first).

    Raises:
        InvalidInput: the config is bad, writable by others, or a resource shadows a builtin.
    """
    from pisub.store.config import load_all

    loaded = load_all(home_root)
    resources = loaded.config.workflows.resources
    if not resources:
        return {}
    for found in loaded.files:
        if any(key == "workflows.resources" for key in found.keys):
            _check_config_file(found.path)
    for name in resources:
        if name in BUILTINS:
            raise InvalidInput(
                f"config.toml: [workflows.resources.{name}] shadows the builtin resource {name!r}; rename it"
            )
    return dict(resources)


def _check_config_file(path: Path) -> None:
    """The config file that registers resources is the user's (or root's), writable by nobody
    else (a symlink was already checked by the config loader)."""
    shown = printable(os.fspath(path))
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InvalidInput(f"{shown}: cannot be checked: {exc.strerror or exc}") from None
    if st.st_uid not in (os.geteuid(), 0):
        raise InvalidInput(f"{shown} registers workflow resources and is owned by uid {st.st_uid}: refused")
    if st.st_mode & 0o022:
        raise InvalidInput(
            f"{shown} registers workflow resources and is writable by others "
            f"(mode {stat.S_IMODE(st.st_mode):o}): chmod go-w it"
        )


def _from_config(name: str, section: ResourceSection, args: dict[str, Any]) -> Resolved:
    path = Path(section.script)
    where = f"[workflows.resources.{name}] script"
    if not path.is_absolute():
        raise InvalidInput(f"{where} {printable(section.script[:200])!r}: give an absolute path")
    if path.suffix not in (".js", ".py"):
        raise InvalidInput(f"{where} {printable(section.script[:200])!r}: a .js or .py file")
    text = read_script(path, where)
    language = language_of(path)
    permit = HostPermit(keys=list(section.keys), commands=list(section.commands))
    origin = ResourceOrigin(name=name, source="config", path=str(path), sha256=_digest(text))
    return Resolved(text, language, permit, origin, args)


def read_script(path: Path, where: str) -> str:
    """A config resource's script: the user's own regular file (never through a symlink), not
    writable by others, under directories nobody else can change, at most 1 MiB of UTF-8.

    Raises:
        InvalidInput: naming why it is refused.
    """
    shown = printable(os.fspath(path)[:300])
    if os.path.islink(path):
        raise InvalidInput(f"{where} {shown} is a symlink: give the file itself")
    problem = unsafe_ancestor(path)
    if problem is not None:
        raise InvalidInput(f"{where} {shown}: {printable(problem)}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        import errno

        if exc.errno == errno.ELOOP:
            raise InvalidInput(f"{where} {shown} is a symlink: give the file itself") from None
        raise InvalidInput(f"{where} {shown}: cannot be read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{where} {shown} is not a regular file")
        if st.st_uid != os.geteuid():
            raise InvalidInput(f"{where} {shown} is owned by uid {st.st_uid}, not you: refused")
        if st.st_mode & 0o022:
            raise InvalidInput(
                f"{where} {shown} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): chmod go-w it"
            )
        if st.st_size > MAX_SCRIPT_BYTES:
            raise InvalidInput(f"{where} {shown} is larger than {MAX_SCRIPT_BYTES} bytes")
        data = os.read(fd, MAX_SCRIPT_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{where} {shown} is not UTF-8 text") from None


def list_all(home_root: Path) -> list[ResourceInfo]:
    """Every resource: the builtins, then the user's config ones (by name).

    Raises:
        InvalidInput: the config is bad (see :func:`_configured`).
    """
    rows = [
        ResourceInfo("review", "builtin", BUILTIN_DESCRIPTIONS["review"], []),
        ResourceInfo("run-ci", "builtin", BUILTIN_DESCRIPTIONS["run-ci"], list(RUN_CI_COMMANDS)),
    ]
    for name, section in sorted(_configured(home_root).items()):
        rows.append(ResourceInfo(name, "config", section.description, list(section.commands), section.script))
    return rows
