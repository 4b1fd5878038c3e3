"""``manifest.json``: the launch request, written once before the runner starts."""

from __future__ import annotations

from typing import Literal

from pisub.protocol.codec import Record

RunnerKind = Literal["external-cli", "pi"]
ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh"]


class Limits(Record, kw_only=True):
    """Resource limits of one run, resolved at launch (caller > agent > defaults)."""

    timeout: float | None
    """Runtime limit in seconds; None means unlimited."""
    idle_timeout: float | None
    """Seconds without child activity before the child is ended; None means unlimited."""
    grace: float
    """Seconds between TERM and KILL."""
    output_cap: int
    """Bytes of each child stream written to its log."""
    output_hard_cap: int
    """Bytes of child output after which the child is stopped."""


class AgentSpec(Record, kw_only=True):
    """The agent definition as resolved at launch; later edits of the agent file do not matter."""

    name: str
    description: str = ""
    runner: RunnerKind
    command: str | None = None
    """The executable: the agent's command, or the resolved pi binary for ``runner: pi``."""
    args: list[str] = []
    system_prompt: str = ""
    source: str | None = None
    """Path of the agent file it came from."""
    model: str | None = None
    tools: list[str] | None = None
    thinking: ThinkingLevel | None = None
    extensions: bool = False
    skills: bool = False
    prompt_templates: bool = False
    trust_project: bool = False
    pi_version: str | None = None
    """The version of ``command`` for ``runner: pi``, detected at launch (it decides how the
    runner talks to pi: :mod:`pisub.pi_versions`)."""


class Manifest(Record, kw_only=True):
    """The launch request. Never changed after the run directory appears."""

    v: Literal[1]
    run_id: str
    created_at: str
    agent: AgentSpec
    task: str
    cwd: str
    umask: int
    """The launcher's umask, given to the child (the runner itself uses 077)."""
    limits: Limits
    resumed_from: str | None = None
    """The run whose session this run continues (``pisub resume``)."""
    session_file: str | None = None
    """The pi session to continue; absent: a new session in ``<run>/session.jsonl``."""
