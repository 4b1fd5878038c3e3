"""The ``pi`` coding agent as the child, driven through ``pi --mode rpc``.

pi reads one JSON command per line on stdin and writes responses (matched by ``id``)
and session events on stdout. The driver:

1. sends ``get_state`` (pi prints nothing until it is ready), then
   ``set_auto_retry false`` (so one ``agent_end`` really ends an attempt), then the task
   as the first ``prompt``;
2. mirrors every event except the high-volume ``message_update`` into ``events.jsonl``,
   writes assistant text (as its deltas stream in) and one ``tool: <name> <preview>`` line per
   tool call to ``output-<N>.log``, sums usage and tracks turns and tools;
3. after each ``agent_end`` asks ``get_state``; when pi says ``isStreaming: false,
   pendingMessageCount: 0`` and nothing started since, the child is finished and its
   stdin is closed (pi exits at once; in RPC mode it never exits by itself).

pi's own exit code says nothing about the outcome: the last assistant ``message_end``
does (``stopReason`` ``error`` / ``aborted`` and ``errorMessage``).
"""

from __future__ import annotations

import enum
import errno
import json
import os
import selectors
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from pisub.children.base import ChildHooks, ChildOutcome
from pisub.children.pi.events import (
    MAX_UPDATE_LINE,
    ReplyStream,
    UsageTotals,
    event_kind,
    failure_of,
    message_text,
    queue_texts,
    slim_event,
    text_of,
    tool_ended,
    tool_started,
)
from pisub.children.pi.framing import (
    MAX_LINE,
    READ_CHUNK,
    Json,
    LineReader,
    ResponseHandler,
    RpcChannel,
    decode_object,
)
from pisub.children.pi.steers import Steer, SteerBook, SteerState
from pisub.children.pi.versions import caps_of, install_hint
from pisub.children.process import PipeWriter, ProcessChild
from pisub.core.fsio import atomic_write, open_regular
from pisub.core.strict_path import unsafe_ancestor
from pisub.defaults import TAIL_BYTES
from pisub.errors import LaunchFailed
from pisub.protocol.manifest import AgentSpec, Manifest
from pisub.store.output import StreamSink
from pisub.store.paths import RunPaths

INTERRUPTED_REASON = "the child was interrupted"


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
        raise LaunchFailed(f"PISUB_PI_BIN={configured} is not an executable file; {install_hint()}")
    found = shutil.which("pi", path=env.get("PATH"))
    if found is None:
        raise LaunchFailed(f"the pi coding agent was not found on PATH; {install_hint()}")
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
        argv += [
            "--system-prompt" if spec.system_prompt_mode == "replace" else "--append-system-prompt",
            str(system_prompt_file),
        ]
    for extension in extensions or []:
        argv += ["--extension", str(extension)]  # loaded even with --no-extensions
    return [*argv, *spec.args]


class Phase(enum.Enum):
    """The pi child's lifecycle, as the runner drives it."""

    STARTING = "starting"
    """Before pi answered the task's prompt: steers and aborts are held."""
    WORKING = "working"
    """pi took the task: steers and aborts go to it."""
    ABORT_HELD = "abort_held"
    """Interrupted before pi answered the task's prompt: the abort is sent once it has, the
    held steers fail then, and no new steer is taken."""
    ABORTING = "aborting"
    """The abort went to pi: no new steer is taken; pi's answer finishes the child."""
    FINISHED = "finished"
    """Idle, refused or aborted: its stdin is closed, pi exits."""

    @property
    def aborted(self) -> bool:
        return self in (Phase.ABORT_HELD, Phase.ABORTING)


