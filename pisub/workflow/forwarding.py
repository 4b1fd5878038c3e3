"""Control between a workflow and its children: a request to the workflow is forwarded into
the inboxes of the children it names (:meth:`Forwarding.route`, :meth:`Forwarding.forward`)
and its receipts follow theirs; ``runs.steer`` from the script steers one child.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from pisub.errors import InvalidInput, PisubError
from pisub.protocol.control import Receipt, ReceiptState, Request, Steer
from pisub.protocol.workflow import SteerResult
from pisub.store.paths import RunPaths
from pisub.workflow.entries import ChildEntry, ChildTable, Phase


@dataclass(eq=False)
class Forwarding:
    """Passes control requests and receipts between a workflow and its children."""

    table: ChildTable

    def route(self, child: int | None) -> list[int] | str:
        """The children a request goes to: every running child, or child ``child`` (by index)."""
        with self.table.lock:
            if child is None:
                running = [e.index for e in self.table.entries if e.phase is Phase.RUNNING]
                return running or "no child of this workflow is running"
            if child >= len(self.table.entries):
                return f"no child {child} (this workflow has {len(self.table.entries)})"
            entry = self.table.entries[child]
        if entry.phase is Phase.QUEUED:
            return f"child {child} ({entry.key}) has not started yet"
        if entry.phase is Phase.STARTING:
            return f"child {child} ({entry.key}) is still starting"
        if entry.phase is Phase.ENDED:
            return f"child {child} ({entry.key}) has already ended"
        return [child]

    def forward(self, index: int, request_id: str, request: Request) -> str | None:
        """Write ``request`` into child ``index``'s inbox; None when written (its receipt follows
        the child's), else why not."""
        from pisub.store.mailbox import InboxClosed, write_request

        entry = self.table.entries[index]
        assert entry.run_id is not None
        child_rid = forwarded_id(request_id, index)
        copy = msgspec.structs.replace(request, id=child_rid, child=None, source=self.table.source)
        try:
            write_request(self.table.home.run(entry.run_id), copy)
        except InboxClosed:
            return f"child {index} ({entry.key}) has already ended"
        except PisubError as exc:
            return f"cannot reach child {index} ({entry.key}): {exc.message}"
        entry.forwards[child_rid] = (request_id, index)
        self.table.host.event(
            "control.forwarded", index, id=request_id, childRequest=child_rid, runId=entry.run_id
        )
        return None

    def pass_receipts(self, entry: ChildEntry, paths: RunPaths) -> None:
        """Forwarded requests: their receipts in the workflow follow the child's."""
        from pisub.store.mailbox import read_receipt

        if not entry.forwards:
            return
        for child_rid, (rid, index) in list(entry.forwards.items()):
            try:
                receipt = read_receipt(paths, child_rid)
            except PisubError:
                continue
            if receipt is None:
                continue
            self.table.host.receipt_moved(rid, index, _target_state(receipt), receipt.reason)
            if receipt.state.is_final:
                del entry.forwards[child_rid]

    def fail_forwards(self, entry: ChildEntry) -> None:
        """A child ended: pass on the receipts it wrote; what it never answered fails."""
        if entry.run_id is not None and entry.forwards:
            self.pass_receipts(entry, self.table.home.run(entry.run_id))
        for rid, index in entry.forwards.values():
            self.table.host.receipt_moved(rid, index, ReceiptState.FAILED, "the child ended first")
        entry.forwards.clear()

    def send_steer(self, key: str, message: str, mode: str) -> SteerResult:
        """``runs.steer`` (from the script's thread): write a steer into child ``key``'s inbox;
        ``queued``, or ``missed`` / ``failed`` naming why not."""
        from pisub.store.mailbox import InboxClosed, write_request

        with self.table.lock:
            entry = self.table.by_key.get(key)
        if entry is None:
            raise InvalidInput(f"runs.steer: no child {key!r} was started by this workflow")
        if entry.phase is not Phase.RUNNING or entry.run_id is None:
            why = "it has not started yet" if entry.phase is not Phase.ENDED else "it has already ended"
            return SteerResult(key=key, state="missed", error=f"child {key!r}: {why}")
        request = Steer(v=1, message=message, mode=mode, source=self.table.source)  # type: ignore[arg-type]
        try:
            request_id = write_request(self.table.home.run(entry.run_id), request)
        except InboxClosed:
            return SteerResult(key=key, state="missed", error=f"child {key!r}: it has already ended")
        except PisubError as exc:
            return SteerResult(key=key, state="failed", error=exc.message)
        return SteerResult(key=key, state="queued", request_id=request_id, delivery_status="queued")

    def steer_outcome(self, key: str, request_id: str) -> SteerResult:
        """What became of steer ``request_id`` sent to child ``key``, as its receipt says."""
        from pisub.store.mailbox import read_receipt

        with self.table.lock:
            entry = self.table.by_key[key]
        assert entry.run_id is not None
        try:
            receipt = read_receipt(self.table.home.run(entry.run_id), request_id)
        except PisubError as exc:
            return SteerResult(key=key, state="failed", request_id=request_id, error=exc.message)
        if receipt is None or not receipt.state.is_final:
            status = receipt.delivery_status if receipt is not None else "queued"
            return SteerResult(key=key, state="queued", request_id=request_id, delivery_status=status)
        if receipt.state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED):
            return SteerResult(key=key, state="delivered", request_id=request_id, delivery_status="delivered")
        missed = receipt.reason is not None and "ended" in receipt.reason
        return SteerResult(
            key=key,
            state="missed" if missed else "failed",
            request_id=request_id,
            delivery_status=receipt.delivery_status,
            error=receipt.reason,
        )


def _target_state(receipt: Receipt) -> ReceiptState:
    if receipt.state in (ReceiptState.PENDING, ReceiptState.QUEUED, ReceiptState.SCHEDULED):
        return ReceiptState.QUEUED if receipt.state != ReceiptState.PENDING else ReceiptState.PENDING
    if receipt.state in (ReceiptState.DELIVERED, ReceiptState.RECOVERED):
        return ReceiptState.DELIVERED
    return ReceiptState.FAILED


def forwarded_id(request_id: str, index: int) -> str:
    """The id of ``request_id`` forwarded to child ``index``: ``<id>.c<index>``, or for a long
    id its first 150 characters and a hash of the whole (two ids never share a forward)."""
    if len(request_id) <= 180:
        return f"{request_id}.c{index}"
    digest = hashlib.sha256(request_id.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"{request_id[:150]}.{digest}.c{index}"
