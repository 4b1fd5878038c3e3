"""Whether a path can be trusted the way OpenSSH's ``StrictModes`` trusts a user's files: no
component is a symlink, and every directory above it is owned by root or this user and writable
by nobody else (a world-writable directory only when it is sticky and root's, like ``/tmp``).

A program that reopens a path by name (pi appends to its session file by name on every write)
is safe against others only when nobody else can change what that name means: the owner of any
directory above it could swap a component for a symlink at any time. So the whole path is
checked, not only its last directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def unsafe_ancestor(path: Path, uid: int | None = None) -> str | None:
    """Why the absolute ``path`` cannot be trusted (a component above it that is missing, a
    symlink, not a directory, someone else's, or writable by others; the last component a
    symlink), or None. The last component may be missing."""
    uid = os.geteuid() if uid is None else uid
    current = Path(path.anchor)
    for part in path.parts[1:-1]:
        current = current / part
        problem = _directory_problem(current, uid)
        if problem is not None:
            return problem
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return f"{path} is a symlink; give the directory itself"
    except FileNotFoundError:
        pass
    return None


def _directory_problem(directory: Path, uid: int) -> str | None:
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return f"{directory} does not exist"
    except OSError as exc:
        return f"cannot check {directory}: {exc.strerror or exc}"
    if stat.S_ISLNK(info.st_mode):
        return f"{directory} is a symlink (no component of the path may be one)"
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory"
    if info.st_uid not in (0, uid):
        return f"{directory} belongs to another user (uid {info.st_uid})"
    writable = info.st_mode & 0o022
    if writable and not (info.st_mode & stat.S_ISVTX and info.st_uid == 0):
        mode = stat.S_IMODE(info.st_mode)
        return f"{directory} is writable by others (mode {mode:o}) and not a sticky directory of root's"
    return None
