"""A workflow's inbox: requests for its children are forwarded into their inboxes, and the
workflow's receipt follows theirs (one target per child; ``partial`` when they differ).

Without ``child``, a steer or follow-up goes to every running child, and a stop or interrupt is
the workflow's own: every child is stopped (or paused) and the workflow ends ``stopped`` (or
``paused``). With ``child`` (an index of ``steps[]``) any request goes to that child alone; for a
child that has not started — also a parallel or chain workflow's task not called yet, known by
its index — a stop ends it at once (it never starts) and a steer or follow-up is
``scheduled``: sent into its inbox when it starts, failed if it never does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

from pisub.protocol.control import (
    FollowUp,
    Interrupt,
    Ledger,
    ReceiptState,
    Request,
    Steer,
    Stop,
    Target,
    advance_target,
    request_type,
)
from pisub.runner.dispatch import Controller, Dispatcher, ErrorHook
from pisub.store.mailbox import make_receipt
from pisub.store.paths import RunPaths
from pisub.workflow.forwarding import Forwarded


class WorkflowController(Protocol):
    """What the workflow's dispatcher needs from its coordinator."""

    def route(self, child: int | None) -> list[int] | str:
        """The children a request for ``child`` goes to, or why none."""

    def forward(self, index: int, request_id: str, request: Request) -> Forwarded:
        """Pass the request to child ``index`` (into its inbox, or held for its start); the
        state its target takes (``pending`` when written) and why."""

    def stop_workflow(self, reason: str | None) -> str | None:
        """End the workflow as ``stopped``; None when begun, else why not."""

    def interrupt_workflow(self, reason: str | None) -> str | None:
        """End the workflow as ``paused``; None when begun, else why not."""


class WorkflowDispatcher(Dispatcher):
    """The dispatcher of a workflow run (see the module docstring)."""

    controller: WorkflowController  # type: ignore[assignment]

    def __init__(
        self,
        paths: RunPaths,
        run_id: str,
        ledger: Ledger,
        controller: WorkflowController,
        on_change: Callable[[], None],
        on_event: Callable[..., None],
        on_error: ErrorHook,
    ) -> None:
        super().__init__(paths, run_id, ledger, cast(Controller, controller), on_change, on_event, on_error)
        self.controller = controller

    def handle_steer(self, request: Request, rid: str) -> None:
        assert isinstance(request, Steer | FollowUp)
        self._forward(request, rid)

    def handle_interrupt(self, request: Request, rid: str) -> None:
        assert isinstance(request, Interrupt)
        if request.child is not None:
            self._forward(request, rid)
            return
        refusal = self.controller.interrupt_workflow(request.reason)
        state = ReceiptState.FAILED if refusal else ReceiptState.DELIVERED
        self._answer(request, rid, state, refusal)

    def handle_stop(self, request: Request, rid: str) -> None:
        assert isinstance(request, Stop)
        if request.child is not None:
            self._forward(request, rid)
            return
        refusal = self.controller.stop_workflow(request.reason)
        state = ReceiptState.FAILED if refusal else ReceiptState.DELIVERED
        self._answer(request, rid, state, refusal)

    def _forward(self, request: Request, rid: str) -> None:
        route = self.controller.route(request.child)
        if isinstance(route, str):
            self._answer(request, rid, ReceiptState.FAILED, route, child=request.child or 0)
            return
        state = ReceiptState.PENDING
        receipt = make_receipt(
            self.run_id,
            rid,
            request_type(request),
            state,
            targets=[Target(child=i, state=state) for i in route],
        )
        message = request.message if isinstance(request, Steer | FollowUp) else None
        self._ledger_add(rid, request_type(request), state, message, receipt.created_at)
        self.open[rid] = receipt
        for index in route:
            state, why = self.controller.forward(index, rid, request)
            if state is not ReceiptState.PENDING:
                advance_target(receipt, index, state, why)
        self._after_change(rid)

    def update_target(self, rid: str, index: int, state: ReceiptState, reason: str | None = None) -> None:
        """Child ``index``'s receipt of a forwarded request moved to ``state``."""
        receipt = self.open.get(rid)
        if receipt is None or not advance_target(receipt, index, state, reason):
            return
        self._after_change(rid)
        self.publish()

    def _after_change(self, rid: str) -> None:
        receipt = self.open[rid]
        if receipt.state.is_final:
            del self.open[rid]
            self._count(receipt.state)
        self._ledger_state(rid, receipt.state, receipt.updated_at)
        self._write(receipt)

    def fail_open(self, reason: str) -> None:
        """Every target still open fails (the workflow is ending)."""
        for rid, receipt in list(self.open.items()):
            for target in receipt.targets:
                if not target.state.is_final:
                    self.update_target(rid, target.child, ReceiptState.FAILED, reason)
