"""The ``pi`` coding agent as the child, driven through ``pi --mode rpc``.

pi reads one JSON command per line on stdin and writes responses (matched by ``id``)
and session events on stdout. The driver:

1. sends ``get_state`` (pi prints nothing until it is ready), then
   ``set_auto_retry false`` (so one ``agent_end`` really ends an attempt), then the task
   as the first ``prompt``;
2. mirrors every event except the high-volume ``message_update`` into ``events.jsonl``,
   writes assistant text and one ``tool: <name> <preview>`` line per tool call to
   ``output-<N>.log``, sums usage and tracks turns and tools;
3. after each ``agent_end`` asks ``get_state``; when pi says ``isStreaming: false,
   pendingMessageCount: 0`` and nothing started since, the child is finished and its
   stdin is closed (pi exits at once; in RPC mode it never exits by itself).

pi's own exit code says nothing about the outcome: the last assistant ``message_end``
does (``stopReason`` ``error`` / ``aborted`` and ``errorMessage``).
"""

from __future__ import annotations

import enum
import json
import os
import re
import selectors
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pisub.children.base import ChildHooks, ChildOutcome
from pisub.children.pi.versions import INSTALL_HINT, caps_of
from pisub.children.process import PipeWriter, ProcessChild
from pisub.core.fsio import atomic_write, open_regular
from pisub.defaults import TAIL_BYTES
from pisub.errors import LaunchFailed
from pisub.protocol.control import ReceiptState
from pisub.protocol.manifest import AgentSpec, Manifest
from pisub.protocol.result import Usage
from pisub.store.output import StreamSink
from pisub.store.paths import RunPaths

MAX_LINE = 16 * 1024 * 1024
"""Longest stdout line read from pi; a longer one is skipped and reported."""

READ_CHUNK = 256 * 1024
CLEARED_REASON = "the interrupt cleared it from pi's queue before it was delivered"
MAX_TOKENS = 2**53
"""Token counts above this are ignored (they would not survive JSON readers)."""
MAX_COST = 1e12
"""Costs above this (or not finite) are ignored."""
PREVIEW_CHARS = 120

Json = dict[str, Any]
ResponseHandler = Callable[[Json], None]
_decode = msgspec.json.Decoder().decode


def find_pi(env: Mapping[str, str] | None = None) -> str:
    """The pi binary: ``$PISUB_PI_BIN``, else ``pi`` on PATH.

    Raises:
        LaunchFailed: with one line saying how to install pi.
    """
    env = os.environ if env is None else env
    configured = env.get("PISUB_PI_BIN")
    if configured:
        path = Path(configured).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.absolute())
        raise LaunchFailed(f"PISUB_PI_BIN={configured} is not an executable file; {INSTALL_HINT}")
    found = shutil.which("pi", path=env.get("PATH"))
    if found is None:
        raise LaunchFailed(f"the pi coding agent was not found on PATH; {INSTALL_HINT}")
    return str(Path(found).absolute())


TOOL_BUDGET_EXTENSION = Path(__file__).with_name("tool_budget.ts")
"""The pi extension that blocks tools past a run's tool budget (loaded with ``-e``)."""

ENV_TOOL_BUDGET = "PISUB_TOOL_BUDGET"


def pi_argv(
    spec: AgentSpec, session_file: Path, system_prompt_file: Path | None, extensions: list[Path] | None = None
) -> list[str]:
    """The command line of a pi child (never through a shell)."""
    assert spec.command, "the launcher resolves the pi binary into the manifest"
    argv = [spec.command, "--mode", "rpc", "--session", str(session_file)]
    if caps_of(spec.pi_version).approve_flag:
        # Always one or the other: without either, pi would follow the user's own trust
        # settings (defaultProjectTrust, a saved trust list).
        argv.append("--approve" if spec.trust_project else "--no-approve")
    if not spec.extensions:
        argv.append("--no-extensions")
    if not spec.skills:
        argv.append("--no-skills")
    if not spec.prompt_templates:
        argv.append("--no-prompt-templates")
    if spec.model:
        argv += ["--model", spec.model]
    if spec.tools is not None:
        argv += ["--tools", ",".join(spec.tools)] if spec.tools else ["--no-tools"]
    if spec.thinking:
        argv += ["--thinking", spec.thinking]
    if system_prompt_file is not None:
        argv += ["--append-system-prompt", str(system_prompt_file)]
    for extension in extensions or []:
        argv += ["--extension", str(extension)]  # loaded even with --no-extensions
    return [*argv, *spec.args]


