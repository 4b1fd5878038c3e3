"""Lanes: ordered stages, many lanes side by side (the input, strict), and the board (the
result, forward-compatible)."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

import msgspec

from pisub.protocol.codec import Record, StrictRecord
from pisub.protocol.fields import BaseRef, Context, Isolation, Key, OutputMode, Seconds, ShortPath

MAX_LANES_BYTES = 64 * 1024
"""A lanes manifest as canonical JSON (sorted keys, no spaces)."""
MAX_LANES = 32
MAX_STAGES_PER_LANE = 16
MAX_STAGES = 64
MAX_BOARD_STRING = 256
"""Bytes of any string on the board (a longer ``outputReference`` is left out)."""

AgentName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class LaneDefaults(StrictRecord, kw_only=True, omit_defaults=True):
    """What every stage of a lane takes unless it says otherwise."""

    agent: AgentName | None = None
    cwd: ShortPath | None = None
    model: ModelName | None = None
    timeout: Seconds | None = None
    idle_timeout: Seconds | None = None
    output_mode: OutputMode | None = None
    context: Context | None = None
    isolation: Isolation | None = None
    base_ref: BaseRef | None = None


class Stage(StrictRecord, kw_only=True, omit_defaults=True):
    """One stage: a child of the workflow keyed ``<lane>.<stage>``."""

    key: Key
    task: Annotated[str, msgspec.Meta(min_length=1, max_length=1024 * 1024)]
    agent: AgentName | None = None
    resume: Literal["previous"] | None = None
    """Continue the previous stage's pi session (never on a lane's first stage)."""
    output: ShortPath | None = None
    output_mode: OutputMode | None = None
    timeout: Seconds | None = None
    idle_timeout: Seconds | None = None
    model: ModelName | None = None
    context: Context | None = None
    cwd: ShortPath | None = None
    isolation: Isolation | None = None
    base_ref: BaseRef | None = None


class Lane(StrictRecord, kw_only=True, omit_defaults=True):
    key: Key
    stages: list[Stage]
    defaults: LaneDefaults | None = None


class StageState(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"
    BLOCKED = "blocked"
    """It returned the verdict ``blocked``, or it could not start (its reason in ``error``)."""
    SKIPPED = "skipped"
    """An earlier stage of its lane did not complete."""


class LaneState(enum.StrEnum):
    COMPLETE = "complete"
    BLOCKED = "blocked"


class StageBoard(Record, kw_only=True, omit_defaults=True):
    key: str
    state: StageState
    ok: bool
    run_id: str | None = None
    output_reference: str | None = None
    verdict: str | None = None
    error: str | None = None


class LaneBoard(Record, kw_only=True, omit_defaults=True):
    key: str
    state: LaneState
    stages: list[StageBoard]
    failed_stage: str | None = None
