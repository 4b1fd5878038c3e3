"""Views of many runs at once: the fleet (one line per live run or child) and a transcript (the
tail of a child's output, or of its pi session once the log is gone)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from pisub.core.redact import redact
from pisub.errors import PisubError
from pisub.protocol.codec import Record
from pisub.protocol.status import Status, StepState
from pisub.store.paths import Home, RunPaths

DEFAULT_LINES = 80
MAX_LINES = 500
TAIL_BYTES = 512 * 1024


class FleetRow(Record, kw_only=True):
    """One live run, or one live child of a workflow."""

    run_id: str | None
    key: str | None
    parent_run_id: str | None
    agent: str
    state: str
    started_at: str | None
    last_activity_at: str | None
    turns: int = 0
    tools: int = 0
    current_tool: str | None = None
    steers_requested: int = 0
    steers_delivered: int = 0
    steers_failed: int = 0
    label: str | None = None
    """The run's ``--label`` (a queued child: none)."""
    task: str | None = None
    """The head of the run's task (a queued child: none)."""
    cwd: str | None = None
    """The directory the run's child works in."""


def fleet_of(statuses: Iterable[Status], *, live_only: bool = True) -> list[FleetRow]:
    """A row per run of ``statuses`` that is still going (every one, without ``live_only``),
    and one per queued child of a workflow among them (it has no run yet)."""
    rows = []
    for status in statuses:
        if live_only and status.state.is_terminal:
            continue
        rows.append(_row(status))
        if status.runner == "workflow":
            rows += [
                _queued(status, step.key, step.agent, str(step.status))
                for step in status.steps
                if step.run_id is None and (not live_only or step.status == StepState.QUEUED)
            ]
    return rows


def children_of(home: Home, workflow: Status) -> list[Status]:
    """The statuses of a workflow's children that have a run (after crash repair)."""
    from pisub.runs.reconcile import observe

    found = []
    for step in workflow.steps:
        if step.run_id is not None:
            try:
                found.append(observe(home.run(step.run_id)))
            except PisubError:
                continue
    return found


def _row(status: Status) -> FleetRow:
    step = status.steps[0] if status.steps and status.runner != "workflow" else None
    ledger = status.steering
    return FleetRow(
        run_id=status.run_id,
        key=status.key,
        parent_run_id=status.parent_run_id,
        agent=status.agent,
        state=str(status.state),
        started_at=status.started_at,
        last_activity_at=step.last_activity_at if step is not None else status.updated_at,
        turns=step.turn_count if step is not None else 0,
        tools=step.tool_count if step is not None else 0,
        current_tool=step.current_tool if step is not None else None,
        steers_requested=ledger.requested,
        steers_delivered=ledger.delivered,
        steers_failed=ledger.failed + ledger.rejected,
        label=status.label,
        task=status.task,
        cwd=status.cwd,
    )


def _queued(parent: Status, key: str | None, agent: str | None, state: str) -> FleetRow:
    return FleetRow(
        run_id=None,
        key=key,
        parent_run_id=parent.run_id,
        agent=agent or "?",
        state=state,
        started_at=None,
        last_activity_at=None,
    )


def transcript(paths: RunPaths, lines: int = DEFAULT_LINES) -> list[str]:
    """The last ``lines`` lines of a run's output log — or, once the log is gone, of its pi
    session's messages (``role: text``) — redacted: they leave the run directory.

    Lines are split only at a newline (a CRLF is a newline): a carriage return, U+2028, NEL
    or a file separator inside a line stays in it, as ``logs`` shows it. A byte that is not
    UTF-8 is kept as a lone surrogate (``surrogateescape``): the caller escapes it (a terminal:
    :func:`pisub.termsafe.printable`; JSON: :func:`json_lines_of`). A log that is not a regular file
    (a FIFO, a symlink) or cannot be read is a :class:`~pisub.errors.StorageError`, as in ``logs``."""
    from pisub.errors import InvalidInput

    if not 1 <= lines <= MAX_LINES:
        raise InvalidInput(f"--lines must be 1 to {MAX_LINES}")
    log = paths.output_log(0)
    data = read_log_tail(log, keep_cut=True)
    if data is None:
        found = _last(session_lines(_session_of(paths)), lines)
    else:
        found = _last(split_lines(data.decode("utf-8", "surrogateescape")), lines)
    return [redact(line) for line in found]


def _session_of(paths: RunPaths) -> Path:
    """The run's pi session (in its ``sessionDir`` when it was given one)."""
    from pisub.errors import PisubError
    from pisub.store.runs import load_manifest

    try:
        manifest = load_manifest(paths)
    except PisubError:
        return paths.session
    return paths.pi_session(manifest.session_file, manifest.session_dir)


def open_log(log: Path) -> int | None:
    """A descriptor of a run's log, None when it does not exist. Anything else than a readable
    regular file (a FIFO, a symlink, no permission) is a ``StorageError`` (``IO_ERROR``)."""
    from pisub.core.fsio import open_regular
    from pisub.errors import storage_error

    try:
        return open_regular(log)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise storage_error(exc, "read", log) from exc


TAIL_BLOCK = 64 * 1024


