"""Control requests (``inbox/new/<name>.json``) and their receipts (``outbox/<id>.json``)."""

from __future__ import annotations

import enum
import re
from typing import Annotated, Literal

import msgspec

from pisub.errors import ProtocolError
from pisub.protocol.codec import Record, StrictRecord, now_iso
from pisub.protocol.json_words import duplicate_key, problem

REQUEST_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
"""A request id (and a request file's name without ``.json``)."""

MAX_MESSAGE_BYTES = 128 * 1024
"""Largest ``message`` of a steer or follow-up, in UTF-8 bytes."""

MAX_REQUEST_BYTES = 256 * 1024
"""Largest request file the runner reads; a larger one is rejected unread."""

RequestId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")]
Message = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_MESSAGE_BYTES, pattern=r"\S")]
"""Non-blank; at most 131,072 characters here (the schema cannot count bytes) and at most
:data:`MAX_MESSAGE_BYTES` bytes of UTF-8 (checked after decoding)."""
ChildIndex = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
ShortText = Annotated[str, msgspec.Meta(max_length=1000)]


class RequestBase(StrictRecord, kw_only=True, tag_field="type", omit_defaults=True):
    """Fields every request has. ``id`` defaults to the file name without ``.json``."""

    v: Literal[1]
    id: RequestId | None = None
    child: ChildIndex | None = None
    """Only this child (by index); all running children when absent."""
    reason: ShortText | None = None
    source: ShortText | None = None


class Steer(RequestBase, tag="steer", kw_only=True, omit_defaults=True):
    """Correct the child while it works (pi: applied at the next turn boundary)."""

    message: Message
    mode: Literal["steer", "follow_up", "auto"] = "steer"


class FollowUp(RequestBase, tag="follow_up", kw_only=True, omit_defaults=True):
    """Queue more work for after the child's current work."""

    message: Message


class Interrupt(RequestBase, tag="interrupt", kw_only=True, omit_defaults=True):
    """Abort the child's current work; the run ends ``paused`` (resumable)."""


class Stop(RequestBase, tag="stop", kw_only=True, omit_defaults=True):
    """End the child (TERM, grace, KILL); the run ends ``stopped`` (not resumable)."""


Request = Steer | FollowUp | Interrupt | Stop
RequestType = Literal["steer", "follow_up", "interrupt", "stop"]


_request_decoder: msgspec.json.Decoder[Request] = msgspec.json.Decoder(Request)


