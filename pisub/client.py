"""The typed Python API; the CLI is a thin skin over it.

>>> run = pisub.launch("reviewer", "review the diff")      # doctest: +SKIP
>>> run.wait(timeout=600).details.results[0].output          # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pisub import defaults
from pisub.errors import InvalidInput, LaunchFailed, WaitTimeout
from pisub.paths import STATUS_FILE, Home, RunPaths, open_home, validate_run_ref
from pisub.polling import Every, poll
from pisub.protocol.codec import now_iso
from pisub.protocol.control import FollowUp, Interrupt, Receipt, ReceiptState, Request, Steer, Stop
from pisub.protocol.manifest import AgentSpec, Limits, LimitValues, Manifest
from pisub.protocol.result import Result
from pisub.protocol.status import RunState, Status
from pisub.store import RunStore, load_manifest, load_result, load_status

if TYPE_CHECKING:
    from pisub.agents import Catalog

MAX_TASK_BYTES = 1024 * 1024


def _text(value: str, what: str) -> str:
    """``value``, refused when it cannot be written as UTF-8 (undecodable bytes from argv)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"the {what} is not valid UTF-8 (it holds undecodable bytes)") from None
    return value


def _seconds(value: float | None, what: str) -> float | None:
    """``value`` when it is None or a finite number of seconds >= 0 (never NaN: a NaN deadline
    never comes)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise InvalidInput(f"the {what} must be a finite number of seconds >= 0")
    return value


def _new_run_id() -> str:
    import uuid

    return str(uuid.uuid4())


def agent_catalog(*, home: Path | None = None, cwd: Path | None = None) -> Catalog:
    """Every agent visible from ``cwd`` (user scope, then project scope)."""
    from pisub.agents import discover

    h = open_home(home)
    return discover(h.agents, Path(cwd or os.getcwd()).resolve())


def launch(
    agent: str,
    task: str,
    *,
    cwd: str | Path | None = None,
    timeout: float | None = None,
    idle_timeout: float | None = None,
    home: Path | None = None,
) -> Run:
    """Start a detached run of ``agent`` on ``task`` and return once its runner committed.

    Raises:
        InvalidInput: empty task, bad cwd or limits.
        UnknownAgent: no such agent.
        LaunchFailed: the command is missing or the runner could not start.
        HomeUnusable: the pisub home is not usable.
    """
    if not _text(task, "task").strip():
        raise InvalidInput("the task is empty")
    if len(task.encode("utf-8")) > MAX_TASK_BYTES:
        raise InvalidInput(f"the task is larger than {MAX_TASK_BYTES} bytes")
    caller = LimitValues(timeout=timeout, idle_timeout=idle_timeout).check("the call")
    workdir = Path(cwd or os.getcwd()).resolve()
    if not workdir.is_dir():
        raise InvalidInput(f"working directory {workdir} does not exist")
    _text(str(workdir), "working directory's path")
    from pisub.agents import discover

    h = open_home(home)
    found = discover(h.agents, workdir).get(agent)
    spec = found.spec()
    if spec.runner == "pi":
        _resolve_pi(spec, h)
    else:
        _check_command(spec.command, workdir)
    manifest = _manifest(
        spec, task, str(workdir), Limits.resolve((caller, "the call"), (found.limits(), str(found.path)))
    )
    return _start(h, manifest)


def _manifest(
    spec: AgentSpec,
    task: str,
    cwd: str,
    limits: Limits,
    *,
    resumed_from: str | None = None,
    session_file: str | None = None,
) -> Manifest:
    """A new run's launch request: a fresh id, now, the caller's umask."""
    return Manifest(
        v=1,
        run_id=_new_run_id(),
        created_at=now_iso(),
        agent=spec,
        task=task,
        cwd=cwd,
        umask=_current_umask(),
        limits=limits,
        resumed_from=resumed_from,
        session_file=session_file,
    )


def _current_umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _check_command(command: str | None, cwd: Path) -> None:
    if not command:
        raise InvalidInput("the agent has no command")
    if "/" in command:
        path = (cwd / command) if not os.path.isabs(command) else Path(command)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LaunchFailed(f"command not found or not executable: {command}")
    elif shutil.which(command) is None:
        raise LaunchFailed(f"command not found on PATH: {command}")


def _start(home: Home, manifest: Manifest) -> Run:
    from pisub.reconcile import observe
    from pisub.runner.spawn import spawn_runner

    paths, lock_fd = RunStore(home).create(manifest)
    try:
        spawn_runner(paths, lock_fd)
    except LaunchFailed:
        os.close(lock_fd)
        lock_fd = -1
        # The failing runner may hold runner.lock for a moment more; once it is free, the
        # repair marks the run failed, so a failed launch never leaves a "starting" run.
        _wait_unlocked(paths.runner_lock, defaults.STARTUP_TIMEOUT_S)
        observe(paths)
        raise
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)
    return Run(paths.run_id, home=home.root)


def _wait_unlocked(lock: Path, timeout: float) -> None:
    from pisub.locks import is_held

    poll(lambda: None if is_held(lock) else True, timeout, interval=0.01)


def resume(
    ref: str,
    message: str,
    *,
    child: int | None = None,
    timeout: float | None = None,
    home: Path | None = None,
) -> Run:
    """Continue a finished pi run's session in a new run with ``message`` as the next turn.

    The new run's runner takes the session's lease before pi starts; briefs stored by
    ``follow-up`` are prepended to ``message``.

    Raises:
        NotResumable: the run is stopped, running, not a pi run, or has no session file.
        LaunchFailed: e.g. another run holds the session's lease (named in the message).
    """
    source = Run(ref, home=home)
    status, manifest = source.status(), source.manifest()
    session = _resumable_session(source.id, status, manifest.agent.runner)
    if child not in (None, 0):
        raise InvalidInput(f"run {source.id} has one child, 0")
    if not _text(message, "message").strip():
        raise InvalidInput("the message is empty")
    LimitValues(timeout=timeout).check("the call")
    _check_lease_free(source.home, session)
    spec = manifest.agent
    _resolve_pi(spec, source.home)
    limits = manifest.limits  # the source's, resolved at its launch; a new timeout may replace its own
    if timeout is not None:
        limits.timeout = timeout
    new = _manifest(spec, message, manifest.cwd, limits, resumed_from=source.id, session_file=session)
    return _start(source.home, new)


def _resolve_pi(spec: AgentSpec, home: Home) -> None:
    """Fill in the pi binary and its version (refused in one line when unsupported)."""
    from pisub.children.pi_rpc import find_pi
    from pisub.pi_versions import supported_version

    spec.command = find_pi()
    spec.pi_version = supported_version(spec.command, home.cache)


def _check_lease_free(home: Home, session: str) -> None:
    """Refuse a resume at once (``LEASE_HELD``, naming the owner) while a live run drives the
    session, so no run is created for it; the new runner still takes the lease itself."""
    from pisub.leases import unleased

    with unleased(home.leases, session):
        pass


def _resumable_session(run_id: str, status: Status, runner: str) -> str:
    from pisub.errors import NotResumable

    if runner != "pi":
        raise NotResumable(f"run {run_id} is an {runner} run; only pi runs can be resumed")
    if status.state == RunState.STOPPED:
        raise NotResumable(f"run {run_id} is stopped; start a new run")
    if not status.state.is_terminal:
        raise NotResumable(f"run {run_id} is {status.state}; use steer")
    if not status.session_file or not Path(status.session_file).exists():
        raise NotResumable(
            f"run {run_id} ({status.state}) has no session file: pi writes it only after its first reply"
        )
    return status.session_file


class Run:
    """A handle on one run, found by id or unique prefix."""

    def __init__(self, ref: str, *, home: Path | None = None) -> None:
        validate_run_ref(ref)  # refused before the disk is touched
        self.home = open_home(home)
        self.paths: RunPaths = RunStore(self.home).resolve(ref)

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    @property
    def id(self) -> str:
        return self.paths.run_id

    @property
    def dir(self) -> Path:
        return self.paths.root

    def manifest(self) -> Manifest:
        return load_manifest(self.paths)

    def status(self) -> Status:
        """The current status, after crash detection and repair."""
        from pisub.reconcile import observe

        return observe(self.paths)

    def result(self) -> Result | None:
        """The result, or None while the run has none."""
        return load_result(self.paths)

    def wait(self, timeout: float | None = None) -> Result:
        """Block until the terminal status is written; the result.

        Raises:
            WaitTimeout: the run was still going after ``timeout`` seconds.
        """
        self.wait_until_terminal(_seconds(timeout, "timeout"))
        result = self.result()
        assert result is not None, "a terminal run always has a result"
        return result

    # -- control ------------------------------------------------------------------------
    def send(self, request: Request) -> str:
        """Publish a control request into the run's inbox; its id.

        Raises:
            InboxClosed: the run has finished (the request was not written, or withdrawn).
        """
        from pisub.mailbox import write_request

        for what in ("message", "reason", "source"):
            value = getattr(request, what, None)
            if isinstance(value, str):
                _text(value, what)
        return write_request(self.paths, request)

    def send_steer(
        self, message: str, *, mode: str = "steer", child: int | None = None, source: str | None = "pisub"
    ) -> str:
        """Steer the child (``mode``: ``steer``, ``follow_up`` or ``auto``); the request id."""
        if mode not in ("steer", "follow_up", "auto"):
            raise InvalidInput(f"unknown mode {mode!r}; one of steer, follow_up, auto")
        return self.send(Steer(v=1, message=message, mode=mode, child=child, source=source))  # type: ignore[arg-type]

    def steer(
        self,
        message: str,
        *,
        mode: str = "steer",
        child: int | None = None,
        wait: float = 3.0,
        recover: bool = True,
        on_recovery: Callable[[str], None] | None = None,
    ) -> tuple[str, Receipt | None]:
        """Steer the child and wait up to ``wait`` seconds for the receipt; the request id and
        the latest receipt (None when none came, or with ``wait`` 0).

        With ``recover``, a plain steer (mode ``steer``, the run's one child) that a running pi
        run has not taken in time triggers pause-and-revive (:mod:`pisub.revive`): the run is
        paused and resumed with the message, and the receipt becomes ``recovered`` — or, when the
        run does not pause in time, the recovery is abandoned without side effects.
        ``on_recovery`` is told (with the request id) before a recovery starts.

        Raises:
            InboxClosed: the run has finished.
        """
        request_id = self.send_steer(message, mode=mode, child=child)
        if wait <= 0:
            return request_id, None
        receipt = self.wait_for_receipt(request_id, wait)
        unanswered = receipt is None or receipt.state == ReceiptState.PENDING
        if recover and mode == "steer" and child in (None, 0) and unanswered and self._revivable():
            from pisub.revive import revive

            if on_recovery is not None:
                on_recovery(request_id)
            receipt = revive(self, request_id, message) or self.receipt(request_id)
        return request_id, receipt

    def _revivable(self) -> bool:
        return self.manifest().agent.runner == "pi" and not self.status().state.is_terminal

    def resume(self, message: str, *, timeout: float | None = None) -> Run:
        """Continue this finished pi run's session in a new run (see :func:`resume`)."""
        return resume(self.id, message, timeout=timeout, home=self.home.root)

    def send_follow_up(self, message: str, *, child: int | None = None, source: str | None = "pisub") -> str:
        return self.send(FollowUp(v=1, message=message, child=child, source=source))

    def send_interrupt(self, *, reason: str | None = None, source: str | None = "pisub") -> str:
        return self.send(Interrupt(v=1, reason=reason, source=source))

    def send_stop(
        self, *, child: int | None = None, reason: str | None = None, source: str | None = "pisub"
    ) -> str:
        return self.send(Stop(v=1, child=child, reason=reason, source=source))

    def follow_up(self, message: str, *, child: int | None = None) -> tuple[str, Receipt | None]:
        """A follow-up: a request to a running run, or a brief for a finished pi run.

        Returns the request id and, for a brief, its ``scheduled`` receipt.

        Raises:
            NotResumable: the run is finished and cannot take briefs (stopped, not pi, no session).
        """
        status = self.status()
        if not status.state.is_terminal:
            return self.send_follow_up(message, child=child), None
        from pisub.briefs import add_brief

        session = _resumable_session(self.id, status, self.manifest().agent.runner)
        receipt = add_brief(self.paths, self.home.leases, session, self.id, _text(message, "message"))
        return receipt.request_id, receipt

    def receipt(self, request_id: str) -> Receipt | None:
        """The receipt of a request, or None while there is none."""
        from pisub.mailbox import read_receipt

        return read_receipt(self.paths, request_id)

    def wait_for_receipt(self, request_id: str, timeout: float) -> Receipt | None:
        """Wait until the request's receipt is past ``pending``; the latest receipt (None if none).

        A run that ends meanwhile answers every request, so this never waits on a dead run
        longer than the crash check takes.
        """
        crash_check = Every(0.5, now=False)  # a crashed runner's requests are answered by the repair

        def answered() -> Receipt | None:
            receipt = self.receipt(request_id)
            if receipt is not None and receipt.state != ReceiptState.PENDING:
                return receipt
            if crash_check.due():
                self.status()
            return None

        got = poll(answered, _seconds(timeout, "wait"), interval=0.02, first=0.005)
        return got if got is not None else self.receipt(request_id)

    def wait_until_terminal(self, timeout: float | None = None) -> Status:
        """Block until the run's terminal status is written (with a crash check twice a second).

        Raises:
            WaitTimeout: the run was still going after ``timeout`` seconds.
        """
        liveness = Every(0.5)
        last: list[Status] = []

        def ended() -> Status | None:
            status = self.status() if liveness.due() else load_status(self.paths)
            last[:] = [status]
            return self.status() if status.state.is_terminal else None

        done = poll(ended, _seconds(timeout, "timeout"))
        if done is None:
            raise WaitTimeout(f"run {self.id} is still {last[0].state} after {timeout:g}s")
        return done


def list_runs(
    *, home: Path | None = None, state: RunState | None = None, problems: list[str] | None = None
) -> Iterator[Status]:
    """Statuses of every run (after crash repair), oldest first.

    A run whose files cannot be read is left out and described in ``problems``; a run removed
    meanwhile (``pisub gc``) is left out silently.
    """
    from pisub.errors import PisubError, RunNotFound
    from pisub.fsio import load_json
    from pisub.mailbox import inbox_needs_answers
    from pisub.reconcile import observe
    from pisub.store import MAX_FILE

    h = open_home(home)
    store = RunStore(h)
    runs = os.fspath(h.runs)
    statuses = []
    for run_id in store.ids():
        root = os.path.join(runs, run_id)
        try:
            # Fast path for finished runs (most of them): one read, one decode, two stats.
            st = load_json(os.path.join(root, STATUS_FILE), Status, limit=MAX_FILE)
            if not st.state.is_terminal or inbox_needs_answers(os.path.join(root, "inbox")):
                st = observe(RunPaths(Path(root)))
        except (FileNotFoundError, RunNotFound):
            if os.path.isdir(root) and problems is not None:
                problems.append(f"{run_id}: it has no status.json")
            continue
        except PisubError as exc:
            if problems is not None:
                problems.append(f"{run_id}: {exc}")
            continue
        if state is None or st.state == state:
            statuses.append(st)
    if problems is not None:
        problems += [f"{name}: not a run directory (a symlink or file in runs/)" for name in store.strays()]
    statuses.sort(key=lambda s: s.started_at)
    return iter(statuses)
