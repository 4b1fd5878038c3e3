"""A runner's wait for its turn in a group (``spec/queue.md``): before its run mode starts.

The runner registers its run in the group (``groups/<name>/q-…``) and the decision is taken at
once under the group's lock; admitted, it goes on as any runner. Otherwise it commits ``queued``
with its identity (pid, start ticks: a reader proves its death as for a running run), answers
the launcher and waits, woken by ``SIGUSR1`` (rung by whoever admits it), by a look at its inbox
every :data:`INBOX_POLL_S` and by its own check every :data:`CHECK_S`: is it admitted, did its entry
vanish (written again), did an ``--after`` run end otherwise than ``complete`` (the run fails),
is a slot free that nobody filled (a holder killed, a promoter that died halfway: it decides
itself, under the lock). A whole-run stop (inbox request, SIGTERM, SIGINT) ends the run
``stopped`` without its child ever starting; steering requests stay in the inbox for the child.
"""

from __future__ import annotations

import contextlib
import os
import random
import selectors
import signal
import threading
import time
from typing import NoReturn

from pisub.errors import PisubError
from pisub.protocol.codec import now_iso
from pisub.protocol.manifest import Manifest
from pisub.protocol.queue import QueueRequest
from pisub.protocol.result import ErrorCode, ErrorInfo
from pisub.protocol.status import RunState
from pisub.runner.modes import Report
from pisub.runs import queue
from pisub.store import groups
from pisub.store.groups import EntryName
from pisub.store.paths import Home, RunPaths

CHECK_S = 1.0
"""How often a waiting runner near the head of the queue checks its group on its own (jittered
±25 %); one at place P checks every ``P / (2 * limit)`` of that, at most :data:`MAX_CHECK_S`."""
MAX_CHECK_S = 5.0
INBOX_POLL_S = 0.5
"""How often a waiting runner lists its inbox (no inotify: a few hundred waiting runners would
take every inotify instance this user has, which running runners need)."""
STOPPED_REASON = "the run was stopped while queued; its child never started"


class _Ended(Exception):
    """The wait ended the run (stopped, failed): its final files are written."""