def tool_preview(name: str, args: object) -> str:
    """``<name> <args preview>`` for a tool call, e.g. ``bash echo hi`` (bounded in size and
    depth, whatever the model sent)."""
    text = ""
    if isinstance(args, dict):
        text = next((v for k in _PREVIEW_KEYS if isinstance(v := args.get(k), str)), "")
    if not text and args is not None:
        text = compact(args, PREVIEW_CHARS + 1)
    text = " ".join(text[: PREVIEW_CHARS * 4].split())
    if len(text) > PREVIEW_CHARS:
        text = text[: PREVIEW_CHARS - 1] + "…"
    return f"{name[:PREVIEW_CHARS]} {text}".rstrip()


_PREVIEW_KEYS = ("command", "path", "file_path", "pattern", "query", "url")
_KIND_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""What a pi event's ``type`` must look like to name an ``events.jsonl`` type (``pi.<type>``)."""
PREVIEW_DEPTH = 4


def compact(value: object, limit: int, depth: int = PREVIEW_DEPTH) -> str:
    """A short JSON-like rendering of ``value``: at most about ``limit`` characters, nesting
    deeper than ``depth`` shown as ``…`` (never recursion-limited, whatever the input)."""
    if isinstance(value, str):
        return json.dumps(value[:limit], ensure_ascii=False)
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)[:limit] if not isinstance(value, int) or abs(value) < 10**30 else "…"
    if depth <= 0 or not isinstance(value, dict | list):
        return "…"
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
    parts: list[str] = []
    used = 2
    for key, item in items:
        if used >= limit:
            parts.append("…")
            break
        head = f"{json.dumps(str(key)[:limit], ensure_ascii=False)}:" if isinstance(value, dict) else ""
        part = head + compact(item, limit - used, depth - 1)
        parts.append(part)
        used += len(part) + 1
    inner = ",".join(parts)
    return ("{" + inner + "}") if isinstance(value, dict) else ("[" + inner + "]")


def text_of(value: object) -> str | None:
    """``value`` when it is a string, else None (pi's events are checked before use)."""
    return value if isinstance(value, str) else None


def message_text(message: Json) -> str:
    """The text parts of an agent message, joined (parts that are not text are skipped)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        text
        for p in content
        if isinstance(p, dict) and p.get("type") == "text" and (text := text_of(p.get("text"))) is not None
    )


class LineReader:
    """Splits a byte stream on ``\\n`` only, bounding each line to ``max_line`` bytes."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._skipping = False
        self.oversized = 0

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The complete lines that ``data`` finishes."""
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            if self._skipping:
                self._skipping = False
            else:
                self._buf += data[start:nl]
                line = bytes(self._buf)
                if line.strip():
                    yield line
            self._buf.clear()
            start = nl + 1
        if not self._skipping:
            self._buf += data[start:]
            if len(self._buf) > self.max_line:
                self._buf.clear()
                self._skipping = True
                self.oversized += 1


class UsageTotals:
    """Running sums over assistant messages."""

    def __init__(self) -> None:
        self.usage = Usage()

    def add(self, message: Json) -> None:
        usage = message.get("usage")
        self.usage.turns += 1
        if not isinstance(usage, dict):
            return
        pairs = (
            ("input", "input"),
            ("output", "output"),
            ("cacheRead", "cache_read"),
            ("cacheWrite", "cache_write"),
        )
        for key, attr in pairs:
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
                setattr(self.usage, attr, min(MAX_TOKENS, getattr(self.usage, attr) + value))
        cost = usage.get("cost")
        total = cost.get("total") if isinstance(cost, dict) else cost
        if isinstance(total, int | float) and not isinstance(total, bool) and 0 <= total <= MAX_COST:
            self.usage.cost = min(MAX_COST, self.usage.cost + float(total))


class SteerState(enum.Enum):
    """Where a steering message is on its way into pi (delivered ones are forgotten)."""

    HELD = "held"
    """Waiting until pi has answered the task's prompt (before that pi drops it)."""
    SENT = "sent"
    """Sent as a ``prompt`` with ``streamingBehavior``; pi has not listed it yet."""
    QUEUED = "queued"
    """pi listed it in a ``queue_update``."""

    @property
    def in_pi(self) -> bool:
        return self is not SteerState.HELD


