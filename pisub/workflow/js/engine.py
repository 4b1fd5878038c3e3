"""A JavaScript workflow script run by an embedded QuickJS engine, as a workflow ``main``.

The script is the seed's *statement body*: it runs inside ``async function`` (top-level
``await`` and ``return``), with the globals of :file:`prelude.js` and nothing else. It is turned
into the same ``async def main(runs, state, args)`` a Python script defines, so the coordinator,
the journal, replay on resume, stop and steer are the ones Python workflows have.

One QuickJS context per workflow, made and used only in the script's thread (inside its event
loop). The loop here pumps the engine: run the pending JavaScript jobs, and when the script waits,
wait for one of its calls to settle, hand the outcome in (``__pisub.settled``), run the jobs again
— until the script's promise settles. Every call crosses as JSON text through one host function,
which never raises into the engine (an answer ``{error}`` becomes a JavaScript exception at the
call).

Limits: the context's heap is capped (:data:`MEMORY_LIMIT`) and its native stack
(:data:`STACK_LIMIT`); a script that computes without ever awaiting cannot be interrupted (QuickJS
cannot be given a time limit while it calls into Python) — a stop then ends the workflow without
waiting for it, as with a Python script.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from pisub.errors import InvalidInput, PisubError, WorkflowFailed
from pisub.protocol.workflow import ChildCall
from pisub.workflow.calls import PYTHON_NAMES
from pisub.workflow.validate import read_script_text

MEMORY_LIMIT = 512 * 1024 * 1024
"""Bytes the script's JavaScript heap may hold (children's outputs included)."""
STACK_LIMIT = 1024 * 1024
"""Bytes of native stack the engine may use (deep recursion fails as a RangeError-like error)."""
MAX_CONSOLE_CHARS = 64 * 1024
"""One console line is cut to this many characters."""
PAD_LINES = 100_000
"""Blank lines before the script in its compiled text: a stack frame past them is the
script's, one before them the prelude's (QuickJS names both ``<input>``)."""
WRAPPER_LINES = PAD_LINES + 1
"""Lines before the script's first line."""

_TRACKED = ("run", "all", "lanes", "steer", "host")
_LINE = re.compile(r"<input>:(\d+)")
_PAD = "\n" * PAD_LINES
_REFUSED = (
    "action",
    "workflowScript",
    "workflowScriptPath",
    "tasks",
    "chain",
    "parallel",
    "concurrency",
    "chainDir",
    "clarify",
    "globalConcurrencyLimit",
    "maxSubagentSpawnsPerRun",
)


class ScriptError(WorkflowFailed):
    """The script threw (or rejected); ``origin`` is the pisub code of an error it let through
    (``RUN_FANOUT_LIMIT``...), else None."""

    def __init__(self, message: str, origin: str | None = None) -> None:
        super().__init__(message)
        self.origin = origin


def prelude() -> str:
    return resources.files("pisub.workflow.js").joinpath("prelude.js").read_text(encoding="utf-8")


def refuse_unrunnable(source: str, name: str) -> None:
    """Refuse what the engine must not run: a syntax error, a nested async function.

    Raises:
        InvalidInput: naming the line and the rule.
    """
    from pisub.workflow.js.checks import validate_js

    report = validate_js(source, None, name)
    fatal = [p for p in report.errors if p.kind in ("syntax", "nested-async")]
    if fatal:
        first = fatal[0]
        raise InvalidInput(f"{name}:{first.line}: {first.message}")


def load_js_main(path: Path, name: str, seed: int) -> Callable[[Any, Any, Any], Any]:
    """The ``main(runs, state, args)`` that runs the JavaScript script at ``path``.

    Raises:
        InvalidInput: the script cannot be read or must not run (:func:`refuse_unrunnable`).
    """
    source = read_script_text(path, name)
    refuse_unrunnable(source, name)

    async def main(runs: Any, state: Any, args: Any) -> Any:
        return await JsScript(source, name, seed).run(runs, state, args)

    return main


