"""The user's configuration: ``$XDG_CONFIG_HOME/pisub/config.toml`` (default
``~/.config/pisub/config.toml``), and the old place ``<home>/config.toml`` (under the XDG *state*
home), still read: when both set a key, the first wins, key by key (``pisub config show`` names
both files and every key they disagree on). Defaults for settings a call and an agent file may
also give. Precedence everywhere: the call (CLI flag, API argument, workflow child field) → the
agent's frontmatter → these files → an environment variable (where one exists) → pisub's
built-in default. Input from outside, so strict: an unknown key or a wrong type is an error
naming the file and the field."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import msgspec

from pisub import defaults
from pisub.errors import InvalidInput, PisubError
from pisub.protocol.codec import convert
from pisub.protocol.config import Config
from pisub.protocol.manifest import LimitValues, seconds_of_ms
from pisub.protocol.workflow import DEFAULT_CONCURRENCY, DEFAULT_MAX_SPAWNS
from pisub.termsafe import printable

MAX_CONFIG_BYTES = 256 * 1024


class Setting(msgspec.Struct, frozen=True):
    """One effective setting and where it came from."""

    name: str
    value: Any
    source: str
    """``config.toml``, ``env PISUB_…`` or ``default``."""
    file: Path | None = None
    """The ``config.toml`` it came from (source ``config.toml``)."""


class ConfigFile(msgspec.Struct, frozen=True):
    """One place a ``config.toml`` is looked for, and what it sets (its dotted keys)."""

    path: Path
    found: bool
    old: bool
    """``<home>/config.toml``: the old place, read after the XDG one."""
    keys: dict[str, Any]


class Loaded(msgspec.Struct, frozen=True):
    """The configuration and the files it came from, the winning one first."""

    config: Config
    files: list[ConfigFile]

    def file_of(self, name: str) -> Path | None:
        return next((f.path for f in self.files if name in f.keys), None)

    def conflicts(self) -> list[tuple[str, Any, Any]]:
        """Keys both files set to different values: (key, the value used, the value ignored)."""
        if len(self.files) < 2:
            return []
        first, second = self.files[0].keys, self.files[1].keys
        return [(k, first[k], second[k]) for k in first if k in second and first[k] != second[k]]


def user_config_path(env: dict[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/pisub/config.toml`` (an absolute ``XDG_CONFIG_HOME``, as the XDG spec
    says), else ``~/.config/pisub/config.toml``."""
    env = dict(os.environ) if env is None else env
    xdg = env.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "pisub" / "config.toml"


def config_path(home_root: Path) -> Path:
    """The old place: ``<home>/config.toml`` (still read, after :func:`user_config_path`)."""
    return home_root / "config.toml"


def config_files(home_root: Path, env: dict[str, str] | None = None) -> list[Path]:
    """Every place a ``config.toml`` is looked for, the winning one first."""
    return [user_config_path(env), config_path(home_root)]


def load_config(home_root: Path, env: dict[str, str] | None = None) -> Config:
    """The configuration (an empty one when there is no file): see :func:`load_all`.

    Raises:
        InvalidInput: see :func:`load_all`.
    """
    return load_all(home_root, env).config


def load_all(home_root: Path, env: dict[str, str] | None = None) -> Loaded:
    """Both files, each checked on its own (an error names the file), merged key by key: the
    XDG file's value wins over the old place's.

    Raises:
        InvalidInput: a file cannot be read (a symlink, a FIFO, too large), is not TOML, or has
            an unknown key or a bad value — naming the file and the field.
    """
    files, tables = [], []
    for index, path in enumerate(config_files(home_root, env)):
        table = _read_table(path, follow=index == 0)
        if table is not None:  # each file checked on its own: an error names its file
            config_limits(_convert(table, path)).check(printable(os.fspath(path)))
        tables.append(table or {})
        files.append(ConfigFile(path, table is not None, index > 0, _dotted(table or {})))
    merged: dict[str, Any] = {}
    for table in reversed(tables):  # the old place first: the XDG file's keys replace its keys
        for key, value in table.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return Loaded(_convert(merged, files[0].path), files)


