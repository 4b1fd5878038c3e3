"""Field types shared by the inputs of workflow runs (child calls, lanes)."""

from __future__ import annotations

import enum
import re
from typing import Annotated

import msgspec

KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
KEY_RE = re.compile(KEY_PATTERN)
"""A child's key in its workflow (also a state namespace's name)."""

Key = Annotated[str, msgspec.Meta(pattern=KEY_PATTERN)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=366 * 86400)]
ShortPath = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class OutputMode(enum.StrEnum):
    INLINE = "inline"
    FILE_ONLY = "file-only"
    """The child's returned output is a pointer to the file ``output`` names."""


class Context(enum.StrEnum):
    FRESH = "fresh"
    FORK = "fork"
    """A pi child starts from a copy of the workflow's ``forkFrom`` session."""


class Isolation(enum.StrEnum):
    NONE = "none"
    WORKTREE = "worktree"
    """The child works in its own git worktree; its work is captured as a patch at its end."""


BaseRef = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
"""A git ref or commit id a worktree starts from (default ``HEAD``, resolved at allocation)."""
