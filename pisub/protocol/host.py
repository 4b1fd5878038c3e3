"""``runs.host``: the parameters of one host command of a named workflow resource, what it
returns, and its journal records (``spec/resources.md``)."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

import msgspec

from pisub.protocol.codec import Record, StrictRecord

MAX_COMMAND_BYTES = 16 * 1024
MAX_TIMEOUT_MS = 24 * 60 * 60 * 1000
MAX_OUTPUT_PATH_BYTES = 240
MAX_PROVIDER_CHARS = 128


class HostParams(StrictRecord, kw_only=True, omit_defaults=True):
    """``runs.host(key, {kind: "command", command, timeoutMs, output?, role?, provider?})``:
    strict input (an unknown field is an error naming it)."""

    kind: Literal["command"]
    command: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_COMMAND_BYTES)]
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=MAX_TIMEOUT_MS)]
    output: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    """A file, relative to the workflow's cwd, the command's output is written to (atomically)."""
    role: Literal["ci", "gate"] | None = None
    provider: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PROVIDER_CHARS)] | None = None


class HostResult(Record, kw_only=True):
    """What ``runs.host`` resolves to (a failure rejects with the same facts in its message)."""

    key: str
    ok: bool
    exit_code: int | None = None
    output: str = ""
    """The head of the command's output (at most 4 KiB)."""
    log_path: str | None = None
    report_path: str | None = None
    """The ``output`` file, absolute."""
    duration_ms: int = 0


class HostState(enum.StrEnum):
    """Where one host step is (``status.hostSteps[].state``)."""

    RUNNING = "running"
    DONE = "done"
    ERROR = "error"
    CANCELLED = "cancelled"


class HostReason(enum.StrEnum):
    """Why a host step did not end ``done`` (``reasonCode``)."""

    EXIT = "exit"
    """It exited nonzero."""
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    """The workflow stopped (its process group was ended)."""
    START = "start"
    """It could not be started (no such program, the command does not split)."""
    OUTPUT = "output"
    """Its ``output`` file could not be written where it was asked for."""
    INTERRUPTED = "interrupted"
    """Its coordinator died while it ran: ``cancelled`` on the repaired run (a resume runs it
    once more); ``error`` when it died twice: not run a third time."""


class JournalHostStarted(Record, tag="host_started", tag_field="t", kw_only=True):
    """A host command is about to run (each counts towards the permit's ``max_calls``)."""

    key: str
    fingerprint: str
    at: str


class JournalHostEnded(Record, tag="host_ended", tag_field="t", kw_only=True):
    """A host command's outcome. ``settled``: a resumed workflow answers the key with it (and
    never runs the command again); a command the workflow's own stop cancelled is not."""

    key: str
    fingerprint: str
    state: HostState
    reason: HostReason | None = None
    error: str | None = None
    """The rejection's message (a failed step)."""
    result: HostResult
    settled: bool = True
    at: str
