"""The fence every write of a runner's files passes (runs an engine placed).

A runner that keeps a heartbeat lease (:mod:`pisub.runner.heartbeat`) installs a gate here;
:func:`check` runs it before each write of ``status.json``, ``result.json`` and
``events.jsonl``. A runner whose lease may have lapsed — its process was paused, or renewals have
failed for ``ttl / 2`` — is fenced by the gate (it exits) instead of writing. Readers install no
gate: for them :func:`check` does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

_gate: Callable[[], None] | None = None


def install(gate: Callable[[], None] | None) -> None:
    global _gate
    _gate = gate


def check() -> None:
    if _gate is not None:
        _gate()
