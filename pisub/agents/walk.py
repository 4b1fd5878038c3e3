"""Finding agent files in a directory someone else may have filled.

A project's ``.pi/agents``, ``.agents`` and ``.pisub/agents`` come with the repository: anything
can stand there. The walk never follows a symlink below the root (a symlinked file or folder is
skipped with why), and a project root that is itself a symlink is not entered; only the user's
own directories may be symlinks (dotfiles set-ups link them). It descends at most
:data:`MAX_DEPTH` folders, looks at no more than :data:`MAX_ENTRIES` names, skips hidden names
and ``*.chain.md`` (not agents in pi-subagents), and reports a FIFO, socket or device, a name
that is not UTF-8 and a folder it cannot list — each a :data:`Problems` entry, never an error.
Reading a file found (``O_NOFOLLOW | O_NONBLOCK``, size-bounded) is the caller's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_DEPTH = 8
"""Folders below a root that are searched (``**`` in pi-subagents)."""
MAX_ENTRIES = 10_000
"""Names looked at under one root before the walk stops (a huge tree never stalls a listing)."""

Problems = dict[Path, str]


def agent_files(root: Path, *, recursive: bool, follow_root: bool) -> tuple[list[Path], Problems]:
    """The ``*.md`` files under ``root`` (sorted, depth-first) and what was skipped, with why."""
    problems: Problems = {}
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return [], problems
    except OSError as exc:
        return [], {root: f"cannot look at it: {exc.strerror or exc}"}
    if stat.S_ISLNK(st.st_mode):
        if not follow_root:
            return [], {root: "a symlink: a project's agent folder is not followed"}
        try:
            st = os.stat(root)
        except OSError as exc:
            return [], {root: f"a symlink to nothing usable: {exc.strerror or exc}"}
        # Its files are named by where they are: read through no symlink at all.
        root = Path(os.path.realpath(root))
    if not stat.S_ISDIR(st.st_mode):
        return [], {root: "not a folder"}
    found: list[Path] = []
    budget = [MAX_ENTRIES]
    _walk(root, 0, MAX_DEPTH if recursive else 0, found, problems, budget)
    if budget[0] < 0:
        problems[root] = f"more than {MAX_ENTRIES} names: the rest were not searched"
    return found, problems


def _walk(
    folder: Path, depth: int, limit: int, found: list[Path], problems: Problems, budget: list[int]
) -> None:
    try:
        with os.scandir(folder) as it:
            entries = []
            for entry in it:
                budget[0] -= 1
                if budget[0] < 0:
                    break
                entries.append(entry)
    except OSError as exc:
        problems[folder] = f"cannot list it: {exc.strerror or exc}"
        return
    for entry in sorted(entries, key=lambda e: e.name):
        _entry(folder, entry, depth, limit, found, problems, budget)


def _entry(
    folder: Path,
    entry: os.DirEntry[str],
    depth: int,
    limit: int,
    found: list[Path],
    problems: Problems,
    budget: list[int],
) -> None:
    path = folder / entry.name
    if entry.name.startswith("."):
        return
    agent_name = entry.name.endswith(".md") and not entry.name.endswith(".chain.md")
    try:
        entry.name.encode("utf-8")
    except UnicodeEncodeError:
        if agent_name or limit:
            problems[path] = "its name is not UTF-8"
        return
    try:
        is_link = entry.is_symlink()
        is_dir = not is_link and entry.is_dir(follow_symlinks=False)
        is_file = not is_link and entry.is_file(follow_symlinks=False)
    except OSError as exc:
        problems[path] = f"cannot look at it: {exc.strerror or exc}"
        return
    if is_link:
        if agent_name or limit:
            problems[path] = "a symlink: agent files and folders are never followed"
    elif is_dir:
        if depth < limit:
            _walk(path, depth + 1, limit, found, problems, budget)
        elif limit:
            problems[path] = f"more than {MAX_DEPTH} folders deep: not searched"
    elif agent_name and not is_file:
        problems[path] = "not a regular file (a FIFO, socket or device): not read"
    elif agent_name:
        found.append(path)