def tail_offset(log: Path, lines: int) -> int:
    """Where the last ``lines`` lines of ``log`` begin (a last line without its newline counts;
    0 when it has no more; the log read backwards, a block at a time). A missing log: 0.

    Raises:
        StorageError: the log is not a readable regular file (:func:`open_log`).
    """
    from pisub.errors import storage_error

    fd = open_log(log)
    if fd is None:
        return 0
    try:
        end = os.fstat(fd).st_size
        if lines <= 0:
            return end
        last = os.pread(fd, 1, end - 1) if end else b""
        wanted = lines + (1 if last == b"\n" else 0)  # a final newline ends the last line
        pos = end
        while pos > 0:
            start = max(0, pos - TAIL_BLOCK)
            block = os.pread(fd, pos - start, start)
            at = len(block)
            while (at := block.rfind(b"\n", 0, at)) >= 0:
                wanted -= 1
                if wanted == 0:
                    return start + at + 1
            pos = start
        return 0
    except OSError as exc:
        raise storage_error(exc, "read", log) from exc
    finally:
        os.close(fd)


CUT = "\u2026"
"""What begins a transcript's first line when its start lies before the bytes read (a line
longer than :data:`TAIL_BYTES`: its end is shown, never nothing)."""


def read_log_tail(log: Path, nbytes: int = TAIL_BYTES, *, keep_cut: bool = False) -> bytes | None:
    """The last ``nbytes`` of the log from its first whole line; None when it does not
    exist (:func:`open_log`). ``keep_cut``: a tail that begins inside a line keeps the part of
    that line it holds (from its first whole character) behind :data:`CUT` — else a last line
    longer than ``nbytes`` would leave nothing."""
    from pisub.errors import storage_error

    fd = open_log(log)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - nbytes)
        before = os.pread(fd, 1, start - 1) if start else b"\n"  # the byte before the tail
        data = os.pread(fd, nbytes, start)
    except OSError as exc:
        raise storage_error(exc, "read", log) from exc
    finally:
        os.close(fd)
    if before == b"\n":  # the tail begins with a whole line
        return data
    if keep_cut:  # the tail begins inside a line, maybe inside a character: from the next one
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] <= 0xBF:
            skip += 1
        rest = data[skip:]
        return rest[1:] if rest[:1] == b"\n" else CUT.encode() + rest  # (nothing of it read: no line)
    return data[data.find(b"\n") + 1 :] if b"\n" in data else data


def split_lines(text: str) -> list[str]:
    """``text`` split only at ``\n`` (a CRLF is one newline); a final newline ends the last line."""
    found = text.replace("\r\n", "\n").split("\n")
    return found[:-1] if found and found[-1] == "" else found


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_lines_of(lines: list[str]) -> tuple[list[str], bool]:
    """``lines`` for JSON, which cannot carry a lone surrogate: each byte that was not UTF-8
    (a ``surrogateescape`` surrogate) becomes U+FFFD, every other character stays as it is (a
    carriage return, U+2028, a control character: JSON escapes them); the flag says whether a
    byte was replaced (the exact bytes: ``pisub logs --raw``)."""
    fixed = [_SURROGATE.sub("\ufffd", line) for line in lines]
    return fixed, fixed != lines


def session_lines(session: Path) -> list[str]:
    """A pi session's messages as text lines (tool calls and results in brackets); none when
    it does not exist. A line that is not JSON, or nested too deeply to parse, is skipped.

    Raises:
        StorageError: the session is not a readable regular file (a FIFO, a symlink), as a log.
    """
    data = read_log_tail(session, TAIL_BYTES * 4) or b""
    found: list[str] = []
    for raw in data.splitlines():
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        message = entry.get("message") if isinstance(entry, dict) and entry.get("type") == "message" else None
        if isinstance(message, dict):
            found += _message_lines(message)
    return found


def _message_lines(message: dict[str, object]) -> list[str]:
    role = str(message.get("role", "?"))
    content = message.get("content")
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif block.get("type") == "toolCall":
                parts.append(f"[tool call: {block.get('name', '?')}]")
    text = "\n".join(p for p in parts if p)
    if not text:
        return []
    first, *rest = split_lines(text) or [""]
    return [f"{role}: {first}", *rest]


def _last(items: list[str], count: int) -> list[str]:
    return items[-count:]


class InterleavedLogs:
    """A workflow's children's output logs as ``[key] line`` lines, each child's in order and
    the children's interleaved as they are read; a line is given once it is complete (or when
    ``final``). Children that start later are picked up; unreadable logs are skipped. A byte that
    is not UTF-8 is kept as a lone surrogate (``surrogateescape``): the caller escapes it."""

    def __init__(self, home: Home, workflow: RunPaths) -> None:
        self.home = home
        self.workflow = workflow
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}

    def read(self, *, final: bool = False) -> list[str]:
        from pisub.store.runs import load_status

        try:
            steps = load_status(self.workflow).steps
        except PisubError:
            return []
        lines: list[str] = []
        for step in steps:
            if step.run_id is None:
                continue
            lines += self._new_lines(step.key or str(step.index), step.run_id, final)
        return lines

    def _new_lines(self, key: str, run_id: str, final: bool) -> list[str]:
        from pisub.core.fsio import open_regular

        log = self.home.run(run_id).output_log(0)
        offset = self.offsets.get(run_id, 0)
        try:
            fd = open_regular(log)
        except OSError:
            return []
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            data = b""
            while chunk := os.read(fd, 1 << 16):
                data += chunk
                if len(data) > 8 << 20:
                    break  # the rest on the next read
        except OSError:
            return []
        finally:
            os.close(fd)
        self.offsets[run_id] = offset + len(data)
        buffered = self.partial.get(run_id, b"") + data
        *complete, rest = buffered.split(b"\n")
        if final and rest:
            complete, rest = [*complete, rest], b""
        self.partial[run_id] = rest
        return [f"[{key}] {line.decode('utf-8', 'surrogateescape')}" for line in complete]