class PiChild(ProcessChild):
    """A pi coding-agent child in RPC mode: the runner's :class:`ProcessChild` on top of the
    RPC channel (:mod:`~pisub.children.pi.framing`), pi's events read with
    :mod:`~pisub.children.pi.events` and steers kept in a :class:`SteerBook`."""

    kind = "pi"

    def __init__(
        self, index: int, hooks: ChildHooks, manifest: Manifest, paths: RunPaths, env: Mapping[str, str]
    ) -> None:
        super().__init__(index, hooks)
        self.manifest = manifest
        self.paths = paths
        self.env = dict(env)
        self.session_path = paths.pi_session(manifest.session_file, manifest.session_dir)
        self.first_prompt = manifest.task
        """The task, or for a resume the briefs followed by the message."""
        self.session_file = str(self.session_path)
        self.log = StreamSink(paths.output_log(index), manifest.limits.output_cap, TAIL_BYTES)
        self.stderr = StreamSink(
            paths.stderr_log(index) if manifest.artifacts else None, manifest.limits.output_cap, TAIL_BYTES
        )
        self.sinks = (self.log, self.stderr)
        self.reader = LineReader()
        self.rpc = RpcChannel()
        self._epoch = 0  # bumped by anything that starts work; invalidates idle checks
        self._streaming = False
        self.phase = Phase.STARTING
        self.prompt_error: str | None = None
        self.last_event: str | None = None
        self.last_assistant: Json | None = None
        self.final_text: str | None = None
        self.totals = UsageTotals()
        self.reply = ReplyStream(manifest.limits.output_cap)
        self.steers = SteerBook(hooks)
        self._task_seen = False
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
        if self.manifest.session_dir is not None or not self.session_path.is_relative_to(
            self.paths.root.parent
        ):
            self._prepare_session()  # kept outside the runs (--session-dir, or a resume of one)
        argv = pi_argv(spec, self.session_path, prompt_file, extensions)
        self.spawn(argv, cwd=self.manifest.cwd, env=self.env, umask=self.manifest.umask)

    def register(self, sel: selectors.BaseSelector) -> None:
        super().register(sel)
        assert self.proc and self.proc.stdout and self.proc.stderr and self.proc.stdin
        sel.register(self.proc.stdout, selectors.EVENT_READ, self._on_stdout)
        sel.register(self.proc.stderr, selectors.EVENT_READ, self._on_stderr)
        self._open_streams = 2
        self.rpc.stdin = PipeWriter(self.proc.stdin, sel)
        self.send({"type": "get_state"}, self._on_ready)

    def send(self, command: Json, on_response: ResponseHandler | None = None) -> str:
        """Send one RPC command; ``on_response`` gets its response (matched by id)."""
        return self.rpc.send(command, on_response)

    def finish(self) -> None:
        """The work is done: close stdin so that pi exits."""
        if self.phase is not Phase.FINISHED:
            self.phase = Phase.FINISHED
            self.hooks.event("child.finishing", self.index, reason="idle")
            self.rpc.close()

    # -- the start-up sequence ------------------------------------------------------------
    def _on_ready(self, _resp: Json) -> None:
        self.send({"type": "set_auto_retry", "enabled": False}, self._on_retry_off)

    def _on_retry_off(self, _resp: Json) -> None:
        self._epoch += 1
        self.send({"type": "prompt", "message": self.first_prompt}, self._on_prompt)

    def _on_prompt(self, resp: Json) -> None:
        held_abort = self.phase is Phase.ABORT_HELD
        self.phase = _AFTER_PROMPT.get(self.phase, self.phase)
        if not resp.get("success", False):
            self.prompt_error = (text_of(resp.get("error")) or "pi refused the prompt")[:2000]
            self.finish()
            return
        # pi drops steers and aborts sent before it answered the first prompt: they waited.
        if held_abort:
            self._send_abort()
        for item in self.steers.held():
            if held_abort:  # interrupted before pi was ready: never start its turn
                self.steers.fail(item, INTERRUPTED_REASON)
            else:
                self._send_steer(item)

    # -- control ------------------------------------------------------------------
    def steer(self, request_id: str, message: str, behavior: str) -> str | None:
        if self.phase is Phase.FINISHED or self.phase.aborted:
            return "the child has finished its work"
        item = self.steers.add(request_id, message, behavior)
        if self.phase is Phase.WORKING:
            self._send_steer(item)
        return None

    def _send_steer(self, item: Steer) -> None:
        # ``prompt`` with a streamingBehavior steers (or queues a follow-up) while pi works
        # and starts a new turn when it is idle, decided inside pi: no race with agent_end.
        item.state = SteerState.SENT
        self._epoch += 1
        command = {"type": "prompt", "message": item.text, "streamingBehavior": item.behavior}
        self.send(command, lambda resp: self._on_steer_response(item, resp))

    def _on_steer_response(self, item: Steer, resp: Json) -> None:
        if resp.get("success", False):
            return
        reason = (text_of(resp.get("error")) or "pi refused it")[:2000]
        if self.steers.fail(item, reason) and not self._streaming:
            self._ask_idle()  # the refused steer invalidated the idle check: ask again

    def abort(self) -> bool:
        if self.phase in (Phase.STARTING, Phase.ABORT_HELD):
            self.phase = Phase.ABORT_HELD
        elif self.phase is not Phase.FINISHED:
            self.phase = Phase.ABORTING
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
        if isinstance(data, dict):
            self.steers.cleared(queue_texts(data))

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
        if len(line) > MAX_UPDATE_LINE and line.startswith(b'{"type":"message_update"'):
            self.hooks.activity(self.index)  # the stream is alive; its text comes at the end
            return
        obj = decode_object(line)
        if obj is None:
            self.hooks.event("child.bad_line", self.index, preview=line[:200].decode("utf-8", "replace"))
            return
        kind = event_kind(obj)
        if kind == "response":
            self._on_response(obj)
        elif kind == "message_update":  # not mirrored (one per token): its text goes to the log
            self._write_log(self.reply.delta(obj))
        else:
            self.last_event = kind
            raw = slim_event(kind, obj, line)
            if raw is not None:
                self.hooks.raw_event(self.index, kind, raw)
            handler = _EVENT_HANDLERS.get(kind)
            if handler is not None:
                handler(self, obj)
        self.hooks.activity(self.index)

    def _on_response(self, resp: Json) -> None:
        handler = self.rpc.handler_of(resp)
        if handler is not None:
            handler(resp)
        elif resp.get("success", True) is not True:
            command, error = text_of(resp.get("command")), text_of(resp.get("error"))
            self.hooks.event("child.rpc_error", self.index, command=command, error=error and error[:2000])

    # -- events ---------------------------------------------------------------------
    def _agent_start(self, _ev: Json) -> None:
        self._streaming = True
        self._epoch += 1

    def _work_started(self, _ev: Json) -> None:
        self._epoch += 1

    def _turn_start(self, _ev: Json) -> None:
        self.progress.turns += 1

    def _queue_update(self, ev: Json) -> None:
        self.steers.listed(queue_texts(ev))

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
        rest = self.reply.end(text)
        if rest is not None:  # streamed: only the rest, and the line ended
            self._write_log(rest)
            self._progress_lines(text)
        elif text.strip():
            self._log(text)

    def _user_message(self, message: Json) -> None:
        text = message_text(message)
        if not self._task_seen and text == self.first_prompt:
            self._task_seen = True
            return
        self.steers.delivered(text)

    def _tool_start(self, ev: Json) -> None:
        self._log(f"tool: {tool_started(self.progress, ev)}")

    def _tool_end(self, ev: Json) -> None:
        tool_ended(self.progress, ev)

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
        self._write_log(text if text.endswith("\n") else text + "\n")
        self._progress_lines(text)

    def _write_log(self, text: str) -> None:
        """Append ``text`` to the output log (up to its cap)."""
        if not text:
            return
        data = text.encode("utf-8", "replace")
        newly = self.log.feed(data)
        if newly:
            self.hooks.event("child.output_truncated", self.index, log=str(self.log.path), cap=self.log.cap)
        self.hooks.output(self.index, len(data), self.log.truncated)

    def _progress_lines(self, text: str) -> None:
        for line in text.splitlines():
            self.progress.add_line(line)

    # -- the end ------------------------------------------------------------------
    def close(self, sel: selectors.BaseSelector) -> None:
        self.rpc.abort()  # what was still queued for pi is dropped
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

    def _prepare_session(self) -> None:
        """A session kept outside the runs (``--session-dir``) is 0600 from its first byte:
        created empty here (pi writes its header into an empty session file) or made 0600
        before pi opens it, once its path is checked again (no symlink, no directory above it
        someone else may change: pi reopens it by name).

        Raises:
            OSError: the path is no longer safe, or the file cannot be made.
        """
        problem = unsafe_ancestor(self.session_path)
        if problem is not None:
            raise OSError(errno.EPERM, f"the session path is not safe: {problem}")
        fd = open_regular(self.session_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        self._session_private = True

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
        replied = failure_of(self.last_assistant)
        if replied is not None:
            return replied
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


_AFTER_PROMPT = {Phase.STARTING: Phase.WORKING, Phase.ABORT_HELD: Phase.ABORTING}
"""The phase once pi answered the task's prompt."""

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


def pi_event_line(ts: str, child: int, kind: str, raw: bytes) -> bytes:
    """An ``events.jsonl`` line carrying one raw pi event, without re-encoding it."""
    head = json.dumps({"v": 1, "ts": ts, "type": f"pi.{kind}", "child": child}, separators=(",", ":"))
    return head[:-1].encode() + b',"data":' + raw + b"}"