class Phase(enum.Enum):
    """The pi child's lifecycle, as the runner drives it."""

    STARTING = "starting"
    """Before pi answered the task's prompt: steers and aborts are held."""
    WORKING = "working"
    """pi took the task: steers and aborts go to it."""
    FINISHED = "finished"
    """Idle, refused or aborted: its stdin is closed, pi exits."""


@dataclass
class _Steer:
    request_id: str
    text: str
    behavior: str
    state: SteerState = SteerState.HELD


class PiChild(ProcessChild):
    """A pi coding-agent child in RPC mode."""

    kind = "pi"

    def __init__(
        self, index: int, hooks: ChildHooks, manifest: Manifest, paths: RunPaths, env: Mapping[str, str]
    ) -> None:
        super().__init__(index, hooks)
        self.manifest = manifest
        self.paths = paths
        self.env = dict(env)
        self.session_path = Path(manifest.session_file or paths.session)
        self.first_prompt = manifest.task
        """The task, or for a resume the briefs followed by the message."""
        self.session_file = str(self.session_path)
        self.log = StreamSink(paths.output_log(index), manifest.limits.output_cap, TAIL_BYTES)
        self.stderr = StreamSink(paths.stderr_log(index), manifest.limits.output_cap, TAIL_BYTES)
        self.sinks = (self.log, self.stderr)
        self.reader = LineReader()
        self.stdin: PipeWriter | None = None
        self._next_id = 0
        self._handlers: dict[str, ResponseHandler] = {}
        self._epoch = 0  # bumped by anything that starts work; invalidates idle checks
        self._streaming = False
        self.phase = Phase.STARTING
        self.prompt_error: str | None = None
        self.last_event: str | None = None
        self.last_assistant: Json | None = None
        self.final_text: str | None = None
        self.totals = UsageTotals()
        self._steers: list[_Steer] = []
        self._task_seen = False
        self._abort_wanted = False
        self._session_private = False
        self.caps = caps_of(manifest.agent.pi_version)

    # -- process --------------------------------------------------------------------
    def start(self) -> None:
        spec = self.manifest.agent
        prompt_file = None
        if spec.system_prompt.strip():
            prompt_file = self.paths.system_prompt
            atomic_write(prompt_file, spec.system_prompt.encode("utf-8"))
        extensions = []
        budget = self.manifest.limits.tool_budget
        if budget is not None:
            extensions.append(TOOL_BUDGET_EXTENSION)
            self.env[ENV_TOOL_BUDGET] = json.dumps({"hard": budget.hard, "block": budget.block})
        argv = pi_argv(spec, self.session_path, prompt_file, extensions)
        self.spawn(argv, cwd=self.manifest.cwd, env=self.env, umask=self.manifest.umask)

    def register(self, sel: selectors.BaseSelector) -> None:
        super().register(sel)
        assert self.proc and self.proc.stdout and self.proc.stderr and self.proc.stdin
        sel.register(self.proc.stdout, selectors.EVENT_READ, self._on_stdout)
        sel.register(self.proc.stderr, selectors.EVENT_READ, self._on_stderr)
        self._open_streams = 2
        self.stdin = PipeWriter(self.proc.stdin, sel)
        self.send({"type": "get_state"}, self._on_ready)

    def send(self, command: Json, on_response: ResponseHandler | None = None) -> str:
        """Send one RPC command; ``on_response`` gets its response (matched by id)."""
        self._next_id += 1
        cid = f"pisub-{self._next_id}"
        if on_response is not None:
            self._handlers[cid] = on_response
        line = json.dumps({"id": cid, **command}, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n"
        if self.stdin is not None:
            self.stdin.write(line)
        return cid

    def finish(self) -> None:
        """The work is done: close stdin so that pi exits."""
        if self.phase is not Phase.FINISHED:
            self.phase = Phase.FINISHED
            self.hooks.event("child.finishing", self.index, reason="idle")
            if self.stdin is not None:
                self.stdin.close()

    # -- the start-up sequence ------------------------------------------------------------
    def _on_ready(self, _resp: Json) -> None:
        self.send({"type": "set_auto_retry", "enabled": False}, self._on_retry_off)

    def _on_retry_off(self, _resp: Json) -> None:
        self._epoch += 1
        self.send({"type": "prompt", "message": self.first_prompt}, self._on_prompt)

    def _on_prompt(self, resp: Json) -> None:
        self.phase = Phase.WORKING if self.phase is Phase.STARTING else self.phase
        if not resp.get("success", False):
            self.prompt_error = (text_of(resp.get("error")) or "pi refused the prompt")[:2000]
            self.finish()
            return
        # pi drops steers and aborts sent before it answered the first prompt: they waited.
        if self._abort_wanted:
            self._send_abort()
        for item in list(self._steers):
            if item.state is not SteerState.HELD:
                continue
            if self._abort_wanted:  # interrupted before pi was ready: never start its turn
                self._steers.remove(item)
                self.hooks.steer_update(item.request_id, ReceiptState.FAILED, "the child was interrupted")
            else:
                self._send_steer(item)

    # -- control ------------------------------------------------------------------
    def steer(self, request_id: str, message: str, behavior: str) -> str | None:
        if self.phase is Phase.FINISHED or self._abort_wanted:
            return "the child has finished its work"
        item = _Steer(request_id, message, behavior)
        self._steers.append(item)
        if self.phase is Phase.WORKING:
            self._send_steer(item)
        return None

    def _send_steer(self, item: _Steer) -> None:
        # ``prompt`` with a streamingBehavior steers (or queues a follow-up) while pi works
        # and starts a new turn when it is idle, decided inside pi: no race with agent_end.
        item.state = SteerState.SENT
        self._epoch += 1
        command = {"type": "prompt", "message": item.text, "streamingBehavior": item.behavior}
        self.send(command, lambda resp: self._on_steer_response(item, resp))

    def _on_steer_response(self, item: _Steer, resp: Json) -> None:
        if not resp.get("success", False) and item in self._steers:
            self._steers.remove(item)
            self.hooks.steer_update(
                item.request_id, ReceiptState.FAILED, (text_of(resp.get("error")) or "pi refused it")[:2000]
            )
            if not self._streaming:  # the refused steer invalidated the idle check: ask again
                self._ask_idle()

    def abort(self) -> bool:
        if self.phase is Phase.FINISHED:
            return True
        self._abort_wanted = True
        if self.phase is Phase.WORKING:
            self._send_abort()
        return True

    def _send_abort(self) -> None:
        self._epoch += 1
        if self.caps.clear_queue:
            # 0.85 would start a new run with a queued message once aborted: empty the queue
            # first (pi handles commands in order) and fail what it held.
            self.send({"type": "clear_queue"}, self._on_queue_cleared)
        self.send({"type": "abort"}, lambda _resp: self.finish())

    def _on_queue_cleared(self, resp: Json) -> None:
        data = resp.get("data")
        if not isinstance(data, dict):
            return
        queues = [q for key in ("steering", "followUp") if isinstance(q := data.get(key), list)]
        for text in (t for q in queues for t in q if isinstance(t, str)):
            for item in self._steers:
                if item.state.in_pi and item.text == text:
                    self._steers.remove(item)
                    self.hooks.steer_update(item.request_id, ReceiptState.FAILED, CLEARED_REASON)
                    break

    def _queue_update(self, ev: Json) -> None:
        listed = [
            t
            for key in ("steering", "followUp")
            if isinstance(q := ev.get(key), list)
            for t in q
            if isinstance(t, str)
        ]
        for text in listed:
            for item in self._steers:
                if item.state is SteerState.SENT and item.text == text:
                    item.state = SteerState.QUEUED
                    self.hooks.steer_update(item.request_id, ReceiptState.QUEUED)
                    break

    def _user_message(self, message: Json) -> None:
        text = message_text(message)
        if not self._task_seen and text == self.first_prompt:
            self._task_seen = True
            return
        for item in self._steers:
            if item.state.in_pi and item.text == text:
                self._steers.remove(item)
                self.hooks.steer_update(item.request_id, ReceiptState.DELIVERED)
                return

    # -- reading ------------------------------------------------------------------
    def _on_stdout(self, _mask: int) -> None:
        assert self.proc
        data = self.read_chunk(self.proc.stdout, READ_CHUNK)
        if data:
            self.feed(data)

    def feed(self, data: bytes) -> None:
        """Take a chunk of pi's stdout (the parser's public entry; never raises for what pi —
        or a model steering it — writes: a line that cannot be handled is reported as
        ``child.bad_line`` and skipped)."""
        before = self.reader.oversized
        for line in self.reader.feed(data):
            try:
                self._on_line(line)
            except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
                preview = line[:200].decode("utf-8", "replace")
                self.hooks.event("child.bad_line", self.index, preview=preview, error=type(exc).__name__)
        if self.reader.oversized != before:
            self.hooks.event("child.line_too_long", self.index, limit=MAX_LINE)

    def _on_stderr(self, _mask: int) -> None:
        assert self.proc
        data = self.read_chunk(self.proc.stderr, READ_CHUNK)
        if not data:
            return
        self.stderr.feed(data)
        self.hooks.output(self.index, len(data), self.stderr.truncated)

    def _on_line(self, line: bytes) -> None:
        if line.startswith(b'{"type":"message_update"'):
            self.hooks.activity(self.index)  # the stream is alive; deltas are not kept
            return
        try:
            obj = _decode(line)
        except (msgspec.DecodeError, RecursionError):
            self.hooks.event("child.bad_line", self.index, preview=line[:200].decode("utf-8", "replace"))
            return
        if not isinstance(obj, dict):
            self.hooks.event("child.bad_line", self.index, preview=line[:200].decode("utf-8", "replace"))
            return
        kind = text_of(obj.get("type")) or ""
        kind = kind if _KIND_RE.fullmatch(kind) else "unknown"
        if kind == "response":
            self._on_response(obj)
        elif kind != "message_update":
            self.last_event = kind
            raw = _slim(kind, obj, line)
            if raw is not None:
                self.hooks.raw_event(self.index, kind, raw)
            self._on_event(kind, obj)
        self.hooks.activity(self.index)

    def _on_response(self, resp: Json) -> None:
        cid = resp.get("id")
        handler = self._handlers.pop(cid, None) if isinstance(cid, str) else None
        if handler is not None:
            handler(resp)
        elif resp.get("success", True) is not True:
            command, error = text_of(resp.get("command")), text_of(resp.get("error"))
            self.hooks.event("child.rpc_error", self.index, command=command, error=error and error[:2000])

    # -- events ---------------------------------------------------------------------
    def _on_event(self, kind: str, ev: Json) -> None:
        handler = _EVENT_HANDLERS.get(kind)
        if handler is not None:
            handler(self, ev)

    def _agent_start(self, _ev: Json) -> None:
        self._streaming = True
        self._epoch += 1

    def _work_started(self, _ev: Json) -> None:
        self._epoch += 1

    def _turn_start(self, _ev: Json) -> None:
        self.progress.turns += 1

    def _message_end(self, ev: Json) -> None:
        message = ev.get("message")
        if not isinstance(message, dict):
            return
        if message.get("role") == "user":
            self._user_message(message)
            return
        if message.get("role") != "assistant":
            return
        self.totals.add(message)
        self.last_assistant = message
        self._make_session_private()
        text = message_text(message)
        if message.get("stopReason") != "error" and text.strip():
            self.final_text = text
        if text.strip():
            self._log(text)

    def _tool_start(self, ev: Json) -> None:
        name = text_of(ev.get("toolName")) or "?"
        preview = tool_preview(name, ev.get("args"))
        self.progress.tools += 1
        self.progress.current_tool = preview
        call = text_of(ev.get("toolCallId")) or f"#{self.progress.tools}"
        if len(self.progress.tools_running) < 1000:  # (a hostile stream of starts stays bounded)
            self.progress.tools_running[call[:200]] = (name[:200], time.monotonic())
        self._log(f"tool: {preview}")

    def _tool_end(self, ev: Json) -> None:
        self.progress.current_tool = None
        running = self.progress.tools_running
        call = (text_of(ev.get("toolCallId")) or "")[:200]
        if call in running:
            del running[call]
        elif running:  # no id to match: the oldest ends
            del running[min(running, key=lambda k: running[k][1])]

    def _agent_end(self, _ev: Json) -> None:
        self._streaming = False
        self._ask_idle()

    def _may_be_idle(self, _ev: Json) -> None:
        """Work that ran after ``agent_end`` (a compaction, a retry) ended, or pi says the run
        settled: ask again whether pi is idle (``get_state`` decides; a stray ``agent_settled``
        early in a run finds it streaming)."""
        if not self._streaming:
            self._ask_idle()

    def _ask_idle(self) -> None:
        epoch = self._epoch
        self.send({"type": "get_state"}, lambda resp: self._check_idle(resp, epoch))

    def _check_idle(self, resp: Json, epoch: int) -> None:
        data = resp.get("data")
        if not isinstance(data, dict) or epoch != self._epoch or self._streaming:
            return
        if data.get("isStreaming") is False:
            # Idle with messages still queued (pi does not run a leftover queue by itself):
            # they die with the child and their requests are answered failed.
            self.finish()

    def _log(self, text: str) -> None:
        data = (text if text.endswith("\n") else text + "\n").encode("utf-8")
        newly = self.log.feed(data)
        if newly:
            self.hooks.event("child.output_truncated", self.index, log=str(self.log.path), cap=self.log.cap)
        self.hooks.output(self.index, len(data), self.log.truncated)
        for line in text.splitlines():
            self.progress.add_line(line)

    # -- the end ------------------------------------------------------------------
    def close(self, sel: selectors.BaseSelector) -> None:
        if self.stdin is not None:
            self.stdin.abort()  # what was still queued for pi is dropped
        super().close(sel)

    def outcome(self) -> ChildOutcome:
        rc, sig = self.exit_status()
        error = self.failure(rc, sig)
        output = self.final_text if self.final_text is not None else self.diagnostic()
        self._make_session_private()
        return ChildOutcome(
            exit_code=0 if error is None else 1,
            process_exit=128 + sig if sig else rc,
            signal=sig,
            output=output,
            error=error,
            usage=self.totals.usage,
            session_file=self.session_file if self.session_path.exists() else None,
        )

    def _make_session_private(self) -> None:
        """pi creates ``session.jsonl`` with the child's umask (the user's, for the files it
        writes in the project): make it 0600 like every file of a run, once it exists."""
        if self._session_private:
            return
        try:
            fd = open_regular(self.session_path)
        except OSError:
            return
        try:
            os.fchmod(fd, 0o600)
            self._session_private = True
        except OSError:
            pass  # not ours: leave it
        finally:
            os.close(fd)

    def failure(self, rc: int, sig: int | None) -> str | None:
        """Why the task failed (pi refused it, pi's last reply was an error or an abort, pi died
        before it was finished), or None; ``rc``/``sig``: how the process ended."""
        if self.prompt_error is not None:
            return f"pi refused the task: {self.prompt_error}"
        last = self.last_assistant or {}
        reason = last.get("stopReason")
        if reason in ("error", "aborted"):
            detail = (text_of(last.get("errorMessage")) or reason)[:4000]
            return f"pi {'failed' if reason == 'error' else 'was aborted'}: {detail}"
        if self.phase is not Phase.FINISHED:
            how = f"was killed by signal {sig}" if sig else f"exited with code {rc}"
            tail = self.stderr.tail_text().strip()[-2000:]
            return f"pi {how} before the task finished" + (f": {tail}" if tail else "")
        return None

    def diagnostic(self) -> str:
        """The output when pi gave no final text: the last event and the tail of its stderr."""
        tail = self.stderr.tail_text().strip()[-1000:]
        text = f"(pi produced no final text; last event: {self.last_event or 'none'}"
        return text + (f"; stderr: {tail})" if tail else ")")


_EVENT_HANDLERS: dict[str, Callable[[PiChild, Json], None]] = {
    "agent_start": PiChild._agent_start,
    "auto_retry_start": PiChild._work_started,
    "compaction_start": PiChild._work_started,
    "turn_start": PiChild._turn_start,
    "queue_update": PiChild._queue_update,
    "message_end": PiChild._message_end,
    "tool_execution_start": PiChild._tool_start,
    "tool_execution_end": PiChild._tool_end,
    "agent_end": PiChild._agent_end,
    "compaction_end": PiChild._may_be_idle,
    "auto_retry_end": PiChild._may_be_idle,
    "agent_settled": PiChild._may_be_idle,
}


def _slim(kind: str, event: Json, line: bytes) -> bytes | None:
    """What of a pi event goes to ``events.jsonl``: the line itself, except the bulk that says
    nothing new — ``role: "system"`` messages (pi 1.x: ~8 KB, the whole system prompt) are left
    out, and ``agent_end`` loses its copy of every message (they are in the session)."""
    message = event.get("message")
    if (
        kind in ("message_start", "message_end")
        and isinstance(message, dict)
        and message.get("role") == "system"
    ):
        return None
    messages = event.get("messages")
    if kind == "agent_end" and isinstance(messages, list):
        slim = {key: value for key, value in event.items() if key != "messages"}
        slim["messageCount"] = len(messages)
        return msgspec.json.encode(slim)
    return line


def pi_event_line(ts: str, child: int, kind: str, raw: bytes) -> bytes:
    """An ``events.jsonl`` line carrying one raw pi event, without re-encoding it."""
    head = json.dumps({"v": 1, "ts": ts, "type": f"pi.{kind}", "child": child}, separators=(",", ":"))
    return head[:-1].encode() + b',"data":' + raw + b"}"
