"""The dispatcher without a runner: every request gets one receipt, advanced only forward, and a
rejected file moves only once its receipt is published."""

from __future__ import annotations

import os
from typing import Any

import pytest

from pisub.core.fsio import create_exclusive, private_mkdir
from pisub.protocol.codec import encode
from pisub.protocol.control import Ledger, ReceiptState, RecoveryClaim
from pisub.runner.dispatch import RECOVERY_REASON, Dispatcher
from pisub.store.mailbox import FINISHED_REASON, read_receipt
from pisub.store.paths import RunPaths
from tests.helpers import drop_request

RUN_ID = "1" * 8 + "-0000-4000-8000-" + "1" * 12


class Controller:
    """The supervisor's side, as the dispatcher sees it: records calls, refuses on request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.refusal: str | None = None

    def steer(self, child: int, request_id: str, message: str, behavior: str) -> str | None:
        self.calls.append(("steer", (request_id, message, behavior)))
        return self.refusal

    def interrupt(self, child: int | None, reason: str | None) -> str | None:
        self.calls.append(("interrupt", reason))
        return self.refusal

    def stop(self, child: int | None, reason: str | None) -> str | None:
        self.calls.append(("stop", reason))
        return self.refusal


@pytest.fixture
def run(bare_run: RunPaths) -> RunPaths:
    return bare_run


def _dispatcher(paths: RunPaths, controller: Controller) -> tuple[Dispatcher, list[str]]:
    events: list[str] = []
    errors: list[str] = []

    def on_event(type_: str, child: int | None = None, **data: object) -> None:
        events.append(type_)

    dispatcher = Dispatcher(
        paths, RUN_ID, Ledger(), controller, lambda: None, on_event, lambda what, exc: errors.append(what)
    )
    return dispatcher, errors


def test_a_steer_goes_pending_then_queued_then_delivered_and_never_back(run: RunPaths) -> None:
    dispatcher, _ = _dispatcher(run, Controller())
    drop_request(run, "s.json", {"v": 1, "type": "steer", "message": "hi"})
    assert dispatcher.scan() == 1
    receipt = read_receipt(run, "s")
    assert receipt is not None and receipt.state == ReceiptState.PENDING
    dispatcher.update("s", ReceiptState.QUEUED)
    dispatcher.update("s", ReceiptState.DELIVERED)
    dispatcher.update("s", ReceiptState.FAILED, reason="too late")  # final: ignored
    final = read_receipt(run, "s")
    assert (
        final is not None and final.state == ReceiptState.DELIVERED and final.delivery_status == "delivered"
    )
    assert final.targets[0].delivered_at is not None
    assert (dispatcher.ledger.requested, dispatcher.ledger.queued, dispatcher.ledger.delivered) == (1, 1, 1)


def test_a_refused_steer_gets_one_final_receipt_with_every_field_set(run: RunPaths) -> None:
    controller = Controller()
    controller.refusal = "the child has already exited"
    dispatcher, _ = _dispatcher(run, controller)
    drop_request(run, "s.json", {"v": 1, "type": "steer", "message": "hi"})
    dispatcher.scan()
    receipt = read_receipt(run, "s")
    assert receipt is not None and receipt.state == ReceiptState.FAILED
    assert receipt.reason == "the child has already exited" and receipt.delivery_status == "queued"
    assert receipt.updated_at >= receipt.created_at and receipt.targets[0].state == ReceiptState.FAILED


def test_stop_and_interrupt_are_delivered_once_acted_on(run: RunPaths) -> None:
    controller = Controller()
    dispatcher, _ = _dispatcher(run, controller)
    drop_request(run, "a.json", {"v": 1, "type": "interrupt", "reason": "enough"})
    drop_request(run, "b.json", {"v": 1, "type": "stop"})
    dispatcher.scan()
    assert [call[0] for call in controller.calls] == ["interrupt", "stop"], "in name order"
    assert {rid: read_receipt(run, rid).state for rid in "ab"} == {  # type: ignore[union-attr]
        "a": ReceiptState.DELIVERED,
        "b": ReceiptState.DELIVERED,
    }


def test_a_bad_file_and_a_duplicate_are_rejected_after_their_receipt(run: RunPaths) -> None:
    dispatcher, _ = _dispatcher(run, Controller())
    drop_request(run, "x.json", {"v": 1, "type": "stop"})
    dispatcher.scan()
    first = (run.outbox / "x.json").read_bytes()
    drop_request(run, "x.json", {"v": 1, "type": "interrupt"})
    drop_request(run, "bad.json", b"{")
    dispatcher.scan()
    assert (run.outbox / "x.json").read_bytes() == first, "the first request's receipt is left alone"
    bad = read_receipt(run, "bad")
    assert bad is not None and bad.state == ReceiptState.REJECTED
    rejected = sorted(p.name for p in run.box("rejected").iterdir())
    assert rejected == ["bad.json", "bad.reason", "x.json", "x.reason"]
    assert "duplicate" in (run.box("rejected") / "x.reason").read_text()


def test_receipts_wait_in_memory_while_the_outbox_cannot_be_written(run: RunPaths) -> None:
    dispatcher, errors = _dispatcher(run, Controller())
    drop_request(run, "s.json", {"v": 1, "type": "stop"})
    drop_request(run, "bad.json", b"{")
    hidden = run.root / "outbox-away"
    os.rename(run.outbox, hidden)  # every write into the outbox fails now
    dispatcher.scan()
    assert errors == ["publish receipts"] and dispatcher.unpublished == 2
    assert (run.box("cur") / "bad.json").exists(), "not moved while its receipt is unpublished"
    os.rename(hidden, run.outbox)
    dispatcher.scan()
    assert dispatcher.unpublished == 0
    assert {p.stem for p in run.outbox.glob("*.json")} == {"s", "bad"}
    assert (run.box("rejected") / "bad.json").exists()


def test_closing_answers_what_is_left_and_keeps_a_recovered_steer_pending(run: RunPaths) -> None:
    dispatcher, _ = _dispatcher(run, Controller())
    drop_request(run, "held.json", {"v": 1, "type": "steer", "message": "held"})
    drop_request(run, "claimed.json", {"v": 1, "type": "steer", "message": "claimed"})
    dispatcher.scan()
    private_mkdir(run.recovery_claim.parent)
    create_exclusive(run.recovery_claim, encode(RecoveryClaim(request_id="claimed", pid=1, at="t")))
    drop_request(run, "late.json", {"v": 1, "type": "stop"})
    dispatcher.fail_open("the child ended before the message was delivered")
    dispatcher.close("complete")
    assert run.inbox_closed.exists() and run.inbox_answered.exists()
    states = {rid: read_receipt(run, rid) for rid in ("held", "claimed", "late")}
    assert states["held"] is not None and states["held"].state == ReceiptState.FAILED
    assert states["claimed"] is not None and states["claimed"].state == ReceiptState.PENDING
    assert states["claimed"].reason == RECOVERY_REASON
    assert states["late"] is not None and states["late"].reason == FINISHED_REASON