def _read_table(path: Path, *, follow: bool = False) -> dict[str, Any] | None:
    """The file's TOML table, or None when there is no file. ``follow``: a symlink is followed
    as :func:`_link_target` allows (the XDG place; never in the home)."""
    from pisub.core.fsio import read_bytes

    shown = printable(os.fspath(path))
    try:
        if os.path.islink(path):
            if not follow:
                raise InvalidInput(
                    f"{shown} is a symlink: pisub reads <home>/config.toml only as a regular file; "
                    f"move it to {printable(os.fspath(user_config_path()))} (a symlink is followed there)"
                )
            path = _link_target(path, shown)
        data = read_bytes(path, limit=MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise InvalidInput(f"{shown} cannot be read: a parent is not a directory; fix it") from None
    except OSError as exc:
        raise InvalidInput(f"{shown} cannot be read: {exc.strerror or exc}; fix or remove it") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidInput(f"{shown} is larger than {MAX_CONFIG_BYTES} bytes; shorten it")
    import tomllib  # (here: most homes have no config.toml, and most commands read none)

    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise InvalidInput(f"{shown} is not valid TOML: {exc}") from None


MAX_LINKS = 8
OWNERS_NOTE = "pisub follows a config symlink only when each link and its target are yours (or root's)"


def _link_target(path: Path, shown: str) -> Path:
    """The regular file a symlinked config file (a dotfile manager's: stow, home-manager) ends at,
    after at most :data:`MAX_LINKS` links, each owned by the user or root, as is the file.

    Raises:
        InvalidInput: a link or the file belongs to someone else, the file is not a regular file
            or does not exist, or the links go on (a loop).
    """
    from pisub.core.fsio import file_kind

    mine = {os.getuid(), 0}
    current = path
    for _ in range(MAX_LINKS):
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            break  # said below
        if not stat.S_ISLNK(st.st_mode):
            break
        if st.st_uid not in mine:
            link = printable(os.fspath(current))
            raise InvalidInput(f"{shown}: the symlink {link} is owned by uid {st.st_uid}; {OWNERS_NOTE}")
        current = current.parent / os.readlink(current)
    else:
        raise InvalidInput(f"{shown}: more than {MAX_LINKS} symlinks in a row (a loop?); fix the link")
    target = printable(os.fspath(current))
    try:
        st = os.lstat(current)
    except FileNotFoundError:
        missing = f"{shown} links to {target}, which does not exist; fix or remove the link"
        raise InvalidInput(missing) from None
    if not stat.S_ISREG(st.st_mode):
        kind = file_kind(st.st_mode)
        raise InvalidInput(f"{shown} links to {target}, which is not a regular file ({kind}); fix the link")
    if st.st_uid not in mine:
        raise InvalidInput(f"{shown} links to {target}, which is owned by uid {st.st_uid}; {OWNERS_NOTE}")
    return current


def _convert(table: dict[str, Any], path: Path) -> Config:
    try:
        return convert(table, Config, printable(os.fspath(path)))
    except PisubError as exc:
        raise InvalidInput(exc.message.replace("`$.", "`")) from None


def _dotted(table: dict[str, Any]) -> dict[str, Any]:
    """``{"limits": {"timeout": 5}}`` → ``{"limits.timeout": 5}`` (one level: sections)."""
    keys: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            keys.update({f"{key}.{sub}": inner for sub, inner in value.items()})
        else:
            keys[key] = value
    return keys


def config_limits(config: Config) -> LimitValues:
    """The ``[limits]`` section as a source of :meth:`Limits.resolve`."""
    section = config.limits
    return LimitValues(
        timeout=section.timeout,
        idle_timeout=section.idle_timeout,
        output_cap=section.output_cap,
        output_hard_cap=section.output_hard_cap,
        tool_timeout=seconds_of_ms(section.tool_timeout_ms),
        tool_timeout_exempt=section.tool_timeout_exempt,
        checkpoint_before_deadline=seconds_of_ms(section.checkpoint_before_deadline_ms),
        tool_budget=section.tool_budget.budget() if section.tool_budget is not None else None,
    )


ENV_TOOL_TIMEOUT_MS = "PISUB_TOOL_TIMEOUT_MS"


def env_limits(env: dict[str, str] | None = None) -> LimitValues:
    """The limits the environment gives (below the config file): ``PISUB_TOOL_TIMEOUT_MS``.

    Raises:
        InvalidInput: it is not a whole number of milliseconds from 1 to 2**31-1.
    """
    env = dict(os.environ) if env is None else env
    text = env.get(ENV_TOOL_TIMEOUT_MS, "").strip()
    if not text:
        return LimitValues()
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 2**31 - 1):
        raise InvalidInput(
            f"{ENV_TOOL_TIMEOUT_MS}={text[:40]!r}: give a whole number of milliseconds (1 to 2147483647)"
        )
    return LimitValues(tool_timeout=int(text) / 1000)


