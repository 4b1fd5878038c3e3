"""The user's configuration: ``<home>/config.toml``, defaults for settings a call and an agent
file may also give. Precedence everywhere: the call (CLI flag, API argument, workflow child
field) → the agent's frontmatter → this file → an environment variable (where one exists) →
pisub's built-in default. Input from outside, so strict: an unknown key or a wrong type is an
error naming ``config.toml`` and the field."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pisub import defaults
from pisub.errors import InvalidInput, PisubError, printable
from pisub.protocol.codec import convert
from pisub.protocol.config import Config
from pisub.protocol.manifest import LimitValues
from pisub.protocol.workflow import DEFAULT_CONCURRENCY, DEFAULT_MAX_SPAWNS

MAX_CONFIG_BYTES = 256 * 1024


@dataclass(frozen=True)
class Setting:
    """One effective setting and where it came from."""

    name: str
    value: Any
    source: str
    """``config.toml``, ``env PISUB_…`` or ``default``."""


def config_path(home_root: Path) -> Path:
    return home_root / "config.toml"


def load_config(home_root: Path) -> Config:
    """The configuration (an empty one when there is no file).

    Raises:
        InvalidInput: it cannot be read (a symlink, a FIFO, too large), is not TOML, or has an
            unknown key or a bad value — naming the file and the field.
    """
    from pisub.fsio import read_bytes

    path = config_path(home_root)
    shown = printable(os.fspath(path))
    try:
        data = read_bytes(path, limit=MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise InvalidInput(f"{shown} cannot be read: {exc.strerror or exc}; fix or remove it") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidInput(f"{shown} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise InvalidInput(f"{shown} is not valid TOML: {exc}") from None
    try:
        return convert(table, Config, shown)
    except PisubError as exc:
        raise InvalidInput(exc.message.replace("`$.", "`")) from None


def config_limits(config: Config) -> LimitValues:
    """The ``[limits]`` section as a source of :meth:`Limits.resolve`."""
    section = config.limits
    return LimitValues(
        timeout=section.timeout,
        idle_timeout=section.idle_timeout,
        output_cap=section.output_cap,
        output_hard_cap=section.output_hard_cap,
    )


def effective(home_root: Path, env: dict[str, str] | None = None) -> list[Setting]:
    """Every setting this file may hold, with its value when neither a call nor an agent sets
    it, and where that value comes from.

    Raises:
        InvalidInput: the file is bad (see :func:`load_config`).
    """
    from pisub.lineage import caller_lineage

    config = load_config(home_root)
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
    rows.append(_pick("workflow.concurrency", config.workflow.concurrency, DEFAULT_CONCURRENCY))
    rows.append(_pick("workflow.max_spawns", config.workflow.max_spawns, DEFAULT_MAX_SPAWNS))
    depth_source = "env PISUB_MAX_DEPTH" if env.get("PISUB_MAX_DEPTH") else "default"
    rows.append(Setting("depth.max_depth", caller_lineage(env).max_depth, depth_source))
    return rows


def _pick(name: str, configured: Any, default: Any) -> Setting:
    if configured is not None:
        return Setting(name, configured, "config.toml")
    return Setting(name, default, "default")