class JsScript:
    """One run of a JavaScript script (see the module docstring)."""

    def __init__(self, source: str, name: str, seed: int) -> None:
        self.source = source
        self.name = name
        self.seed = seed
        self.runs: Any = None
        self.state: Any = None
        self.next_id = 0
        self.calls: dict[int, asyncio.Future[Any]] = {}
        """The calls not settled yet."""
        self.launches: dict[int, asyncio.Future[Any]] = {}
        """Every call that must be observed, settled or not (the script may wait for a call
        long after it settled)."""
        self.settled: list[tuple[int, asyncio.Future[Any]]] = []
        self.wake = asyncio.Event()
        self.state_ops: dict[int, bool] = {}
        """The state calls (``state.get``/``state.set``), and whether the script waited for each."""
        self.lost: list[str] = []
        """The errors of state calls nobody waited for."""
        self.outcome: dict[str, Any] | None = None

    async def run(self, runs: Any, state: Any, args: Any) -> Any:
        import quickjs

        self.runs, self.state = runs, state
        ctx = quickjs.Context()
        ctx.set_memory_limit(MEMORY_LIMIT)
        ctx.set_max_stack_size(STACK_LIMIT)
        ctx.add_callable("__pisub_host", self._host)
        setup = {"seed": self.seed, "state": state is not None, "host": runs.host_permitted, "args": args}
        try:
            install = ctx.eval(prelude())
            install(ctx.get("__pisub_host"), ctx.parse_json(json.dumps(setup)))
            ctx.eval("delete globalThis.__pisub_host;")
        except quickjs.JSException as exc:  # pragma: no cover - the prelude is ours
            raise WorkflowFailed(f"the JavaScript engine could not start: {exc}") from None
        try:
            ctx.eval(_PAD + f"__pisub.watch((async function __workflow__() {{\n{self.source}\n}})());")
        except quickjs.JSException as exc:
            raise ScriptError(f"the workflow failed: {self.name}: {_first_line(str(exc))}") from None
        settle = ctx.eval("__pisub.settled")
        return await self._pump(ctx, settle, quickjs.JSException)

    async def _pump(self, ctx: Any, settle: Any, js_error: type[Exception]) -> Any:
        """Run the script's jobs and hand it its calls' outcomes until it has ended and every
        call it waits for — or that writes state — has settled (the seed's "after their side
        effects settle": a race's losers are waited for, not left running)."""
        while True:
            try:
                while ctx.execute_pending_job():
                    pass
            except js_error as exc:
                raise ScriptError(f"the workflow failed: {self.name}: {_first_line(str(exc))}") from None
            if self.outcome is not None and not self._still_awaited():
                return self._result(ctx)
            if not self.calls:
                raise WorkflowFailed(
                    f"the workflow failed: {self.name}: the script waits for something that never "
                    "comes (every runs call has settled; a promise nothing resolves?)"
                )
            await self.wake.wait()
            self.wake.clear()
            batch, self.settled = self.settled, []
            for call_id, future in batch:
                ok, text = _outcome_of(future)
                if not ok and call_id in self.state_ops and not self.state_ops[call_id]:
                    self.lost.append(json.loads(text).get("message", "state call failed"))
                try:
                    settle(call_id, ok, text)
                except js_error as exc:
                    raise ScriptError(f"the workflow failed: {self.name}: {_first_line(str(exc))}") from None

    def _still_awaited(self) -> bool:
        """Whether a call the script observed (or a state call) has not settled yet."""
        for call_id in self.calls:
            launch = self.launches.get(call_id)
            if call_id in self.state_ops or (launch is not None and getattr(launch, "observed", False)):
                return True
        return False

    def _result(self, ctx: Any) -> Any:
        assert self.outcome is not None
        if not self.outcome.get("ok"):
            raise _script_error(self.outcome.get("error") or {}, self.name)
        if self.lost:
            raise WorkflowFailed(
                f"the workflow failed: {self.name}: a state call nobody awaited failed: {self.lost[0]}"
            )
        left = json.loads(ctx.eval("__pisub.unobserved()"))
        if left:
            what = sorted({w for w, _k in left})
            keys = ", ".join(repr(k) for _w, k in left)
            raise WorkflowFailed(
                f"workflow completed with unawaited {'/'.join(what)} launch(es): {keys}; await each "
                "call, return it, or pass it to Promise.all / race / allSettled / any"
            )
        text = self.outcome.get("json")
        return None if text is None else json.loads(text)

    # == the one door from JavaScript (never raises into the engine) ==========================
    def _host(self, op: str, payload: str) -> str:
        try:
            data = json.loads(payload)
            if op == "finish":
                self.outcome = data
                return "{}"
            if op == "observe":
                if int(data) in self.state_ops:
                    self.state_ops[int(data)] = True
                future = self.launches.get(int(data))
                if future is not None:
                    future.observed = True  # type: ignore[attr-defined]
                return "{}"
            if op == "console":
                _console(data)
                return "{}"
            if op == "emit":
                self._emit(data)
                return "{}"
            future = self._start(op, data)
        except PisubError as exc:
            return json.dumps({"error": {"code": exc.code, "message": exc.message}})
        except (TypeError, ValueError, KeyError, RecursionError) as exc:
            return json.dumps({"error": {"code": "INVALID_INPUT", "message": f"{op}: {exc}"}})
        except Exception as exc:  # a bug of ours must not kill the engine: said at the call
            return json.dumps(
                {"error": {"code": "INTERNAL_ERROR", "message": f"{op}: {type(exc).__name__}: {exc}"}}
            )
        return json.dumps({"id": self._track(op, future)})

    def _start(self, op: str, data: dict[str, Any]) -> asyncio.Future[Any]:
        runs = self.runs
        if op == "run":
            return runs.run(data["key"], **_python_params(data["key"], data.get("params") or {}))  # type: ignore[no-any-return]
        if op == "all":
            return runs.all(data["calls"])  # type: ignore[no-any-return]
        if op == "lanes":
            return runs.lanes(data["lanes"])  # type: ignore[no-any-return]
        if op == "steer":
            o = data.get("options") or {}
            ack = o.get("ackTimeoutMs", 3000)
            if isinstance(ack, bool) or not isinstance(ack, int | float):
                raise InvalidInput("runs.steer: ackTimeoutMs must be a number of milliseconds")
            return runs.steer(  # type: ignore[no-any-return]
                data["key"],
                data["message"],
                mode=o.get("mode", "steer"),
                index=o.get("index"),
                ack_timeout=ack / 1000,
            )
        if op == "host":
            return runs.host(data["key"], data.get("params") or {})  # type: ignore[no-any-return]
        if op in ("state.get", "state.set"):
            if self.state is None:
                raise InvalidInput(
                    "this workflow has no state (it was started with mission false and no --state-ns)"
                )
            coro: Any = (
                self.state.get(data["key"])
                if op == "state.get"
                else self.state.set(data["key"], data["value"])
            )
            return asyncio.ensure_future(coro)  # type: ignore[no-any-return]
        raise InvalidInput(f"unknown operation {op!r}")

    def _track(self, op: str, future: asyncio.Future[Any]) -> int:
        self.next_id += 1
        call_id = self.next_id
        self.calls[call_id] = future

        def done(f: asyncio.Future[Any]) -> None:
            self.calls.pop(call_id, None)
            self.settled.append((call_id, f))
            self.wake.set()

        future.add_done_callback(done)
        if op.startswith("state."):
            self.state_ops[call_id] = False
        if op in _TRACKED and hasattr(future, "observed"):
            future.observed = False  # until JavaScript waits for it
            self.launches[call_id] = future
        return call_id

    def _emit(self, value: Any) -> None:
        self.runs.emit(value)


