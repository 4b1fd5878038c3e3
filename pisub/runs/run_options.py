"""A single pi run's per-run choices checked at launch: how its conversation begins
(``context``: fresh, a fork of a session, or the agent's profile) and where pi keeps its
session (``--session-dir``).

How a run begins, the seed's precedence: an explicit ``context`` (``fresh`` / ``fork``, or
``profile``: the agent's ``defaultContext``, which it must declare) wins; without one, the config's
``default_subagent_context``, then the agent's ``defaultContext``, then ``fresh``. An explicit
``fork`` is strict (no session to fork: refused); a fork that is only a preference (the config's,
the agent's, ``profile``) begins fresh when there is no session to fork. The session forked is
``--fork-from`` (a run or a session file), else ``--parent-session`` (the caller's own session:
the pi tool passes its session file), else the session of the pisub run this launch comes from.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from pisub.core.strict_path import unsafe_ancestor
from pisub.errors import InvalidInput, storage_error
from pisub.protocol.fields import Context
from pisub.termsafe import has_controls

if TYPE_CHECKING:
    from pisub.protocol.agent import AgentFrontmatter
    from pisub.protocol.config import Config

CONTEXT_CHOICES = ("fresh", "fork", "profile")
MAX_SESSION_DIR_CHARS = 4096
MAX_NAME_BYTES = 255


class ContextChoice(msgspec.Struct, frozen=True):
    """How a run begins: ``context`` and, for a fork, the session copied."""

    context: Context
    fork_source: Path | None = None


def check_context(given: object) -> str | None:
    """``given`` when it is one of ``fresh``, ``fork``, ``profile`` (or None).

    Raises:
        InvalidInput: naming ``context``.
    """
    if given is None or (isinstance(given, str) and given in CONTEXT_CHOICES):
        return given
    shown = repr(given)[:40] if isinstance(given, str) else type(given).__name__
    raise InvalidInput(f"context: must be one of {', '.join(CONTEXT_CHOICES)}, not {shown}")


def resolve_context(
    given: str | None,
    agent: str,
    frontmatter: AgentFrontmatter,
    config: Config,
    source: Path | None,
) -> ContextChoice:
    """How a pi run of ``agent`` begins (see the module). ``source``: the session a fork would
    copy (``--fork-from``, else the calling run's), None when there is none.

    Raises:
        InvalidInput: an explicit fork without a session, ``profile`` for an agent without a
            ``defaultContext``.
    """
    if given == "profile":
        if frontmatter.default_context is None:
            raise InvalidInput(
                f"context 'profile': agent {agent!r} declares no defaultContext (give context fresh or fork)"
            )
        return _preferred(frontmatter.default_context, source)
    if given is not None:
        wanted = Context(given)
        if wanted is Context.FORK and source is None:
            raise InvalidInput(
                "context 'fork': there is no session to fork; give --fork-from RUN|SESSION "
                "(or start the run from inside a pi run)"
            )
        return ContextChoice(wanted, source if wanted is Context.FORK else None)
    preference = config.default_subagent_context or frontmatter.default_context or Context.FRESH
    return _preferred(preference, source)


def _preferred(preference: Context, source: Path | None) -> ContextChoice:
    if preference is Context.FORK and source is not None:
        return ContextChoice(Context.FORK, source)
    return ContextChoice(Context.FRESH)


def implicit_source(given: object) -> Path | None:
    """The caller's own session (``--parent-session``: what a fork that is only a preference
    copies), None when it is not (yet) a regular file — pi writes it after its first reply. It is
    checked as a session only when a fork copies it (:func:`pisub.runs.launch.check_session`):
    the pi tool passes it with every launch.

    Raises:
        InvalidInput: not a path (naming ``parentSession``).
    """
    if not isinstance(given, str) or not given.strip() or len(given) > MAX_SESSION_DIR_CHARS:
        raise InvalidInput("parentSession: give the path of a session file")
    if has_controls(given):
        raise InvalidInput("parentSession: the path holds control characters")
    path = Path(os.path.abspath(given))
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return path if stat.S_ISREG(info.st_mode) and info.st_size > 0 else None


def session_dir(given: str | Path, base: Path, home: Path) -> Path:
    """The directory ``given`` names (relative to ``base``) for pi's session file: created
    0700 when missing (its parent must exist), else a real directory that this user owns and
    nobody else may write to. The whole path is checked like OpenSSH's ``StrictModes``
    (:mod:`pisub.core.strict_path`: pi reopens the session by name on every write, so nobody
    else may own or write to a directory above it), and it is not inside pisub's ``home``.

    Raises:
        InvalidInput: naming ``sessionDir`` and what is wrong.
    """
    text = os.fspath(given)
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("sessionDir: give a directory")
    if len(text) > MAX_SESSION_DIR_CHARS or has_controls(text):
        raise InvalidInput("sessionDir: a path of at most 4096 characters without control characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("sessionDir: the path is not valid UTF-8") from None
    path = Path(os.path.abspath(base / text))
    if any(len(os.fsencode(part)) > MAX_NAME_BYTES for part in path.parts):
        raise InvalidInput(f"sessionDir: a name in the path is longer than {MAX_NAME_BYTES} bytes")
    problem = unsafe_ancestor(path)
    if problem is not None:
        raise InvalidInput(f"sessionDir: {problem}")
    if inside(path, home):
        raise InvalidInput(f"sessionDir: {path} is inside pisub's home {home}; give a directory of your own")
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        info = os.lstat(path)
    except (NotADirectoryError, PermissionError) as exc:
        raise InvalidInput(f"sessionDir: cannot create {path}: {exc.strerror}") from None
    except OSError as exc:
        raise storage_error(exc, "create", path) from exc
    if stat.S_ISLNK(info.st_mode):
        raise InvalidInput(f"sessionDir: {path} is a symlink; give the directory itself")
    if not stat.S_ISDIR(info.st_mode):
        raise InvalidInput(f"sessionDir: {path} is not a directory")
    if info.st_uid != os.geteuid():
        raise InvalidInput(f"sessionDir: {path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        raise InvalidInput(
            f"sessionDir: {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}); chmod go-w it"
        )
    return path


def inside(path: Path, home: Path) -> bool:
    """Whether ``path`` (absolute) is ``home`` or below it (both resolved)."""
    real = Path(os.path.realpath(path))
    return real.is_relative_to(os.path.realpath(home)) or path.is_relative_to(home)
