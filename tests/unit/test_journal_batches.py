"""A workflow's journal written in batches (issue 29): entries appended with ``sync=False`` are
made durable by one fsync, and a batch of settled ends is handed to the script only after it."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from pisub.protocol.workflow import ChildCall, ChildResult
from pisub.store.journal import Journal, replay
from pisub.workflow import settling as settling_mod
from pisub.workflow.entries import ChildEntry, Phase
from pisub.workflow.settling import Settling

RUN_A = "00000000-0000-4000-8000-00000000000a"
RUN_B = "00000000-0000-4000-8000-00000000000b"


def _result(key: str) -> ChildResult:
    return ChildResult(key=key, ok=False, state="stopped", output="")


def test_entries_appended_without_sync_share_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.started("a", "f", RUN_A, sync=False)
    journal.started("b", "f", RUN_B, sync=False)
    assert syncs == [] and journal.pending == 2
    journal.sync()
    assert len(syncs) == 1 and journal.pending == 0
    journal.sync()  # nothing pending: no fsync
    assert len(syncs) == 1
    journal.created("a", RUN_A, sync=False)
    journal.ended("a", "f", RUN_A, _result("a"), settled=False, sync=False)
    journal.ended("b", "f", RUN_B, _result("b"), settled=True)  # a durable entry syncs the rest too
    assert len(syncs) == 2 and journal.pending == 0
    journal.close()
    found = replay(path)
    assert found.keys["a"].ended is not None and b'"t":"created"' in path.read_bytes()
    assert found.keys["b"].settled is not None


class _Table:
    """What :class:`Settling` uses of a workflow's table, recording the order of things."""

    def __init__(self, journal: Journal, order: list[str]) -> None:
        self.journal = journal
        self.order = order
        self.lock = threading.RLock()
        self.host = self
        self.watch = self
        self.usage = self

    # host
    def trouble(self, what: str, exc: OSError) -> None:
        self.order.append(f"trouble {what}")

    def event(self, *_a: Any, **_k: Any) -> None:
        pass

    def commit(self) -> None:
        self.order.append("commit")

    def touch(self) -> None:
        pass

    # watch / usage
    def remove(self, _run_id: str) -> None:
        pass

    def active(self) -> bool:
        return False


class _Forwarding:
    def fail_forwards(self, *_a: Any) -> None:
        pass


def test_a_batch_of_ends_is_journaled_with_one_fsync_before_the_script_sees_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    journal = Journal(tmp_path / "journal.jsonl")
    real_sync = journal.sync

    def sync() -> None:
        order.append(f"sync {journal.pending}")
        real_sync()

    monkeypatch.setattr(journal, "sync", sync)
    monkeypatch.setattr(
        settling_mod, "_resolve", lambda _f, _l, outcome: order.append(f"resolve {outcome.key}")
    )
    table = _Table(journal, order)
    settling = Settling(table, None, _Forwarding())  # type: ignore[arg-type]
    entries = []
    for i, run_id in enumerate((RUN_A, RUN_B)):
        call = ChildCall(key=f"k{i}", agent="a", task="t")
        entry = ChildEntry.queued(i, call, "f", tmp_path)
        entry.phase, entry.run_id = Phase.RUNNING, run_id
        entry.futures.append((object(), object()))  # type: ignore[arg-type]
        entries.append(entry)
    with settling.batch():
        for entry in entries:
            settling.settle(entry, _result(entry.key), settled=False)
        assert order == [] and journal.pending == 2  # appended, not yet durable nor handed over
    assert order == ["sync 2", "resolve k0", "resolve k1", "commit"]
    journal.close()
    assert all(replay(tmp_path / "journal.jsonl").keys[e.key].ended is not None for e in entries)
    # outside a batch each end is durable and handed over at once, as before
    order.clear()
    entry = ChildEntry.queued(2, ChildCall(key="k2", agent="a", task="t"), "f", tmp_path)
    entry.phase, entry.run_id = Phase.RUNNING, RUN_A
    entry.futures.append((object(), object()))  # type: ignore[arg-type]
    again = Journal(tmp_path / "journal.jsonl")
    table.journal = again
    settling.settle(entry, _result("k2"), settled=False)
    assert order == ["resolve k2", "commit"] and again.pending == 0
    again.close()