def _outcome_of(future: asyncio.Future[Any]) -> tuple[bool, str]:
    """What a settled call gives the script: ``(True, result JSON)`` or ``(False, error JSON)``."""
    if future.cancelled():
        return False, json.dumps({"code": "WORKFLOW_FAILED", "message": "the call was cancelled"})
    error = future.exception()
    if error is not None:
        code = error.code if isinstance(error, PisubError) else "INTERNAL_ERROR"
        message = error.message if isinstance(error, PisubError) else f"{type(error).__name__}: {error}"
        return False, json.dumps({"code": code, "message": message})
    value = future.result()
    if value is None:
        return True, ""
    return True, msgspec.json.encode(value).decode("utf-8")


def _python_params(key: str, params: dict[str, Any]) -> dict[str, Any]:
    """``runs.run``'s JavaScript parameters (the seed's camelCase) as Python keywords.

    Raises:
        InvalidInput: a parameter runs.run does not take.
    """
    where = f"runs.run({key!r:.80})"
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name in _REFUSED:
            raise InvalidInput(f"{where}: {name} is not a runs.run parameter")
        if name == "timeoutMs":
            out["timeout"] = _seconds(value, where, name)
        elif name == "idleTimeoutMs":
            out["idle_timeout"] = _seconds(value, where, name)
        elif name == "worktree":
            if not isinstance(value, bool):
                raise InvalidInput(f"{where}: worktree must be true or false")
            if value:
                out["isolation"] = "worktree"
        elif name == "lane":
            continue  # display-only metadata (the seed's lane {version, key, mode})
        else:
            out[PYTHON_NAMES.get(name, name)] = value
    known = set(ChildCall.__struct_fields__) - {"key"}
    for name in out:
        if name not in known:
            shown = next((c for c, p in PYTHON_NAMES.items() if p == name), name)
            raise InvalidInput(f"{where}: unknown parameter {shown!r:.60}")
    return out


def _seconds(value: Any, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidInput(f"{where}: {name} must be a positive number of milliseconds")
    return float(value) / 1000


def _console(data: dict[str, Any]) -> None:
    text = str(data.get("text", ""))[:MAX_CONSOLE_CHARS]
    stream = sys.stderr if data.get("level") in ("warn", "error") else sys.stdout
    print(text, file=stream, flush=True)


def _script_error(error: dict[str, Any], name: str) -> ScriptError:
    kind = str(error.get("name") or "Error")
    message = str(error.get("message") or "")
    lines = [int(n) for n in _LINE.findall(str(error.get("stack") or "")) if int(n) > WRAPPER_LINES]
    where = f"{name}:{lines[0] - WRAPPER_LINES}" if lines else name
    code = error.get("code")
    text = f"{kind}: {message}" if message else kind
    return ScriptError(f"the workflow failed: {where}: {text}", code if isinstance(code, str) else None)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "the engine failed"