def effective(home_root: Path, env: dict[str, str] | None = None) -> list[Setting]:
    """Every setting this file may hold, with its value when neither a call nor an agent sets
    it, and where that value comes from.

    Raises:
        InvalidInput: the file is bad (see :func:`load_config`).
    """
    from pisub.store.lineage import caller_lineage

    loaded = load_all(home_root, env)
    config = loaded.config
    env = dict(os.environ) if env is None else env
    rows = []
    limit_defaults: dict[str, Any] = {
        "timeout": defaults.DEFAULT_TIMEOUT_S,
        "idle_timeout": defaults.DEFAULT_IDLE_TIMEOUT_S,
        "output_cap": defaults.DEFAULT_OUTPUT_CAP,
        "output_hard_cap": defaults.DEFAULT_OUTPUT_HARD_CAP,
    }
    for name, default in limit_defaults.items():
        rows.append(_pick(f"limits.{name}", getattr(config.limits, name), default))
    tool_ms = config.limits.tool_timeout_ms
    if tool_ms is not None:
        rows.append(Setting("limits.tool_timeout_ms", tool_ms, "config.toml"))  # its file: below
    elif env.get(ENV_TOOL_TIMEOUT_MS, "").strip():
        env_ms = env_limits(env).tool_timeout
        rows.append(
            Setting("limits.tool_timeout_ms", round((env_ms or 0) * 1000), f"env {ENV_TOOL_TIMEOUT_MS}")
        )
    else:
        fast = ", ".join(defaults.FAST_TOOLS)
        rows.append(
            Setting(
                "limits.tool_timeout_ms", f"{defaults.FAST_TOOL_TIMEOUT_S * 1000:g} for {fast}", "default"
            )
        )
    rows.append(_pick("limits.tool_timeout_exempt", config.limits.tool_timeout_exempt, []))
    rows.append(
        _pick("limits.checkpoint_before_deadline_ms", config.limits.checkpoint_before_deadline_ms, None)
    )
    budget = config.limits.tool_budget
    shown = msgspec.to_builtins(budget) if budget is not None else None
    rows.append(_pick("limits.tool_budget", shown, None))
    rows.append(_pick("workflow.concurrency", config.workflow.concurrency, DEFAULT_CONCURRENCY))
    rows.append(_pick("workflow.max_spawns", config.workflow.max_spawns, DEFAULT_MAX_SPAWNS))
    resources = sorted(config.workflows.resources)  # named workflow resources (spec/resources.md)
    rows.append(_pick("workflows.resources", resources or None, []))
    rows.append(_pick("acceptance.infer", config.acceptance.infer, True))
    rows.append(_pick("acceptance.review", config.acceptance.review, False))
    rows.append(_pick("acceptance.reviewer", config.acceptance.reviewer, "reviewer"))
    rows.append(_pick("acceptance.verify_env", config.acceptance.verify_env, []))
    rows.append(
        _pick(
            "budgets.usage_estimate_tokens",
            config.budgets.usage_estimate_tokens,
            defaults.USAGE_ESTIMATE_TOKENS,
        )
    )
    rows.append(
        _pick(
            "budgets.usage_estimate_cost_usd",
            config.budgets.usage_estimate_cost_usd,
            defaults.USAGE_ESTIMATE_COST_USD,
        )
    )
    backend = config.placement.backend.value if config.placement.backend is not None else None
    rows.append(_pick("placement.backend", backend, "local"))
    rows.append(_pick("placement.heartbeat_ttl", config.placement.heartbeat_ttl, defaults.HEARTBEAT_TTL_S))
    context = config.default_subagent_context
    rows.append(_pick("default_subagent_context", context.value if context is not None else None, "fresh"))
    slurm = config.slurm
    for key in ("partition", "time", "cpus", "mem", "sbatch"):
        rows.append(_pick(f"slurm.{key}", getattr(slurm, key) if slurm is not None else None, None))
    depth_source = "env PISUB_MAX_DEPTH" if env.get("PISUB_MAX_DEPTH") else "default"
    rows.append(Setting("depth.max_depth", caller_lineage(env).max_depth, depth_source))
    return [
        Setting(r.name, r.value, r.source, loaded.file_of(r.name)) if r.source == "config.toml" else r
        for r in rows
    ]


def _pick(name: str, configured: Any, default: Any) -> Setting:
    if configured is not None:
        return Setting(name, configured, "config.toml")
    return Setting(name, default, "default")
