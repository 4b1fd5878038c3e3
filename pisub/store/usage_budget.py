"""A tree of runs' usage budget (tokens, cost), set by its top-level workflow, kept in
``budgets/<root>/usage.json`` under the budget directory's lock.

Unlike a budget that only sums what finished, every child start **reserves**
``min(remaining, estimate)`` before it starts and gives back what it did not use when it
ends, so concurrent children cannot all start against the same remainder. A start is refused
(``USAGE_BUDGET_EXCEEDED``) once nothing remains. The bound: the tree's usage never exceeds
``hard`` by more than what the children running when it was reached use beyond their
reservations (so never, while each child stays within the estimate).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path

import msgspec

from pisub.core.fsio import atomic_write, load_json, private_mkdir
from pisub.core.locks import exclusive
from pisub.errors import PisubError, ProtocolError, storage_error
from pisub.protocol.budget import UsageBudgetSpec, UsageTotals
from pisub.protocol.codec import Record, encode_pretty
from pisub.protocol.result import Usage

MAX_LEDGER = 4 * 1024 * 1024


class UsageBudgetExceeded(PisubError):
    """A child start would spend from a usage budget that has nothing left."""

    code = "USAGE_BUDGET_EXCEEDED"


class Spend(Record, kw_only=True):
    reserved_tokens: float = 0.0
    reserved_cost: float = 0.0
    used_tokens: float = 0.0
    used_cost: float = 0.0
    ended: bool = False


class Ledger(Record, kw_only=True):
    v: int = 1
    budget: UsageBudgetSpec
    estimate_tokens: float
    estimate_cost: float
    spends: dict[str, Spend] = msgspec.field(default_factory=dict)


def tokens_of(usage: Usage) -> float:
    """Every token a child used, cache tokens included."""
    return float(usage.input + usage.output + usage.cache_read + usage.cache_write)


class UsageBudget:
    """One tree's usage budget (a no-op when the tree has none)."""

    def __init__(self, budgets: Path, budget_id: str) -> None:
        self.dir = budgets / budget_id
        self.path = self.dir / "usage.json"
        self.expected = os.path.lexists(self.path)
        """This tree had a budget when this workflow started (or it set one): a ledger that
        disappears since fails closed rather than lifting the budget."""

    def create(self, spec: UsageBudgetSpec, estimate_tokens: float, estimate_cost: float) -> None:
        """Set the tree's budget (by its top-level workflow; kept if one is there already)."""
        ledger = Ledger(budget=spec, estimate_tokens=estimate_tokens, estimate_cost=estimate_cost)
        with self._locked():
            if not os.path.lexists(self.path):
                self._save(ledger)
        self.expected = True

    def active(self) -> bool:
        """Whether the tree has a budget.

        Raises:
            ProtocolError: its ledger disappeared while this workflow ran.
        """
        if os.path.lexists(self.path):
            return True
        if self.expected:
            raise ProtocolError(
                f"the usage ledger {self.path} disappeared while the workflow ran; no child starts "
                "without its budget (resume the workflow with a new budget)"
            )
        return False

    def reserve(self, names: Iterable[str]) -> None:
        """Reserve for each start (a name reserved before costs nothing), all or none.

        Raises:
            UsageBudgetExceeded: nothing remains for one of them; nothing was reserved.
        """
        if not self.active():
            return
        with self._locked():
            ledger = self._load()
            for name in names:
                known = ledger.spends.get(name)
                if known is not None and not known.ended:
                    continue  # reserved already (a re-attached child)
                tokens_left, cost_left = _remaining(ledger)
                if tokens_left <= 0 or cost_left <= 0:
                    what = "tokens" if tokens_left <= 0 else "cost"
                    raise UsageBudgetExceeded(
                        f"the usage budget of this tree of runs is spent ({what}); no child of this "
                        "batch was started (raise usageBudget at the top-level workflow)"
                    )
                spend = known if known is not None else Spend()
                spend.reserved_tokens = min(tokens_left, ledger.estimate_tokens)
                spend.reserved_cost = min(cost_left, ledger.estimate_cost)
                spend.ended = False
                ledger.spends[name] = spend
            self._save(ledger)

    def release(self, names: Iterable[str]) -> None:
        """Give back the reservations of starts that did not happen."""
        if not self.active():
            return
        with self._locked():
            ledger = self._load()
            for name in names:
                spend = ledger.spends.get(name)
                if spend is not None and not spend.ended:
                    spend.reserved_tokens = spend.reserved_cost = 0.0
                    spend.ended = True
            self._save(ledger)

    def settle(self, name: str, usage: Usage | None) -> None:
        """A child ended: its usage is counted and its reservation given back."""
        if not self.active():
            return
        with self._locked():
            ledger = self._load()
            spend = ledger.spends.get(name)
            if spend is None or spend.ended:
                return
            spend.used_tokens += tokens_of(usage) if usage is not None else 0.0
            spend.used_cost += float(usage.cost) if usage is not None else 0.0
            spend.reserved_tokens = spend.reserved_cost = 0.0
            spend.ended = True
            self._save(ledger)

    def totals(self) -> UsageTotals | None:
        try:
            if not self.active():
                return None
            ledger = self._load()
        except PisubError:
            return None
        return _totals(ledger)

    def _locked(self) -> AbstractContextManager[None]:
        try:
            private_mkdir(self.dir.parent)
            private_mkdir(self.dir)
        except OSError as exc:
            raise storage_error(exc, "create", self.dir) from exc
        return exclusive(self.dir, directory=True)

    def _load(self) -> Ledger:
        try:
            return load_json(self.path, Ledger, limit=MAX_LEDGER)
        except OSError as exc:
            raise storage_error(exc, "read", self.path) from exc

    def _save(self, ledger: Ledger) -> None:
        try:
            atomic_write(self.path, encode_pretty(ledger))
        except OSError as exc:
            raise storage_error(exc, "write", self.path) from exc


def _spent(ledger: Ledger) -> tuple[float, float]:
    tokens = sum(s.used_tokens + s.reserved_tokens for s in ledger.spends.values())
    cost = sum(s.used_cost + s.reserved_cost for s in ledger.spends.values())
    return tokens, cost


def _remaining(ledger: Ledger) -> tuple[float, float]:
    tokens, cost = _spent(ledger)
    budget = ledger.budget
    tokens_left = budget.tokens.hard - tokens if budget.tokens is not None else float("inf")
    cost_left = budget.cost_usd.hard - cost if budget.cost_usd is not None else float("inf")
    return tokens_left, cost_left


def _totals(ledger: Ledger) -> UsageTotals:
    used_tokens = sum(s.used_tokens for s in ledger.spends.values())
    used_cost = sum(s.used_cost for s in ledger.spends.values())
    reserved_tokens = sum(s.reserved_tokens for s in ledger.spends.values())
    reserved_cost = sum(s.reserved_cost for s in ledger.spends.values())
    budget = ledger.budget
    soft = any(
        limit is not None and limit.soft is not None and used >= limit.soft
        for limit, used in ((budget.tokens, used_tokens), (budget.cost_usd, used_cost))
    )
    left_tokens, left_cost = _remaining(ledger)
    return UsageTotals(
        tokens=used_tokens,
        cost_usd=round(used_cost, 6),
        reserved_tokens=reserved_tokens,
        reserved_cost_usd=round(reserved_cost, 6),
        soft_reached=soft,
        hard_reached=left_tokens <= 0 or left_cost <= 0,
    )
