"""Refinement overlays (the seed's ``refine``, ``refine.show``, ``refine.rollback``): bounded,
project-local guidance added to one agent's system prompt without editing its file.

Where: ``<project>/.pi/subagents/refinements/NAME.md`` (the project is the git root of the
working directory, else the working directory), the overlay in force, and
``NAME.revisions/NNNN.md``, one snapshot for every ``refine`` and every ``rollback``. Each file is
a YAML header (``agent``, ``revision``, ``previous``, ``action``, ``updatedAt``, ``reason``) and
the guidance. ``rollback`` writes a new revision with the guidance of the one before the current
(walking back one step each time); rolling back the first revision removes the overlay. Writes
are atomic, 0600, under a lock on the folder itself (no lock file); a ``.pi``, ``.pi/subagents``
or ``refinements`` that is a symlink is refused (someone could plant one in the repository). At
launch the overlay in force goes at the end of the agent's system prompt inside a
``<pi-subagents-refinement>`` block. pisub does not draft the guidance (pi-subagents runs a
proposal child): the caller gives it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from pisub.errors import InvalidInput, storage_error

MAX_GUIDANCE = 8 * 1024
"""Bytes of guidance an overlay may hold ("bounded")."""
MAX_REVISIONS = 1000
HISTORY_SHOWN = 50
"""Revisions ``refine --show`` lists (the latest)."""
MAX_OVERLAY_FILE = 64 * 1024
TAG = "pi-subagents-refinement"
KEYS = ("guidance", "reason")
RELATIVE = (".pi", "subagents", "refinements")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class Revision(msgspec.Struct, frozen=True):
    """One overlay file: the one in force or a snapshot."""

    agent: str
    revision: int
    previous: int | None
    action: str
    updated_at: str
    reason: str
    guidance: str

    def as_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "revision": self.revision,
            "previous": self.previous,
            "action": self.action,
            "updatedAt": self.updated_at,
            "reason": self.reason,
            "guidance": self.guidance,
        }


def folder(project: Path) -> Path:
    return project.joinpath(*RELATIVE)


def block(rev: Revision) -> str:
    """What goes at the end of the agent's system prompt."""
    return f'<{TAG} agent="{rev.agent}" revision="{rev.revision}">\n{rev.guidance}\n</{TAG}>'


def check_config(config: dict[str, Any]) -> tuple[str, str]:
    """The guidance and reason of a ``refine`` call.

    Raises:
        InvalidInput: another key (refine changes guidance only), a guidance that is no
            string, empty, over :data:`MAX_GUIDANCE` bytes, with control characters or the
            block's closing tag.
    """
    extra = sorted(set(config) - set(KEYS))
    if extra:
        raise InvalidInput(
            f"config.{extra[0][:64]}: refine takes guidance (and reason) only; "
            "change other keys with pisub agents update"
        )
    guidance, reason = config.get("guidance"), config.get("reason", "")
    if not isinstance(guidance, str) or not guidance.strip():
        raise InvalidInput("config.guidance: give the guidance text (a non-empty string)")
    if not isinstance(reason, str) or len(reason) > 500 or _controls(reason.replace("\n", " ")):
        raise InvalidInput("config.reason: a string of at most 500 characters, no control characters")
    if len(guidance.encode("utf-8", "surrogatepass")) > MAX_GUIDANCE:
        raise InvalidInput(f"config.guidance: larger than {MAX_GUIDANCE} bytes")
    if _controls(guidance) or f"</{TAG}" in guidance or "\ud800" <= max(guidance) <= "\udfff":
        raise InvalidInput(f"config.guidance: no control characters, lone surrogates or </{TAG}>")
    return guidance.strip(), reason.strip()


def _controls(text: str) -> bool:
    return any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 for c in text)


def current(project: Path, name: str) -> Revision | None:
    """The overlay in force for ``name``, or None.

    Raises:
        InvalidInput: it cannot be read (why).
    """
    path = _safe_folder(project) / f"{_checked(name)}.md"
    return _read(path) if os.path.lexists(path) else None


def history(project: Path, name: str) -> list[Revision]:
    """The last :data:`HISTORY_SHOWN` snapshots, oldest first (unreadable ones are skipped)."""
    snaps = _safe_folder(project) / f"{_checked(name)}.revisions"
    out = []
    for n in _numbers(snaps)[-HISTORY_SHOWN:]:
        try:
            out.append(_read(snaps / f"{n:04d}.md"))
        except InvalidInput:
            continue
    return out


def refine(project: Path, name: str, guidance: str, reason: str) -> Revision:
    """Write a new revision with ``guidance`` (checked by :func:`check_config`)."""
    with _locked(project) as where:
        now = current(project, name)
        return _commit(where, name, now.revision if now else None, "refine", guidance, reason)


def rollback(project: Path, name: str) -> Revision | None:
    """Put back the guidance in force before the current revision (a new revision); None when
    that was no overlay (the overlay file is removed).

    Raises:
        InvalidInput: there is no overlay to roll back.
    """
    with _locked(project) as where:
        now = current(project, name)
        if now is None:
            raise InvalidInput(f"agent {name!r} has no refinement overlay in {where}")
        before = _snapshot(where, name, now.previous) if now.previous is not None else None
        if before is None:
            _commit(where, name, None, "rollback", "", f"rolled back revision {now.revision}")
            try:
                os.unlink(where / f"{name}.md")
            except OSError as exc:
                raise storage_error(exc, "remove the overlay", where / f"{name}.md") from exc
            return None
        reason = f"restored revision {before.revision}"
        return _commit(where, name, before.previous, "rollback", before.guidance, reason)


