"""JSON Schemas of every file, generated from the Structs (``spec/schemas/<name>.json``)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from pisub.protocol.acceptance import AcceptanceSpec
from pisub.protocol.agent import AgentFrontmatter
from pisub.protocol.budget import UsageBudgetSpec
from pisub.protocol.cache import PiVersions, VerifyCacheEntry
from pisub.protocol.config import Config
from pisub.protocol.control import Receipt, Request
from pisub.protocol.events import Event
from pisub.protocol.handoff import Handoff
from pisub.protocol.lanes import Lane, LaneBoard
from pisub.protocol.lease import Brief, LeaseOwner
from pisub.protocol.manifest import Manifest
from pisub.protocol.mission import Mission, MissionInput, MissionProject, MissionUpdate
from pisub.protocol.placement import Heartbeat, Placement
from pisub.protocol.queue import GroupConfig, QueueEntry
from pisub.protocol.result import Result
from pisub.protocol.schedule import Fire, Schedule
from pisub.protocol.schedule_timer import TimerRecord
from pisub.protocol.status import Status
from pisub.protocol.workflow import ChildCall, ChildResult, JournalEntry, SharedState
from pisub.protocol.worktree import WorktreeRecord

SCHEMAS: dict[str, Any] = {
    "manifest": Manifest,
    "status": Status,
    "event": Event,
    "result": Result,
    "agent-frontmatter": AgentFrontmatter,
    "request": Request,
    "receipt": Receipt,
    "lease": LeaseOwner,
    "brief": Brief,
    "journal-entry": JournalEntry,
    "shared-state": SharedState,
    "child-result": ChildResult,
    "tasks": list[ChildCall],
    "lanes": list[Lane],
    "lane-board": list[LaneBoard],
    "handoff": Handoff,
    "worktree-record": WorktreeRecord,
    "config": Config,
    "usage-budget": UsageBudgetSpec,
    "acceptance": AcceptanceSpec,
    "placement": Placement,
    "heartbeat": Heartbeat,
    "pi-versions": PiVersions,
    "verify-cache": VerifyCacheEntry,
    "group": GroupConfig,
    "queue-entry": QueueEntry,
    "mission": Mission,
    "mission-update": MissionUpdate,
    "mission-input": MissionInput,
    "mission-project": MissionProject,
    "schedule": Schedule,
    "schedule-fire": Fire,
    "schedule-timer": TimerRecord,
}
"""File name (without ``.json``) → the type it describes."""


def render(name: str) -> str:
    """The schema text for ``spec/schemas/<name>.json``."""
    schema = msgspec.json.schema(SCHEMAS[name])
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"pisub {name}"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