class QueueWait:
    """One runner's wait; :meth:`run` returns True once admitted."""

    def __init__(self, paths: RunPaths, manifest: Manifest, request: QueueRequest, report: Report) -> None:
        self.paths = paths
        self.manifest = manifest
        self.request = request
        self.report = report
        self.home = paths.home
        self.directory = groups.group_dir(self.home, request.group)
        self.sel = selectors.DefaultSelector()
        self.signalled: int | None = None
        self.entry: EntryName | None = None
        self.queued_at = time.monotonic()
        self.repairing: threading.Thread | None = None

    def run(self) -> bool:
        """Wait for admission; False when the wait ended the run (or its directory vanished)."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._take_signals(wake_r)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            try:
                self.entry = queue.register(self.home, self.paths.run_id, self.request)
            except PisubError as exc:  # its group removed (or unusable) before it got in
                try:
                    self._end_failed(f"{exc.message}; this run never started", ErrorCode.INVALID_INPUT)
                finally:
                    self.report({"ok": True, "pid": os.getpid(), "queued": True})
            if self.entry.admitted:
                return True
            self._commit_queued()
            self.report({"ok": True, "pid": os.getpid(), "queued": True})
            _preload()
            return self._wait(wake_r)
        except _Ended:
            return False
        finally:
            # (the handlers stay: a late ring must not kill the runner; its run mode takes the
            # signals again before anything runs)
            signal.set_wakeup_fd(-1)
            self.sel.close()
            os.close(wake_r)
            os.close(wake_w)

    # -- waiting ---------------------------------------------------------------------------
    def _wait(self, wake_r: int) -> bool:
        next_check = next_inbox = 0.0
        rung = True
        while True:
            if self.signalled is not None:
                self._end_stopped(f"stopped by signal {self.signalled} while queued; its child never started")
            now = time.monotonic()
            if now >= next_inbox:
                self._check_inbox()
                next_inbox = now + INBOX_POLL_S
            if rung or now >= next_check:
                rung = False
                if not os.path.isdir(self.paths.root):
                    return False  # the run directory was removed: nothing left to run
                entry = groups.find(self.directory, self.paths.run_id)
                if entry is not None and entry.admitted:
                    self._admitted()
                    return True
                if now >= next_check:
                    next_check = now + self._check(entry) * random.uniform(0.75, 1.25)
                    rung = True  # look again at once: the check may have admitted this run
                    continue
            for _key, _mask in self.sel.select(max(0.0, min(next_check, next_inbox) - now)):
                rung = _read_wake(wake_r) or rung

    def _check(self, entry: EntryName | None) -> float:
        """The slow check: the ``--after`` runs, the entry, and a free slot nobody filled; how
        long until the next one (:data:`CHECK_S` near the head of the queue, up to
        :data:`MAX_CHECK_S` far back: hundreds of waiting runners stay cheap)."""
        ready, why = queue.deps_state(self.home, self._observed_after())
        if why is not None:
            self._end_failed(f"{why}; this run never started")
        if entry is None:  # vanished (removed, set aside): written again in its place
            try:
                self.entry = queue.register(self.home, self.paths.run_id, self.request, self.entry)
            except PisubError as exc:  # its group removed under it
                self._end_failed(f"{exc.message}; this run never started", ErrorCode.INVALID_INPUT)
            return CHECK_S
        limit, paused = queue._limit_of(self.home, self.request.group)
        found = groups.entries(self.directory)
        if ready and not paused and self._maybe_free(found, limit):
            queue.promote(self.home, self.request.group)
        waiting = [e.run_id for e in found if not e.admitted]
        place = waiting.index(self.paths.run_id) if self.paths.run_id in waiting else 0
        return min(MAX_CHECK_S, CHECK_S * max(1.0, place / (2 * (limit or 2))))

    def _observed_after(self) -> list[str]:
        """The ``--after`` runs, each observed (a dead one repaired) until it has ended."""
        from pisub.runs.reconcile import observe

        for run_id in self.request.after:
            with contextlib.suppress(PisubError, OSError):
                observe(self.home.run(run_id))
        return self.request.after

    def _maybe_free(self, found: list[EntryName], limit: int | None) -> bool:
        """Whether a slot may be free (read without the lock; the lock's decision is final). A
        holder whose runner is proven dead is repaired (its child's leftovers ended, then its
        slot given on: the repair leaves the group)."""
        if limit is None:
            return True
        # Counted exactly as a decision counts them (a holder whose run ended or whose
        # directory is gone under a dead runner holds nothing: the decision drops its entry).
        held = {e: queue.holder_verdict(self.home, self.directory, e) for e in found if e.admitted}
        if sum(1 for v in held.values() if v is not queue.Verdict.GONE) < limit:
            return True
        dead = [e for e, v in held.items() if v is queue.Verdict.DEAD]
        if dead and (self.repairing is None or not self.repairing.is_alive()):
            # In a thread: ending a dead run's child takes up to a second, and this runner may be
            # admitted meanwhile (a repair is idempotent and safe to cut off at any point).
            self.repairing = threading.Thread(target=_repair, args=(self.home, dead), daemon=True)
            self.repairing.start()
        return False  # (a repair leaves the group: its decision gives the slot)

    # -- the inbox -------------------------------------------------------------------------
    def _check_inbox(self) -> None:
        """A whole-run stop in the inbox ends the run (answered ``delivered``); anything else
        waits there for the child."""
        from pisub.protocol.control import Stop
        from pisub.store.mailbox import claim, make_receipt, parse_request_file, pending_files, write_receipt

        for name in pending_files(self.paths, "new"):
            parsed = parse_request_file(self.paths.inbox / "new" / name)
            if not isinstance(parsed.request, Stop) or parsed.request.child is not None:
                continue
            claimed = claim(self.paths, name)
            if claimed is None:
                continue
            from pisub.protocol.control import ReceiptState

            write_receipt(
                self.paths,
                make_receipt(self.paths.run_id, parsed.request_id, "stop", ReceiptState.DELIVERED),
            )
            reason = parsed.request.reason
            self._end_stopped(STOPPED_REASON + (f" ({reason})" if reason else ""))

    # -- the startup and the end -------------------------------------------------------------
    def _take_signals(self, wake_r: int) -> None:
        def stop(signum: int, _frame: object) -> None:
            self.signalled = signum

        def nothing(_signum: int, _frame: object) -> None:
            return None

        for sig, handler in ((signal.SIGTERM, stop), (signal.SIGINT, stop)):
            signal.signal(sig, handler)
        for sig in (signal.SIGUSR1, signal.SIGHUP):
            signal.signal(sig, nothing)
        self.sel.register(wake_r, selectors.EVENT_READ)

    def _commit_queued(self) -> None:
        """``queued``, with this runner's identity (what a reader's liveness check reads)."""
        from pisub.runner.lifecycle import mark_running
        from pisub.store.runs import append_event, load_status, write_status

        status = mark_running(load_status(self.paths))
        status.state = RunState.QUEUED
        status.group = self.request.group
        status.updated_at = now_iso()
        write_status(self.paths, status)
        place = queue.position(self.home, self.request.group, self.paths.run_id)
        append_event(
            self.paths,
            "run.queued",
            group=self.request.group,
            priority=self.request.priority,
            position=place[0] if place else None,
            pid=os.getpid(),
        )

    def _admitted(self) -> None:
        from pisub.store.runs import append_event

        waited = round(time.monotonic() - self.queued_at, 3)
        append_event(self.paths, "run.admitted", group=self.request.group, waited_s=waited)

    def _end_stopped(self, message: str) -> NoReturn:
        self._end("stopped", ErrorInfo(code=ErrorCode.SUBAGENT_FAILED, message=message))

    def _end_failed(self, message: str, code: ErrorCode = ErrorCode.SUBAGENT_FAILED) -> NoReturn:
        self._end("failed", ErrorInfo(code=code, message=message))

    def _end(self, state: str, error: ErrorInfo) -> NoReturn:
        """End the run without starting its child: inbox closed and answered, result, terminal
        status, ``run.finished``, ``--on-done``, the group left."""
        from pisub.store.mailbox import close_inbox, settle_closed_inbox
        from pisub.store.on_done import after_end
        from pisub.store.results import make_result
        from pisub.store.runs import append_event, load_status, write_result, write_status

        close_inbox(self.paths, state)
        settle_closed_inbox(self.paths, self.paths.run_id, error.message)
        result = make_result(
            run_id=self.paths.run_id,
            state=state,
            agent=self.manifest.agent.name,
            task=self.manifest.task,
            exit_code=1,
            output="",
            error=error,
            full_output=self.paths.output_log(0),
        )
        write_result(self.paths, result)
        status = load_status(self.paths)
        status.state = RunState(state)
        status.ended_at = result.ended_at
        status.updated_at = now_iso()
        status.error = result.details.error
        write_status(self.paths, status)
        append_event(self.paths, "run.finished", state=state, queued=True, sync=True)
        with contextlib.suppress(PisubError):  # (its group may be gone)
            queue.leave(self.home, self.request.group, self.paths.run_id)
        after_end(self.paths, self.manifest, state)
        raise _Ended


def _repair(home: Home, dead: list[EntryName]) -> None:
    """Repair the runs of admitted entries whose runners are proven dead (never raises)."""
    from pisub.runs.reconcile import observe

    for entry in dead:
        with contextlib.suppress(PisubError, OSError):
            observe(home.run(entry.run_id))


def _preload() -> None:
    """Import what the run's start needs while it waits (as a warm runner does), so that an
    admitted run starts without paying for its imports."""
    from pisub.backends import warm

    with contextlib.suppress(ImportError):
        warm.preload()


def _read_wake(fd: int) -> bool:
    """Empty the wake-up pipe; whether the ring (``SIGUSR1``) was among what woke the runner."""
    rung = False
    with contextlib.suppress(BlockingIOError):
        while data := os.read(fd, 512):
            rung = rung or signal.SIGUSR1 in data
    return rung


def wait_turn(paths: RunPaths, manifest: Manifest, report: Report) -> bool:
    """Wait for the run's turn in its group (True: go on and start it); False when the run
    ended while it waited (its final files written) or its directory vanished."""
    if manifest.queue is None:
        return True
    return QueueWait(paths, manifest, manifest.queue, report).run()
