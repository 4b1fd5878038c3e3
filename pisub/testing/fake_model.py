"""A scripted, OpenAI-compatible chat-completions server for running the real ``pi`` CLI offline.

Stdlib only. The server binds to ``127.0.0.1`` on a port chosen by the OS, speaks HTTP/1.1 and
streams replies as chunked Server-Sent Events, the way ``pi`` (provider api ``openai-completions``)
expects them.

The reply to ``POST /v1/chat/completions`` is chosen from the conversation, first rule that matches:

1. the last message has role ``tool``      -> text ``Tool said: <tool output, stripped>``;
2. the last user message contains ``ERROR500`` -> HTTP 500, JSON body, message ``fake server error``;
3. the last user message is a review request (it starts ``Review another agent's``, as pisub's
   review gates ask) and contains ``REVIEW_VERDICT:<json>`` (rest of that line) -> text
   ``Reviewed.`` plus a fenced ``review-verdict`` block holding ``<json>``;
4. the last user message contains ``CALLS:[["read", {"path": "x"}], ["bash", {...}]]`` (a JSON
   list on that line) -> text ``Calling tools.`` plus those tool calls in one message; else
   ``TOOL:<cmd>`` (``cmd`` = rest of that line, stripped) -> text ``Running a command.`` plus
   one ``bash`` tool call ``{"command": "<cmd>"}``; ``finish_reason: "tool_calls"``;
5. the last user message contains ``SLOW`` (or ``SLOW:<n>``) -> a long text in ``n`` chunks
   (default :attr:`FakeModelServer.slow_chunks`), :attr:`FakeModelServer.slow_delay` seconds apart;
6. any user message contains ``ECHO_HISTORY`` -> ``History: `` + the texts of all user messages,
   joined with `` | ``;
7. otherwise -> ``Hello from the fake LLM. You said: <last user text, stripped>``.

Every streamed reply ends with a ``finish_reason`` chunk, a usage chunk
(``{"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": <chunks>, ...}}``) and
``data: [DONE]``. ``GET /v1/models`` lists the single model ``fake-model``.

Library use::

    with FakeModelServer() as server:
        write_pi_agent_dir(agent_dir, server.base_url)
        env = {**os.environ, **pi_env(agent_dir)}
        ...  # run pi
        assert server.requests[-1]["messages"][-1]["role"] == "user"

Command line: ``python -m pisub.testing.fake_model [--port N] [--slow-delay S] [--port-file PATH]``
prints ``http://127.0.0.1:<port>/v1`` and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Final, Self

__all__ = [
    "DEFAULT_SLOW_CHUNKS",
    "DEFAULT_SLOW_DELAY",
    "FAKE_API_KEY",
    "FAKE_MODEL",
    "FAKE_PROVIDER",
    "PI_HERMETIC_ARGS",
    "FakeModelServer",
    "main",
    "pi_env",
    "write_pi_agent_dir",
]

FAKE_PROVIDER: Final = "fake"
FAKE_MODEL: Final = "fake-model"
FAKE_API_KEY: Final = "fake-key"
HOST: Final = "127.0.0.1"
DEFAULT_SLOW_CHUNKS: Final = 40
DEFAULT_SLOW_DELAY: Final = 0.25
PROMPT_TOKENS: Final = 100
TEXT_CHUNK_CHARS: Final = 10
TOOL_ARGS_CHUNK_CHARS: Final = 8
ERROR_MESSAGE: Final = "fake server error"

#: Flags that keep pi from reading extensions, skills, prompt templates and AGENTS.md/CLAUDE.md.
PI_HERMETIC_ARGS: Final[tuple[str, ...]] = (
    "--no-extensions",
    "--no-skills",
    "--no-prompt-templates",
    "--no-context-files",
)

_SLOW_RE: Final = re.compile(r"SLOW(?::(\d+))?")
_TOOL_RE: Final = re.compile(r"TOOL:([^\r\n]*)")
_CALLS_RE: Final = re.compile(r"CALLS:([^\r\n]*)")
_VERDICT_RE: Final = re.compile(r"REVIEW_VERDICT:([^\r\n]*)")
REVIEW_REQUEST: Final = "Review another agent's"
# Errors that mean "the client went away"; never worth a traceback.
_DISCONNECT_ERRORS: Final = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)

JsonDict = dict[str, Any]


class _ServerStopping(Exception):
    """Raised inside a streaming handler when the server is shutting down."""


# --------------------------------------------------------------------------- reply scripting


def _content_text(content: object) -> str:
    """Text of a message ``content``: a string, or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "\n".join(parts)
    return ""


