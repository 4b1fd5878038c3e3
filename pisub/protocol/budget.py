"""Usage budgets: what a top-level workflow sets (input: strict) and what its status shows."""

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
