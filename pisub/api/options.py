"""The typed inputs of the launchers: a workflow's options (keyword arguments) and what a task
or a lane may be. A task or lane is the checked record (:class:`ChildCall`, :class:`Lane`) or the
same as a JSON object (camelCase names, as in a tasks or lanes file)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from pisub.protocol.lanes import Lane
from pisub.protocol.workflow import ChildCall

TaskInput = ChildCall | Mapping[str, Any]
"""One task of ``launch_parallel`` / ``launch_chain``: ``{key?, agent, task, ...}``."""

LaneInput = Lane | Mapping[str, Any]
"""One lane of ``launch_lanes``: ``{key, defaults?, stages: [{key, agent?, task, ...}]}``."""


class LaunchOptions(TypedDict, total=False):
    """The keyword options of one agent's run (see ``pisub.launch``)."""

    cwd: str | Path | None
    timeout: float | None
    idle_timeout: float | None
    tool_timeout: float | None
    checkpoint_before_deadline: float | None
    tool_budget: dict[str, Any] | None
    acceptance: Any
    gate: str | None
    model: str | None
    on_done: str | None
    backend: str | None
    max_output_bytes: int | None
    max_output_lines: int | None
    artifacts: bool
    include_progress: bool
    session_dir: str | Path | None
    context: str | None
    fork_from: str | None
    parent_session: str | None
    isolation: str | None
    base_ref: str | None
    group: str | None
    priority: int | None
    after: Sequence[str] | None
    label: str | None
    review: bool | None
    home: Path | None


class WorkflowOptions(TypedDict, total=False):
    """The keyword options every workflow launcher takes (see ``launch_workflow``)."""

    cwd: str | Path | None
    concurrency: int | None
    max_spawns: int | None
    state_ns: str | None
    fork_from: str | None
    timeout: float | None
    isolation: str | None
    base_ref: str | None
    usage_budget: dict[str, Any] | None
    on_done: str | None
    backend: str | None
    group: str | None
    priority: int | None
    after: Sequence[str] | None
    label: str | None
    review: bool | None
    mission_id: str | None
    mission: dict[str, Any] | bool | None
    session_key: str | None
    home: Path | None


class StartOptions(LaunchOptions, WorkflowOptions, total=False):
    """Every option ``pisub run`` takes: a single run's and a workflow's (``api.launch.start``
    decides which go together)."""
