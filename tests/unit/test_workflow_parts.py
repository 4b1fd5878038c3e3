"""The pieces of a workflow run that need no process: journal, budget, state, calls, receipts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import pytest

from pisub.errors import FanoutLimit, InvalidInput
from pisub.protocol.control import Receipt, ReceiptState, Target, advance_target, aggregate
from pisub.protocol.workflow import ChildResult
from pisub.store.journal import Journal, replay
from pisub.store.shared_state import MAX_STATE_BYTES, StateNamespace
from pisub.store.spawn_budget import SpawnBudget
from pisub.workflow.calls import fingerprint, from_mapping, from_python, tasks_from

RUN_A = "00000000-0000-4000-8000-00000000000a"
RUN_B = "00000000-0000-4000-8000-00000000000b"


def _result(key: str, state: Literal["complete", "paused"] = "complete") -> ChildResult:
    return ChildResult(key=key, ok=state == "complete", state=state, output=f"out {key}")


def test_the_journal_replays_starts_ends_and_owners(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.owned_by(RUN_A)
    journal.started("done", "f1", RUN_A)
    journal.ended("done", "f1", RUN_A, _result("done"), settled=True)
    journal.started("running", "f2", RUN_B)
    journal.started("paused", "f3", RUN_A)
    journal.ended("paused", "f3", RUN_A, _result("paused", "paused"), settled=False)
    journal.close()
    with path.open("ab") as fh:
        fh.write(b'not json\n{"t":"started","key":"torn"')  # a garbage line and a torn tail
    found = replay(path)
    assert found.owner == RUN_A and found.skipped == 1
    assert found.keys["done"].settled is not None and found.keys["done"].settled.output == "out done"
    assert found.keys["running"].run_id == RUN_B and found.keys["running"].ended is None
    assert found.keys["paused"].settled is None and found.keys["paused"].ended is not None
    assert "torn" not in found.keys
    again = Journal(path)  # the next writer cuts the torn tail off
    again.owned_by(RUN_B)
    again.close()
    assert replay(path).owner == RUN_B and path.read_bytes().endswith(b"}\n")
    assert replay(tmp_path / "none.jsonl").keys == {}


def test_the_spawn_budget_claims_a_batch_whole_or_not_at_all(tmp_path: Path) -> None:
    budget = SpawnBudget(tmp_path / "budgets", RUN_A, limit=3)
    budget.claim("j", ["a", "b"])
    with pytest.raises(FanoutLimit) as caught:
        budget.claim("j", ["c", "d"])
    assert caught.value.code == "RUN_FANOUT_LIMIT" and "1 left" in caught.value.message
    assert budget.used() == 2
    budget.claim("j", ["a", "b", "c"])  # a and b are claimed already: only c costs
    assert budget.used() == 3
    later = SpawnBudget(tmp_path / "budgets", RUN_A, limit=100)  # the tree's first limit holds
    with pytest.raises(FanoutLimit):
        later.claim("other journal", ["a"])


def test_state_merges_keys_and_refuses_what_is_not_json(tmp_path: Path) -> None:
    one, two = StateNamespace(tmp_path, "ns"), StateNamespace(tmp_path, "ns")
    one.set("a", 1)
    two.set("b", [1, {"c": None}])
    assert one.get("b") == [1, {"c": None}] and two.get("a") == 1 and one.get("zzz") is None
    for bad in (math.nan, {1: 2}, {"x"}, object(), "\udcff"):
        with pytest.raises(InvalidInput):
            one.set("bad", bad)
    with pytest.raises(InvalidInput) as caught:
        one.set("big", "x" * MAX_STATE_BYTES)
    assert "would be" in caught.value.message
    assert one.get("big") is None
    for name in ("../x", "", "a" * 129, "x/y"):
        with pytest.raises(InvalidInput):
            StateNamespace(tmp_path, name)


def test_calls_are_checked_with_the_callers_names() -> None:
    call = from_python(
        "k", {"agent": "a", "task": "t", "output_mode": "file-only", "idle_timeout": 5}, "runs.run"
    )
    assert call.output_mode == "file-only" and call.idle_timeout == 5
    with pytest.raises(InvalidInput) as caught:
        from_python("k", {"agent": "a", "task": "t", "output_mode": "x"}, "runs.run('k')")
    assert "`output_mode`" in caught.value.message and "runs.run('k')" in caught.value.message
    with pytest.raises(InvalidInput) as caught:
        from_mapping({"agent": "a", "task": "t", "outputMode": "x"}, "tasks[0]")
    assert "outputMode" in caught.value.message
    for bad in ("", "-x", "a b", "x" * 129, 7):
        with pytest.raises(InvalidInput):
            from_python(bad, {"agent": "a", "task": "t"}, "runs.run")
    with pytest.raises(InvalidInput):
        from_python("k", {"agent": "a", "task": "t", "timeout": math.inf}, "runs.run")


def test_tasks_get_default_keys_and_keys_are_unique() -> None:
    calls = tasks_from([{"agent": "a", "task": "x"}, {"key": "mine", "agent": "a", "task": "y"}], "tasks")
    assert [c.key for c in calls] == ["task-1", "mine"]
    with pytest.raises(InvalidInput) as caught:
        tasks_from(
            [{"key": "k", "agent": "a", "task": "x"}, {"key": "k", "agent": "a", "task": "y"}], "tasks"
        )
    assert "tasks[1]" in caught.value.message
    for bad in ([], [1], [{"agent": "a"}], [{"agent": "a", "task": "x", "nope": 1}]):
        with pytest.raises(InvalidInput):
            tasks_from(bad, "tasks")


def test_a_fingerprint_names_the_parameters() -> None:
    one = from_python("k", {"agent": "a", "task": "t"}, "w")
    same = from_mapping({"task": "t", "agent": "a", "key": "k"}, "w")
    other = from_python("k", {"agent": "a", "task": "t2"}, "w")
    assert fingerprint(one) == fingerprint(same) != fingerprint(other)


def test_a_receipt_with_many_targets_follows_them() -> None:
    from pisub.store.mailbox import make_receipt

    def receipt() -> Receipt:
        targets = [Target(child=i, state=ReceiptState.PENDING) for i in range(3)]
        return make_receipt(RUN_A, "r", "steer", ReceiptState.PENDING, targets=targets)

    mixed = receipt()
    assert advance_target(mixed, 0, ReceiptState.QUEUED)
    assert str(mixed.state) == "pending"
    advance_target(mixed, 1, ReceiptState.DELIVERED)
    advance_target(mixed, 2, ReceiptState.QUEUED)
    assert str(mixed.state) == "queued"
    advance_target(mixed, 0, ReceiptState.DELIVERED)
    advance_target(mixed, 2, ReceiptState.FAILED, "it ended")
    assert mixed.state == ReceiptState.PARTIAL and mixed.reason == "child 2: it ended"
    assert not advance_target(mixed, 2, ReceiptState.DELIVERED)  # a final target stays
    assert aggregate([Target(child=0, state=ReceiptState.FAILED)]) == ReceiptState.FAILED
    assert aggregate([Target(child=0, state=ReceiptState.DELIVERED)]) == ReceiptState.DELIVERED
    assert aggregate([]) == ReceiptState.FAILED


def test_a_steer_id_is_the_same_in_every_run_of_a_workflow_and_names_one_call() -> None:
    from pisub.protocol.control import REQUEST_ID_RE
    from pisub.workflow.forwarding import steer_id

    journal = "/home/u/.pisub/runs/x/journal.jsonl"
    assert steer_id(journal, "a", 0) == steer_id(journal, "a", 0)
    ids = {steer_id(j, k, n) for j in (journal, journal + "2") for k in ("a", "b") for n in (0, 1)}
    assert len(ids) == 8
    longest = steer_id("/" + "d" * 4000 + "\udcff", "k" * 128, 10**6)  # any path, the longest key
    assert REQUEST_ID_RE.fullmatch(longest)