def overlays(project: Path, names: Iterable[str]) -> tuple[dict[str, str], dict[Path, str]]:
    """The block of the overlay in force for each of ``names`` (the agents found) in
    ``project``, and the overlay files that could not be read (why). Only those agents' files
    are opened: a folder of planted files costs nothing."""
    try:
        where = _safe_folder(project)
    except InvalidInput as exc:
        return {}, {folder(project): str(exc)}
    if not os.path.isdir(where):
        return {}, {}
    found: dict[str, str] = {}
    problems: dict[Path, str] = {}
    for name in names:
        path = where / f"{name}.md"
        if not _NAME.fullmatch(name) or not os.path.lexists(path):
            continue
        try:
            rev = _read(path)
        except InvalidInput as exc:
            problems[path] = str(exc).removeprefix(f"{path}: ")
            continue
        if rev.agent != name:
            problems[path] = f"its agent {rev.agent[:64]!r} is not the file's name"
        elif rev.guidance:
            found[name] = block(rev)
    return found, problems


def _checked(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidInput(f"agent {name[:64]!r}: a refinement names an agent ({_NAME.pattern})")
    return name


def _safe_folder(project: Path) -> Path:
    """The overlay folder, refusing a symlink anywhere below the project."""
    path = project
    for part in RELATIVE:
        path = path / part
        if os.path.islink(path):
            raise InvalidInput(f"{path} is a symlink: refinement overlays are not read or written through it")
    return path


def _numbers(snaps: Path) -> list[int]:
    if os.path.islink(snaps) or not snaps.is_dir():
        return []
    numbers = []
    with os.scandir(snaps) as it:
        for count, entry in enumerate(it):
            if count > 4 * MAX_REVISIONS:
                break  # a folder stuffed with other names is not listed whole
            stem = entry.name.removesuffix(".md")
            if entry.name.endswith(".md") and stem.isascii() and stem.isdigit() and len(stem) <= 6:
                numbers.append(int(stem))
    return sorted(numbers)


def _snapshot(where: Path, name: str, revision: int) -> Revision | None:
    path = where / f"{name}.revisions" / f"{revision:04d}.md"
    return _read(path) if os.path.lexists(path) else None


def _commit(where: Path, name: str, prior: int | None, action: str, guidance: str, reason: str) -> Revision:
    """Write revision N+1 (its snapshot, then the overlay in force unless it is empty);
    ``prior`` is the revision a rollback of it goes back to."""
    from pisub.protocol.codec import now_iso

    snaps = where / f"{_checked(name)}.revisions"
    numbers = _numbers(snaps)
    number = (numbers[-1] if numbers else 0) + 1
    if number > MAX_REVISIONS:
        raise InvalidInput(f"{snaps}: {MAX_REVISIONS} revisions already; remove old snapshots first")
    rev = Revision(name, number, prior, action, now_iso(), reason, guidance)
    _mkdir(snaps)
    text = _render(rev).encode("utf-8")
    _write(snaps / f"{number:04d}.md", text)
    if guidance:
        _write(where / f"{name}.md", text)
    return rev


def _render(rev: Revision) -> str:
    import yaml

    head = {k: v for k, v in rev.as_json().items() if k != "guidance"}
    return f"---\n{yaml.safe_dump(head, sort_keys=False, allow_unicode=True)}---\n{rev.guidance}\n"


def _read(path: Path) -> Revision:
    """Raises: InvalidInput (why, naming the file)."""
    import yaml

    from pisub.core.fsio import read_bytes

    try:
        data = read_bytes(path, limit=MAX_OVERLAY_FILE)
        if len(data) > MAX_OVERLAY_FILE:
            raise InvalidInput(f"{path}: larger than {MAX_OVERLAY_FILE} bytes")
        text = data.decode("utf-8")
        parts = re.split(r"^---[ \t]*$", text, maxsplit=2, flags=re.MULTILINE)
        head: Any = yaml.safe_load(parts[1]) if len(parts) == 3 else None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise InvalidInput(f"{path}: not an overlay file ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(head, dict) or not isinstance(head.get("agent"), str):
        raise InvalidInput(f"{path}: not an overlay file (no agent in its header)")
    revision, previous = head.get("revision"), head.get("previous")
    if not isinstance(revision, int) or not (previous is None or isinstance(previous, int)):
        raise InvalidInput(f"{path}: revision and previous must be whole numbers")
    guidance = parts[2].strip("\n")
    if len(guidance.encode("utf-8")) > MAX_GUIDANCE or f"</{TAG}" in guidance:
        raise InvalidInput(f"{path}: its guidance is over {MAX_GUIDANCE} bytes or holds </{TAG}>")
    return Revision(
        agent=head["agent"],
        revision=revision,
        previous=previous,
        action=str(head.get("action", "refine")),
        updated_at=str(head.get("updatedAt", "")),
        reason=str(head.get("reason", "")),
        guidance=guidance,
    )


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise storage_error(exc, "create the refinements folder", path) from exc
    if os.path.islink(path):
        raise InvalidInput(f"{path} is a symlink: not written through")


def _write(path: Path, data: bytes) -> None:
    from pisub.core.fsio import atomic_write

    try:
        atomic_write(path, data, mode=0o600)
    except OSError as exc:
        raise storage_error(exc, "write the refinement overlay", path) from exc


@contextmanager
def _locked(project: Path) -> Iterator[Path]:
    from pisub.core.locks import exclusive

    where = _safe_folder(project)
    _mkdir(where)
    # The folder itself is locked: no lock file is left in the repository (a stray file there
    # makes the tree dirty, and --isolation worktree refuses a dirty tree).
    with exclusive(where, timeout=10, directory=True):
        yield where
