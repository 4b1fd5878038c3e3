"""``<home>/config.toml``: the user's defaults (TOML, keys in snake_case as written). Input
from outside, so strict: an unknown key or a wrong type is an error naming the field."""

from __future__ import annotations

from typing import Annotated

import msgspec

from pisub.protocol.budget import ToolBudgetInput
from pisub.protocol.fields import Context, Key
from pisub.protocol.placement import BackendName, SlurmOptions
from pisub.protocol.workflow import MAX_CONCURRENCY, MAX_SPAWNS_LIMIT

Seconds = Annotated[float, msgspec.Meta(gt=0, le=366 * 86400)]
Bytes = Annotated[int, msgspec.Meta(gt=0, le=2**40)]


class LimitsSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """``[limits]``: a run's limits unless its call or its agent sets them."""

    timeout: Seconds | None = None
    idle_timeout: Seconds | None = None
    output_cap: Bytes | None = None
    output_hard_cap: Bytes | None = None
    tool_timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    """pi runs: milliseconds one tool call may take (``PISUB_TOOL_TIMEOUT_MS`` below it)."""
    tool_timeout_exempt: list[Annotated[str, msgspec.Meta(min_length=1, max_length=128)]] | None = None
    """Tools that wait on purpose: never timed."""
    checkpoint_before_deadline_ms: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    tool_budget: ToolBudgetInput | None = None
    """pi runs: ``{hard, soft?, block?}`` (the tightest of call, agent and this wins)."""


class WorkflowSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """``[workflow]``: a workflow's defaults unless its call sets them."""

    concurrency: Annotated[int, msgspec.Meta(ge=1, le=MAX_CONCURRENCY)] | None = None
    max_spawns: Annotated[int, msgspec.Meta(ge=1, le=MAX_SPAWNS_LIMIT)] | None = None


ResourceName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class ResourceSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """``[workflows.resources.NAME]``: a named workflow resource the user registers
    (``spec/resources.md``): its script and the ceiling of its ``runs.host`` commands."""

    script: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    """An absolute path: a ``.js`` (JavaScript) or ``.py`` (Python) workflow script of the user's."""
    commands: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=16 * 1024)]], msgspec.Meta(max_length=64)
    ] = []
    """The exact commands its ``runs.host`` may run (none: no host commands)."""
    keys: Annotated[list[Key], msgspec.Meta(max_length=64)] = []
    """The host-step keys it may use (empty: any)."""
    description: Annotated[str, msgspec.Meta(max_length=500)] = ""


class WorkflowsSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """``[workflows]``: named workflow resources (``[workflows.resources.NAME]``)."""

    resources: dict[ResourceName, ResourceSection] = {}


class BudgetsSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """``[budgets]``: what one child start reserves from a workflow's usage budget."""

    usage_estimate_tokens: Annotated[float, msgspec.Meta(gt=0, le=1e12)] | None = None
    usage_estimate_cost_usd: Annotated[float, msgspec.Meta(gt=0, le=1e9)] | None = None


class AcceptanceSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """``[acceptance]``: the inference of ``"auto"``, review gates, the verify cache."""

    infer: bool | None = None
    """``"auto"`` resolves through the inference table (default true); false: to level none."""
    review: bool | None = None
    """Review runs for inferred reviews (default off: a required review is recorded, not run)."""
    reviewer: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")] | None = None
    """The agent a review gate runs when it names none (default ``reviewer``)."""
    verify_env: list[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]] | None = None
    """Environment variables whose values are part of the verify cache's key (names only)."""


class PlacementSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """``[placement]``: where runs' runners live unless the call or the agent file says."""

    backend: BackendName | None = None
    heartbeat_ttl: Annotated[float, msgspec.Meta(ge=4, le=3600)] | None = None
    """Seconds a runner placed by an engine may go without renewing its heartbeat lease (30)."""


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """The whole file; every section and key is optional."""

    limits: LimitsSection = msgspec.field(default_factory=LimitsSection)
    workflow: WorkflowSection = msgspec.field(default_factory=WorkflowSection)
    budgets: BudgetsSection = msgspec.field(default_factory=BudgetsSection)
    workflows: WorkflowsSection = msgspec.field(default_factory=WorkflowsSection)
    acceptance: AcceptanceSection = msgspec.field(default_factory=AcceptanceSection)
    placement: PlacementSection = msgspec.field(default_factory=PlacementSection)
    default_subagent_context: Context | None = None
    """How a pi run begins when its call says no ``context`` (before the agent's
    ``defaultContext``): ``fresh``, or ``fork`` (a preference: fresh without a session to fork)."""
    slurm: SlurmOptions | None = None
    """``[slurm]``: what Slurm runs ask of the engine unless their agent file says."""