def _messages(body: JsonDict) -> list[JsonDict]:
    raw = body.get("messages")
    if not isinstance(raw, list):
        return []
    return [m for m in raw if isinstance(m, dict)]


class _Reply:
    """What to answer to one chat-completions request."""

    def __init__(
        self,
        *,
        text: str = "",
        text_chunks: list[str] | None = None,
        tool_command: str | None = None,
        tool_calls: list[tuple[str, JsonDict]] | None = None,
        error_status: int | None = None,
        chunk_delay: float = 0.0,
    ) -> None:
        self.text = text
        self.text_chunks = text_chunks if text_chunks is not None else _split(text, TEXT_CHUNK_CHARS)
        self.tool_calls: list[tuple[str, JsonDict]] = list(tool_calls or [])
        if tool_command is not None:
            self.tool_calls.append(("bash", {"command": tool_command}))
        self.error_status = error_status
        self.chunk_delay = chunk_delay

    @property
    def tool_command(self) -> str | None:
        """Whether this reply calls tools (the first call's command, for a bash call)."""
        if not self.tool_calls:
            return None
        return str(self.tool_calls[0][1].get("command", ""))


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _slow_chunks(n: int) -> list[str]:
    return [f"Slow chunk {i} of {n}. " for i in range(1, n + 1)]


def choose_reply(body: JsonDict, *, slow_chunks: int, slow_delay: float) -> _Reply:
    """Pick the scripted reply for a decoded request body (see the module docstring)."""
    messages = _messages(body)
    if messages and messages[-1].get("role") == "tool":
        return _Reply(text="Tool said: " + _content_text(messages[-1].get("content")).strip())

    user_texts = [_content_text(m.get("content")) for m in messages if m.get("role") == "user"]
    last_user = user_texts[-1] if user_texts else ""

    if "ERROR500" in last_user:
        return _Reply(error_status=500)
    verdict = _VERDICT_RE.search(last_user) if last_user.startswith(REVIEW_REQUEST) else None
    if verdict is not None:
        text = f"Reviewed.\n```review-verdict\n{verdict.group(1).strip()}\n```"
        return _Reply(text=text)
    calls = _CALLS_RE.search(last_user)
    if calls is not None:
        try:
            wanted = json.loads(calls.group(1))
            parsed = [(str(name), dict(args)) for name, args in wanted]
        except (ValueError, TypeError):
            parsed = []
        if parsed:
            text = "Calling tools."
            return _Reply(text=text, text_chunks=[text], tool_calls=parsed)
    tool = _TOOL_RE.search(last_user)
    if tool is not None:
        text = "Running a command."
        return _Reply(text=text, text_chunks=[text], tool_command=tool.group(1).strip())
    slow = _SLOW_RE.search(last_user)
    if slow is not None:
        n = int(slow.group(1)) if slow.group(1) else slow_chunks
        chunks = _slow_chunks(max(1, n))
        return _Reply(text="".join(chunks), text_chunks=chunks, chunk_delay=slow_delay)
    if any("ECHO_HISTORY" in t for t in user_texts):
        return _Reply(text="History: " + " | ".join(t.strip() for t in user_texts))
    return _Reply(text="Hello from the fake LLM. You said: " + last_user.strip())