def decode_request(data: bytes) -> Request:
    """Decode a request strictly.

    Raises:
        ProtocolError: naming the bad field.
    """
    try:
        request = _request_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise ProtocolError(duplicate_key(data) or _plain(str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not valid JSON ({problem(data, exc)})") from exc
    twice = duplicate_key(data)  # (msgspec would keep the last: which one was meant?)
    if twice is not None:
        raise ProtocolError(twice)
    return request


_PLAIN = {
    "Expected `str` matching regex '\\\\S' - at `$.message`": "`message` is blank - at `$.message`",
    f"Expected `str` of length <= {MAX_MESSAGE_BYTES} - at `$.message`": (
        f"`message` is larger than {MAX_MESSAGE_BYTES} characters - at `$.message`"
    ),
}


def _plain(message: str) -> str:
    """msgspec's wording of the message constraints, said plainly."""
    return _PLAIN.get(message, message)


def request_type(request: Request) -> str:
    """The ``type`` tag of a request (``steer``, ``follow_up``, ``interrupt``, ``stop``)."""
    return str(type(request).__struct_config__.tag)


class ReceiptState(enum.StrEnum):
    """What became of a request."""

    DELIVERED = "delivered"
    """Acted on: the child took the message (pi emitted it as a user message), or the
    signal / abort was sent."""
    QUEUED = "queued"
    """The child accepted the message into its queue; ``delivered`` follows."""
    SCHEDULED = "scheduled"
    """Kept for later: a brief for the next resume (a ``follow-up`` to a finished run, or a steer
    the run ended before pi took: reason "carried to the next resume: …"), or a request for a
    workflow's child that has not started yet (sent to it when it starts); ``delivered`` follows
    when it is taken."""
    PENDING = "pending"
    """Claimed by the runner, not yet accepted by the child."""
    PARTIAL = "partial"
    """Some targets succeeded and some failed."""
    RECOVERED = "recovered"
    """Delivered to a replacement run (``replacementRunId``)."""
    FAILED = "failed"
    """Could not be carried out; ``reason`` says why."""
    REJECTED = "rejected"
    """The request itself was invalid; ``reason`` names the bad field."""

    @property
    def is_final(self) -> bool:
        """No later state follows."""
        return self not in (ReceiptState.PENDING, ReceiptState.QUEUED, ReceiptState.SCHEDULED)

    @property
    def is_open(self) -> bool:
        """The runner still owes the request its answer (a dead runner's repair fails it)."""
        return self in (ReceiptState.PENDING, ReceiptState.QUEUED)

    @property
    def delivery_status(self) -> Literal["delivered", "queued"]:
        return "delivered" if self in (ReceiptState.DELIVERED, ReceiptState.RECOVERED) else "queued"


class Target(Record, kw_only=True, omit_defaults=True):
    """One child a request was routed to."""

    child: int
    state: ReceiptState
    reason: str | None = None
    delivered_at: str | None = None


class Receipt(Record, kw_only=True):
    """The one answer to one request, replaced atomically as the request advances."""

    v: Literal[1]
    request_id: str
    run_id: str
    type: str
    state: ReceiptState
    delivery_status: Literal["delivered", "queued"]
    targets: list[Target] = []
    reason: str | None = None
    replacement_run_id: str | None = None
    created_at: str
    updated_at: str


class LedgerEntry(Record, kw_only=True, omit_defaults=True):
    """One of the last requests, as shown in ``status.json``."""

    id: str
    type: str
    state: ReceiptState
    preview: str
    """The message, redacted, at most 160 characters."""
    requested_at: str
    updated_at: str
    replacement_run_id: str | None = None
    """The run a steer carried to the next resume was delivered with: never in ``status.json``
    (its runner had ended); a reader sets it from the receipt (:func:`pisub.store.briefs.
    with_carried_answers`)."""


class Ledger(Record, kw_only=True):
    """The steering ledger of a run: monotonic counters and the last 20 requests."""

    requested: int = 0
    delivered: int = 0
    queued: int = 0
    failed: int = 0
    rejected: int = 0
    carried: int = 0
    """Steers the run ended (paused, or done) before pi took, kept as briefs for its next
    resume (their receipts ``scheduled``, "carried to the next resume")."""
    recent: list[LedgerEntry] = []


class RecoveryClaim(Record, kw_only=True):
    """``<run>/recovery/claim.json``: a pause-and-revive owns this request's answer."""

    v: int = 1
    request_id: str
    pid: int
    at: str


class InboxInfo(Record, kw_only=True):
    """How the runner watches its inbox."""

    watch: Literal["inotify", "polling"]
    reason: str | None = None
    """Why inotify is not used, when polling."""


def advance(
    receipt: Receipt, state: ReceiptState, reason: str | None = None, *, now: str | None = None
) -> bool:
    """Move ``receipt`` to ``state`` — the one way a receipt changes.

    Sets ``deliveryStatus`` and ``updatedAt``, gives every target that is not final the same
    state and reason (and ``deliveredAt`` when delivered). A final receipt never changes:
    returns False and leaves it alone; True when it moved.
    """
    if receipt.state.is_final:
        return False
    at = now or now_iso()
    receipt.state = state
    receipt.delivery_status = state.delivery_status
    receipt.reason = reason
    receipt.updated_at = at
    for target in receipt.targets:
        if target.state.is_final:
            continue
        target.state = state
        target.reason = reason
        if state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED):
            target.delivered_at = target.delivered_at or at
    return True


_LEAST_ADVANCED = (ReceiptState.SCHEDULED, ReceiptState.PENDING, ReceiptState.QUEUED)
"""The states that are not final, least advanced first."""


def aggregate(targets: list[Target]) -> ReceiptState:
    """The state of a request routed to ``targets``: the least advanced while any is open
    (``scheduled``, then ``pending``, then ``queued``); once all are final, ``delivered`` when
    every target was delivered, ``failed`` when none was, ``partial`` otherwise."""
    if not targets:
        return ReceiptState.FAILED
    open_states = {t.state for t in targets if not t.state.is_final}
    if open_states:
        return next(state for state in _LEAST_ADVANCED if state in open_states)
    delivered = [t.state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED) for t in targets]
    if all(delivered):
        return ReceiptState.DELIVERED
    return ReceiptState.PARTIAL if any(delivered) else ReceiptState.FAILED


def advance_target(
    receipt: Receipt, child: int, state: ReceiptState, reason: str | None = None, *, now: str | None = None
) -> bool:
    """Move the target ``child`` of ``receipt`` to ``state`` and the receipt to the aggregate of
    its targets (its ``reason``: the targets' reasons, when they failed or wait for their
    child's start). A final target or receipt never changes; whether anything moved."""
    if receipt.state.is_final:
        return False
    target = next((t for t in receipt.targets if t.child == child), None)
    if target is None or target.state.is_final or target.state == state:
        return False
    at = now or now_iso()
    target.state = state
    target.reason = reason
    if state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED):
        target.delivered_at = target.delivered_at or at
    overall = aggregate(receipt.targets)
    told = overall.is_final or overall is ReceiptState.SCHEDULED
    reasons = [
        f"child {t.child}: {t.reason}"
        for t in receipt.targets
        if t.reason and (t.state.is_final or t.state is ReceiptState.SCHEDULED)
    ]
    receipt.state = overall
    receipt.delivery_status = overall.delivery_status
    receipt.reason = "; ".join(reasons)[:2000] if told and reasons else None
    receipt.updated_at = at
    return True


def owed(receipt: Receipt) -> bool:
    """Whether the runner still owes ``receipt``'s request its answer (a dead runner's repair
    fails it): it is open, or ``scheduled`` for a workflow's child that has not started (it has
    targets; a brief's ``scheduled`` receipt has none and waits for a resume, not a runner)."""
    return receipt.state.is_open or (receipt.state is ReceiptState.SCHEDULED and bool(receipt.targets))
