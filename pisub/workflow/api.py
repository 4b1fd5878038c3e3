"""What a workflow script sees: ``runs`` (start, gather and steer children) and ``state``.

Every ``runs`` call starts its work at once and returns an :class:`asyncio.Future` of the
script's event loop: ``await`` it, or hand it to ``asyncio.wait``, ``asyncio.as_completed`` or
``asyncio.gather``. A call that nothing ever waits for is an error when ``main`` returns (its
child is stopped). Bad arguments raise at the call (``INVALID_INPUT`` naming the parameter);
a child that fails does not raise — its result says ``ok=False``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from pisub.errors import InvalidInput
from pisub.protocol.codec import encode
from pisub.protocol.workflow import ChildCall, SteerResult
from pisub.workflow.calls import check_key, from_mapping, from_python, unique_keys
from pisub.workflow.futures import ChildFuture

if TYPE_CHECKING:
    from pisub.workflow.children import ChildRuns


MAX_EMIT_BYTES = 16 * 1024
MAX_EMITS = 1000
"""At most this many ``emit`` calls per coordinator (a resume starts a new count)."""
MAX_EMIT_TOTAL_BYTES = 1024 * 1024
"""At most this many bytes of ``emit`` values (as JSON) per coordinator."""


class Runs:
    """``runs``: the children of this workflow."""

    def __init__(self, children: ChildRuns) -> None:
        self._admission = children.admission
        self._forwarding = children.forwarding
        self._waiters: set[asyncio.Task[None]] = set()
        self._waiters_of_lanes: set[asyncio.Task[Any]] = set()
        self._hosts = children.hosts
        self._emits = 0
        self._emitted_bytes = 0

    def run(
        self,
        key: str,
        *,
        agent: str | None = None,
        task: str,
        resume: str | None = None,
        output: str | None = None,
        output_mode: str = "inline",
        timeout: float | None = None,
        idle_timeout: float | None = None,
        model: str | None = None,
        context: str = "fresh",
        cwd: str | None = None,
        isolation: str | None = None,
        base_ref: str | None = None,
        tool_timeout_ms: int | None = None,
        checkpoint_before_deadline_ms: int | None = None,
        tool_budget: dict[str, Any] | None = None,
        acceptance: Any = None,
        gate: str | None = None,
        backend: str | None = None,
    ) -> ChildFuture:
        """Start child ``key`` (or, for a key already called with the same parameters, return its
        result again); its :class:`~pisub.protocol.workflow.ChildResult`.

        Raises:
            InvalidInput: a bad parameter, or the key was used with other parameters.
            UnknownAgent: no such agent (nothing was started).
            FanoutLimit: the spawn budget is used up.
        """
        params = {
            "agent": agent if agent is not None else self._resumed_agent(key, resume),
            "task": task,
            "resume": resume,
            "output": output,
            "output_mode": output_mode,
            "timeout": timeout,
            "idle_timeout": idle_timeout,
            "model": model,
            "context": context,
            "cwd": cwd,
            "isolation": isolation,
            "base_ref": base_ref,
            "tool_timeout_ms": tool_timeout_ms,
            "checkpoint_before_deadline_ms": checkpoint_before_deadline_ms,
            "tool_budget": tool_budget,
            "acceptance": acceptance,
            "gate": gate,
            "backend": backend,
        }
        call = from_python(key, params, f"runs.run({key!r:.80})")
        return self._start([call], f"runs.run({key!r})", label=f"runs.run({key!r})")[0]

    def _resumed_agent(self, key: str, resume: str | None) -> str:
        """The agent of the run ``resume`` continues (``runs.run(key, resume=..., task=...)``).

        Raises:
            InvalidInput: neither ``agent`` nor ``resume`` given. RunNotFound: no such run.
        """
        if resume is None:
            raise InvalidInput(f"runs.run({key!r:.80}): give agent (or resume=RUN_ID to continue a run)")
        from pisub.store.paths import validate_run_ref
        from pisub.store.runs import RunStore, load_manifest

        validate_run_ref(resume)
        return load_manifest(RunStore(self._admission.table.home).resolve(resume)).agent.name

    def all(self, calls: list[dict[str, Any]]) -> ChildFuture:
        """Start every call of the batch — all of them, or none when one is bad — and return
        their results in the order given (a list)."""
        if not isinstance(calls, list | tuple):
            raise InvalidInput(f"runs.all takes a list of calls, not {type(calls).__name__}")
        checked = [from_mapping(c, f"runs.all[{i}]") for i, c in enumerate(calls)]
        unique_keys(checked, "runs.all")
        loop = asyncio.get_running_loop()
        children = self._start(checked, "runs.all", label="", observed=True)
        batch = ChildFuture(loop=loop)
        batch.label = "runs.all([" + ", ".join(repr(c.key) for c in checked) + "])"
        gathered = asyncio.gather(*children)

        def finish(done: asyncio.Future[list[Any]]) -> None:
            if batch.done():
                return
            if done.cancelled():
                batch.cancel()
            elif done.exception() is not None:
                batch.set_exception(done.exception())  # type: ignore[arg-type]
            else:
                batch.set_result(list(done.result()))

        gathered.add_done_callback(finish)
        self._admission.track(batch)
        return batch

    def reserve(self, keys: list[str]) -> None:
        """Claim the spawn budget for ``keys`` at once, all or none (the built-in shapes use it).

        Raises:
            FanoutLimit: they do not fit; nothing was claimed.
        """
        self._admission.reserve(keys)

    def emit(self, value: Any) -> None:
        """Record ``value`` (plain JSON, at most 16 KiB) as a ``workflow.emit`` event of the
        workflow: progress a reader can follow in ``events.jsonl``.

        Raises:
            InvalidInput: not plain JSON, too large, or past this coordinator's cap
                (:data:`MAX_EMITS` calls, :data:`MAX_EMIT_TOTAL_BYTES` bytes in all).
        """
        from pisub.store.shared_state import plain_json

        checked = plain_json(value, "emit")
        size = len(encode(checked))
        if size > MAX_EMIT_BYTES:
            raise InvalidInput(f"emit: the value is larger than {MAX_EMIT_BYTES} bytes as JSON")
        if self._emits >= MAX_EMITS or self._emitted_bytes + size > MAX_EMIT_TOTAL_BYTES:
            raise InvalidInput(
                f"emit: at most {MAX_EMITS} emits and {MAX_EMIT_TOTAL_BYTES} bytes in all per workflow run "
                f"(this one has emitted {self._emits}, {self._emitted_bytes} bytes); emit less often, "
                "or return the rest as the result"
            )
        self._emits += 1
        self._emitted_bytes += size
        host = self._admission.table.host
        host.post(lambda: host.event("workflow.emit", value=checked))

    def start_batch(self, calls: list[ChildCall], where: str) -> list[ChildFuture]:
        """Start a checked batch (all or none) and return one future per call, in order (the
        built-in shapes use it; a script uses ``runs.all``)."""
        unique_keys(calls, where)
        return self._start(calls, where, label="", observed=True)

    def lanes(self, lanes: list[dict[str, Any]]) -> ChildFuture:
        """Run lanes of ordered stages side by side (see :mod:`pisub.workflow.lanes`); the
        board, a list of ``{key, state, failedStage?, stages: [...]}``. The whole manifest is
        checked, and every agent looked up, before anything starts.

        Raises:
            InvalidInput: every problem, naming the lane, stage and field.
            UnknownAgent: a stage's agent does not exist.
        """
        from pisub.workflow.lanes import board_json, check_lanes, run_lanes, stage_call

        checked = check_lanes(lanes, "runs.lanes")
        every = [stage_call(lane, number) for lane in checked for number in range(len(lane.stages))]
        self._admission.check_agents(every, "runs.lanes")
        resumed = {f"{lane.key}.{stage.key}" for lane in checked for stage in lane.stages if stage.resume}
        self._admission.check_same_calls(every, "runs.lanes", resumed)
        loop = asyncio.get_running_loop()
        future = ChildFuture(loop=loop)
        future.label = "runs.lanes([" + ", ".join(repr(lane.key) for lane in checked) + "])"
        self._admission.track(future)
        task = loop.create_task(run_lanes(self, checked))
        self._waiters_of_lanes.add(task)

        def finish(done: asyncio.Task[Any]) -> None:
            self._waiters_of_lanes.discard(done)
            if future.done():
                return
            if done.cancelled():
                future.cancel()
            elif done.exception() is not None:
                future.set_exception(done.exception())  # type: ignore[arg-type]
            else:
                future.set_result(board_json(done.result()))

        task.add_done_callback(finish)
        return future

    def steer(
        self,
        key: str,
        message: str,
        *,
        mode: str = "steer",
        index: int | None = None,
        ack_timeout: float = 3.0,
    ) -> ChildFuture:
        """Send ``message`` to child ``key`` through its inbox; a
        :class:`~pisub.protocol.workflow.SteerResult` once its receipt says what became of it
        (``queued``/``delivered``), it failed, or ``ack_timeout`` passed (then ``queued`` when
        the child holds it, else the receipt's state). ``missed``: the child had not started or
        had ended."""
        check_key(key, "runs.steer")
        if mode not in ("steer", "follow_up", "auto"):
            raise InvalidInput(f"runs.steer: mode must be steer, follow_up or auto, not {mode!r:.40}")
        if index not in (None, 0):
            raise InvalidInput(f"runs.steer: index {index!r:.20}: a workflow's child run has one child, 0")
        if not isinstance(message, str) or not message.strip():
            raise InvalidInput("runs.steer: the message is empty")
        if (
            isinstance(ack_timeout, bool)
            or not isinstance(ack_timeout, int | float)
            or not 0 <= ack_timeout <= 600
        ):
            raise InvalidInput("runs.steer: ack_timeout must be 0 to 600 seconds")
        loop = asyncio.get_running_loop()
        future = ChildFuture(loop=loop)
        future.label = f"runs.steer({key!r})"
        self._admission.track(future)
        sent = self._forwarding.send_steer(key, message, mode)
        waiter = loop.create_task(self._await_receipt(future, key, sent, float(ack_timeout)))
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiters.discard)
        return future

    async def _await_receipt(
        self, future: ChildFuture, key: str, sent: SteerResult, ack_timeout: float
    ) -> None:
        result = sent
        if sent.request_id is not None and sent.state == "queued":
            deadline = time.monotonic() + ack_timeout
            while True:
                result = self._forwarding.steer_outcome(key, sent.request_id)
                if result.state != "queued" or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(0.01)  # a receipt poll with a deadline
        if not future.done():
            future.set_result(result)

    def skip(self, call: ChildCall, why: str) -> None:
        """Record ``call`` as ``skipped`` without starting it (a chain's steps after a failure)."""
        self._admission.skip(call, why)

    def _start(
        self, calls: list[ChildCall], where: str, *, label: str, observed: bool = False
    ) -> list[ChildFuture]:
        loop = asyncio.get_running_loop()
        futures = []
        for call in calls:
            future = ChildFuture(loop=loop)
            future.label = label or f"runs.all entry {call.key!r}"
            future.observed = observed
            futures.append(future)
        self._admission.admit(calls, futures, loop, where)
        return futures

    def host(self, key: str, params: dict[str, Any]) -> ChildFuture:
        """Run one host command of a named workflow resource (``spec/resources.md``):
        ``params`` is ``{kind: "command", command, timeoutMs, output?, role?, provider?}``; the
        future gives ``{key, ok, exitCode, output, logPath, reportPath?, durationMs}``, or raises
        ``HostCommandFailed`` (a nonzero exit, a timeout, the workflow's stop). The command runs
        in a worker thread; the same key with the same parameters gives the recorded result
        again (also after a resume: it never runs twice).

        Raises:
            InvalidInput: a raw script (no permit), a bad parameter, a key or command the
                resource's permit does not list, a ``runs.run`` key, more than its calls.
        """
        return self._hosts.call(key, params)

    @property
    def host_permitted(self) -> bool:
        """This workflow is a named resource's (it has a host permit; a raw script has none)."""
        return self._hosts.table.spec.permit is not None


class State:
    """``state``: JSON values shared by every workflow of the same state namespace; each call
    reads the file under its lock (never a stale snapshot)."""

    def __init__(self, namespace: Any) -> None:
        self._namespace = namespace

    async def get(self, key: str) -> Any:
        return await asyncio.to_thread(self._namespace.get, key)

    async def set(self, key: str, value: Any) -> None:
        await asyncio.to_thread(self._namespace.set, key, value)