# --------------------------------------------------------------------------- HTTP server


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: FakeModelServer, port: int) -> None:
        self.owner = owner
        self.open_connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__((HOST, port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (*_DISCONNECT_ERRORS, _ServerStopping)) or self.owner.stopping:
            return
        super().handle_error(request, client_address)

    def close_open_connections(self) -> None:
        with self.connections_lock:
            conns = list(self.open_connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeModel/1.0"
    sys_version = ""
    server: _HTTPServer

    # -- plumbing

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.open_connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.open_connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request logging."""

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (*_DISCONNECT_ERRORS, _ServerStopping):
            self.close_connection = True

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = bytearray()
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline(65537)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_json(self, status: int, payload: JsonDict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _sse(self, payload: JsonDict | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
        self._write_chunk(b"data: " + text.encode() + b"\n\n")

    # -- routes

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [{"id": FAKE_MODEL, "object": "model", "created": 0, "owned_by": FAKE_PROVIDER}],
                },
            )
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        raw = self._read_body()
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            error = {"message": "request body is not a JSON object", "type": "bad_request"}
            self._send_json(400, {"error": error})
            return
        owner = self.server.owner
        owner.record_request(body)
        reply = choose_reply(body, slow_chunks=owner.slow_chunks, slow_delay=owner.slow_delay)
        if reply.error_status is not None:
            self._send_json(
                reply.error_status,
                {"error": {"message": ERROR_MESSAGE, "type": "server_error", "param": None, "code": None}},
            )
            return
        model = str(body.get("model") or FAKE_MODEL)
        if body.get("stream"):
            self._stream(reply, model)
        else:
            self._send_json(200, _completion(reply, model))

    def _stream(self, reply: _Reply, model: str) -> None:
        owner = self.server.owner
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        completion_id = "chatcmpl-" + uuid.uuid4().hex[:12]
        created = int(time.time())
        count = 0
        for delta in _stream_deltas(reply):
            if reply.chunk_delay > 0 and "content" in delta and owner.wait_stopping(reply.chunk_delay):
                raise _ServerStopping
            self._sse(_chunk(completion_id, created, model, delta, None))
            count += 1
        finish = "tool_calls" if reply.tool_command is not None else "stop"
        self._sse(_chunk(completion_id, created, model, {}, finish))
        self._sse(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage(count),
            }
        )
        self._sse("[DONE]")
        self._write_chunk(b"")


def _stream_deltas(reply: _Reply) -> Iterator[JsonDict]:
    first = True
    for piece in reply.text_chunks:
        if not piece:
            continue
        delta: JsonDict = {"role": "assistant", "content": piece} if first else {"content": piece}
        first = False
        yield delta
    for index, (name, args) in enumerate(reply.tool_calls):
        call_id = "call_" + uuid.uuid4().hex[:8]
        yield {
            "tool_calls": [
                {
                    "index": index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
        }
        for piece in _split(json.dumps(args), TOOL_ARGS_CHUNK_CHARS):
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}


def _chunk(completion_id: str, created: int, model: str, delta: JsonDict, finish: str | None) -> JsonDict:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _usage(completion_tokens: int) -> JsonDict:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion_tokens,
        "total_tokens": PROMPT_TOKENS + completion_tokens,
    }


def _completion(reply: _Reply, model: str) -> JsonDict:
    """A non-streaming ``chat.completion`` (pi always streams; this is for other clients)."""
    message: JsonDict = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": "call_" + uuid.uuid4().hex[:8],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for name, args in reply.tool_calls
        ]
    count = len(reply.text_chunks)
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex[:12],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_command is not None else "stop",
            }
        ],
        "usage": _usage(count),
    }


class FakeModelServer:
    """The fake model server; runs in a background thread between :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        port: int = 0,
        *,
        slow_delay: float = DEFAULT_SLOW_DELAY,
        slow_chunks: int = DEFAULT_SLOW_CHUNKS,
    ) -> None:
        self.slow_delay = slow_delay
        self.slow_chunks = slow_chunks
        #: Every decoded JSON body received at ``/v1/chat/completions``, in arrival order.
        self.requests: list[JsonDict] = []
        self._requested_port = port
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> None:
        """Bind ``127.0.0.1`` and serve in a daemon thread. Calling it twice is an error."""
        if self._httpd is not None:
            raise RuntimeError("FakeModelServer already started")
        self._stopping.clear()
        httpd = _HTTPServer(self, self._requested_port)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-model-server", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, cut open connections (including streams in progress). Idempotent."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.close_open_connections()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- facts

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeModelServer is not running")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``, the ``baseUrl`` for pi's models.json."""
        return f"http://{HOST}:{self.port}/v1"

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wait_stopping(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True if the server began stopping meanwhile."""
        return self._stopping.wait(timeout)

    def record_request(self, body: JsonDict) -> None:
        with self._lock:
            self.requests.append(body)
            self._lock.notify_all()

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[JsonDict]:
        """Block until at least ``count`` requests arrived; return a snapshot. TimeoutError otherwise."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.requests) >= count, timeout=timeout):
                raise TimeoutError(f"expected {count} requests, got {len(self.requests)} in {timeout}s")
            return list(self.requests)


# --------------------------------------------------------------------------- pi configuration


def write_pi_agent_dir(agent_dir: Path, base_url: str) -> None:
    """Write ``models.json`` and ``settings.json`` for pi into ``agent_dir`` (created if missing)."""
    agent_dir.mkdir(parents=True, exist_ok=True)
    models = {
        "providers": {
            FAKE_PROVIDER: {
                "baseUrl": base_url,
                "api": "openai-completions",
                "apiKey": FAKE_API_KEY,
                "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                "models": [
                    {
                        "id": FAKE_MODEL,
                        "name": "Fake Model",
                        "reasoning": False,
                        "input": ["text"],
                        "contextWindow": 128000,
                        "maxTokens": 4096,
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                    }
                ],
            }
        }
    }
    settings = {
        "defaultProvider": FAKE_PROVIDER,
        "defaultModel": FAKE_MODEL,
        "enableInstallTelemetry": False,
        "quietStartup": True,
        "retry": {"enabled": False, "provider": {"maxRetries": 0}},
    }
    (agent_dir / "models.json").write_text(json.dumps(models, indent=2) + "\n", encoding="utf-8")
    (agent_dir / "settings.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def pi_env(agent_dir: Path) -> dict[str, str]:
    """Environment variables to add to ``os.environ`` for a hermetic, offline pi child."""
    return {
        "PI_CODING_AGENT_DIR": str(agent_dir),
        "PI_OFFLINE": "1",
        "PI_SKIP_VERSION_CHECK": "1",
        "PI_TELEMETRY": "0",
        "NO_PROXY": "127.0.0.1,localhost",
    }


# --------------------------------------------------------------------------- command line


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


MARKERS_HELP: Final = """\
The reply is scripted by markers in the task (the last user message); first match wins:
  (a tool result)       the last message is a tool's output -> "Tool said: <output>"
  ERROR500              HTTP 500 "fake server error"
  REVIEW_VERDICT:<json> in a review request (pisub's review gates) -> a review-verdict block
  CALLS:[[name, args]]  those tool calls in one message, e.g. CALLS:[["read", {"path": "x"}]]
  TOOL:<cmd>            one bash tool call running <cmd> (rest of the line)
  SLOW or SLOW:<n>      a long text streamed in n chunks, --slow-delay seconds apart
  ECHO_HISTORY          (in any user message) "History: " + every user message, joined by " | "
  (anything else)       "Hello from the fake LLM. You said: <task>"

pi's config for this server: --pi-agent-dir DIR writes models.json and settings.json (provider
"fake", model "fake-model", no real key); run pi with PI_CODING_AGENT_DIR=DIR PI_OFFLINE=1.
A pisub checkout's scripts/env.sh starts one in the background for you."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pisub.testing.fake_model",
        description="Scripted OpenAI-compatible chat-completions server on 127.0.0.1 for pi tests.",
        epilog=MARKERS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: 0, chosen by the OS)")
    parser.add_argument(
        "--slow-delay",
        type=float,
        default=DEFAULT_SLOW_DELAY,
        help=f"seconds between chunks of a SLOW reply (default: {DEFAULT_SLOW_DELAY})",
    )
    parser.add_argument(
        "--slow-chunks",
        type=int,
        default=DEFAULT_SLOW_CHUNKS,
        help=f"chunks in a SLOW reply without an explicit SLOW:<n> (default: {DEFAULT_SLOW_CHUNKS})",
    )
    parser.add_argument("--port-file", type=Path, help="also write the base URL to this file (atomically)")
    parser.add_argument(
        "--pi-agent-dir",
        type=Path,
        help="write pi's models.json and settings.json for this server into this directory",
    )
    args = parser.parse_args(argv)

    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    server = FakeModelServer(args.port, slow_delay=args.slow_delay, slow_chunks=args.slow_chunks)
    server.start()
    try:
        if args.pi_agent_dir is not None:
            write_pi_agent_dir(args.pi_agent_dir, server.base_url)
        if args.port_file is not None:
            _write_atomic(args.port_file, server.base_url + "\n")
        print(server.base_url, flush=True)
        while not done.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
