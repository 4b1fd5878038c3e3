"""Budgets: a workflow tree's usage budget (what its top-level workflow sets, what its status
shows) and a pi run's tool budget (as given, and as resolved into its limits)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from pisub.protocol.codec import Record, StrictRecord


class Limit(StrictRecord, kw_only=True, omit_defaults=True):
    hard: Annotated[float, msgspec.Meta(gt=0, le=1e15)]
    soft: Annotated[float, msgspec.Meta(gt=0, le=1e15)] | None = None


class UsageBudgetSpec(StrictRecord, kw_only=True, omit_defaults=True):
    """``usageBudget`` of a top-level workflow: tokens (input, output and cache) and cost."""

    tokens: Limit | None = None
    cost_usd: Limit | None = None


class UsageTotals(Record, kw_only=True):
    """``status.json`` ``usage`` of a workflow whose tree has a usage budget."""

    tokens: float
    cost_usd: float
    reserved_tokens: float
    reserved_cost_usd: float
    soft_reached: bool = False
    hard_reached: bool = False


DEFAULT_BLOCKED_TOOLS = ["read", "grep", "find", "ls"]


class ToolBudget(Record, kw_only=True, omit_defaults=True):
    """``toolBudget`` of a pi run: every tool call counts; at ``soft`` the child is nudged (a
    steer), past ``hard`` the ``block`` tools (``"*"``: all) are refused inside pi."""

    hard: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
    soft: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    block: list[Annotated[str, msgspec.Meta(min_length=1, max_length=128)]] = msgspec.field(
        default_factory=lambda: list(DEFAULT_BLOCKED_TOOLS)
    )


class ToolBudgetInput(StrictRecord, kw_only=True, omit_defaults=True):
    """``toolBudget`` as a call, an agent file or the config gives it (strict)."""

    hard: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
    soft: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    block: list[Annotated[str, msgspec.Meta(min_length=1, max_length=128)]] | None = None

    def budget(self) -> ToolBudget:
        block = list(self.block) if self.block is not None else list(DEFAULT_BLOCKED_TOOLS)
        return ToolBudget(hard=self.hard, soft=self.soft, block=block)
