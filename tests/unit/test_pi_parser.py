"""The pi event parser on recordings of the real pi (fixtures/pi/<version>/): every recording of
every version is replayed — the supported 0.85.1 and 1.6.0, and 0.73.1, the previous pin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pisub.children.pi.events import message_text, tool_preview
from pisub.children.pi.framing import LineReader
from pisub.children.pi.rpc import Phase, PiChild, pi_argv
from pisub.protocol import AgentSpec, Limits, Manifest
from pisub.protocol.control import ReceiptState
from pisub.store.paths import RunPaths

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pi"
VERSIONS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


@pytest.fixture(params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Hooks:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.raw: list[str] = []
        self.activity_count = 0
        self.output_bytes = 0
        self.steers: list[tuple[str, str]] = []

    def activity(self, child: int) -> None:
        self.activity_count += 1

    def output(self, child: int, nbytes: int, truncated: bool) -> None:
        self.output_bytes += nbytes

    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        self.events.append((type_, data))

    def raw_event(self, child: int, kind: str, raw: bytes) -> None:
        json.loads(raw)
        self.raw.append(kind)

    def steer_update(self, request_id: str, state: ReceiptState, reason: str | None = None) -> None:
        self.steers.append((request_id, state.value))


class Stdin:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append(json.loads(data))

    def close(self) -> None:
        self.closed = True


def _child(tmp_path: Path) -> tuple[PiChild, Hooks, Stdin]:
    spec = AgentSpec(name="pi", runner="pi", command="pi")
    limits = Limits(timeout=None, idle_timeout=None, grace=1, output_cap=1 << 20, output_hard_cap=1 << 30)
    manifest = Manifest(
        v=1, run_id="r", created_at="t", agent=spec, task="hello", cwd=str(tmp_path), umask=18, limits=limits
    )
    hooks = Hooks()
    child = PiChild(0, hooks, manifest, RunPaths(tmp_path), {})
    stdin = Stdin()
    child.rpc.stdin = stdin  # type: ignore[assignment]
    return child, hooks, stdin


def _line(obj: dict[str, Any]) -> bytes:
    """One line of pi's stdout."""
    return json.dumps(obj).encode() + b"\n"


def _replay(tmp_path: Path, name: str, version: str) -> tuple[PiChild, Hooks, Stdin]:
    child, hooks, stdin = _child(tmp_path)
    data = (FIXTURES / version / name).read_bytes()
    for i in range(0, len(data), 997):  # odd chunk size: lines and UTF-8 split across reads
        child.feed(data[i : i + 997])
    return child, hooks, stdin


def test_plain_reply_becomes_the_output_and_the_log(tmp_path: Path, version: str) -> None:
    child, hooks, _ = _replay(tmp_path, "rpc-plain.jsonl", version)
    assert child.final_text == "Hello from the fake LLM. You said: hello"
    assert child.totals.usage.input == 100 and child.totals.usage.turns == 1
    assert child.progress.turns == 1
    assert "message_update" not in hooks.raw and "agent_end" in hooks.raw
    assert (tmp_path / "output-0.log").read_text() == "Hello from the fake LLM. You said: hello\n"


def test_tool_call_is_logged_as_one_line_and_counted(tmp_path: Path, version: str) -> None:
    child, _, _ = _replay(tmp_path, "rpc-toolcall.jsonl", version)
    assert child.final_text == "Tool said: hi"
    assert child.progress.tools == 1 and child.progress.turns == 2
    log = (tmp_path / "output-0.log").read_text()
    assert log == "Running a command.\ntool: bash echo hi\nTool said: hi\n"
    assert list(child.progress.recent) == ["Running a command.", "tool: bash echo hi", "Tool said: hi"]


def test_http_500_is_pis_error_and_the_diagnostic_names_the_last_event(tmp_path: Path, version: str) -> None:
    child, _, _ = _replay(tmp_path, "rpc-error500.jsonl", version)
    assert child.final_text is None
    assert child.last_assistant is not None
    assert child.last_assistant["stopReason"] == "error"
    error = child.failure(0, None) or ""
    assert error.startswith("pi failed: 500") and "fake server error" in error  # 0.85+: "500: <body>"
    assert "last event: agent_" in child.diagnostic()  # agent_end, or agent_settled since 0.80.4


def test_aborted_reply_is_reported_as_aborted(tmp_path: Path, version: str) -> None:
    child, _, _ = _replay(tmp_path, "rpc-abort.jsonl", version)
    assert child.last_assistant is not None and child.last_assistant["stopReason"] == "aborted"
    assert (child.failure(0, None) or "").startswith("pi was aborted")


def test_steer_recording_counts_turns(tmp_path: Path, version: str) -> None:
    child, hooks, _ = _replay(tmp_path, "rpc-steer.jsonl", version)
    assert child.progress.turns == 2
    assert "queue_update" in hooks.raw


def test_agent_end_asks_get_state_then_finishes(tmp_path: Path, version: str) -> None:
    child, _, stdin = _replay(tmp_path, "rpc-plain.jsonl", version)
    asks = [m for m in stdin.sent if m["type"] == "get_state"]
    assert asks, "agent_end must trigger a get_state idle check"
    child.feed(
        _line(
            {
                "id": asks[-1]["id"],
                "type": "response",
                "command": "get_state",
                "success": True,
                "data": {"isStreaming": False, "pendingMessageCount": 0},
            }
        )
    )
    assert child.phase is Phase.FINISHED and stdin.closed


def test_idle_check_ignored_when_work_started_since(tmp_path: Path, version: str) -> None:
    child, _, stdin = _replay(tmp_path, "rpc-plain.jsonl", version)
    ask = [m for m in stdin.sent if m["type"] == "get_state"][-1]
    child.feed(
        b'{"type":"auto_retry_start","attempt":1,"maxAttempts":3,"delayMs":1,"errorMessage":"x"}' + b"\n"
    )
    child.feed(
        _line(
            {
                "id": ask["id"],
                "type": "response",
                "command": "get_state",
                "success": True,
                "data": {"isStreaming": False, "pendingMessageCount": 0},
            }
        )
    )
    assert child.phase is not Phase.FINISHED


def test_bad_lines_are_logged_not_fatal(tmp_path: Path) -> None:
    child, hooks, _ = _child(tmp_path)
    child.feed(b"not json at all" + b"\n")
    child.feed(b"[1, 2]" + b"\n")
    child.feed(b'{"type":"response","command":"parse","success":false,"error":"Failed to parse"}' + b"\n")
    kinds = [k for k, _ in hooks.events]
    assert kinds == ["child.bad_line", "child.bad_line", "child.rpc_error"]


def test_line_reader_bounds_and_splits() -> None:
    reader = LineReader(max_line=10)
    assert list(reader.feed(b'{"a":"\xc3')) == []
    assert list(reader.feed(b'\xa9"}\n')) == ['{"a":"é"}'.encode()]
    assert list(reader.feed(b"x" * 25)) == []
    assert reader.oversized == 1
    assert list(reader.feed(b"yyy\nok\n")) == [b"ok"]
    assert list(reader.feed(b"a\n\nb\n")) == [b"a", b"b"]


def test_tool_preview_and_text() -> None:
    assert tool_preview("bash", {"command": "echo   hi\nthere"}) == "bash echo hi there"
    assert tool_preview("read", {"path": "/x/y.py"}) == "read /x/y.py"
    assert tool_preview("custom", {"n": 1}) == 'custom {"n":1}'
    assert len(tool_preview("bash", {"command": "x" * 500})) < 130
    assert (
        message_text(
            {"content": [{"type": "text", "text": "a"}, {"type": "thinking"}, {"type": "text", "text": "b"}]}
        )
        == "ab"
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ["--no-extensions", "--no-skills", "--no-prompt-templates"]),
        (
            {"model": "anthropic/claude", "thinking": "high"},
            ["--model", "anthropic/claude", "--thinking", "high"],
        ),
        ({"tools": ["read", "bash"]}, ["--tools", "read,bash"]),
        ({"tools": []}, ["--no-tools"]),
    ],
)
def test_pi_argv_follows_the_agent(fields: dict[str, Any], expected: list[str]) -> None:
    spec = AgentSpec(name="p", runner="pi", command="/bin/pi", **fields)
    argv = pi_argv(spec, Path("/r/session.jsonl"), None)
    assert argv[:5] == ["/bin/pi", "--mode", "rpc", "--session", "/r/session.jsonl"]
    joined = " ".join(argv)
    assert " ".join(expected) in joined
    spec = AgentSpec(
        name="p", runner="pi", command="/bin/pi", extensions=True, skills=True, prompt_templates=True
    )
    assert "--no-extensions" not in pi_argv(spec, Path("/s"), Path("/p"))
    assert pi_argv(spec, Path("/s"), Path("/p"))[-2:] == ["--append-system-prompt", "/p"]


def test_steer_matching_queued_then_delivered(tmp_path: Path) -> None:
    """Replay of rpc-steer: the steer is queued on queue_update and delivered on its user message."""
    child, hooks, stdin = _child(tmp_path)
    child.phase = Phase.WORKING
    assert child.steer("r1", "STEER: now say hi", "steer") is None
    assert stdin.sent[-1]["type"] == "prompt" and stdin.sent[-1]["streamingBehavior"] == "steer"
    child.feed((FIXTURES / VERSIONS[0] / "rpc-steer.jsonl").read_bytes())
    assert hooks.steers == [("r1", "queued"), ("r1", "delivered")]


def test_an_abort_before_pi_took_the_task_waits_then_fails_the_held_steers(tmp_path: Path) -> None:
    """pi drops an abort sent before it answered the task's prompt: the abort is a phase that
    waits (ABORT_HELD), refuses new steers, and fails the steers held before it."""
    child, hooks, stdin = _child(tmp_path)
    assert child.steer("r1", "early", "steer") is None
    assert child.abort() and child.phase is Phase.ABORT_HELD
    assert child.steer("r2", "late", "steer") == "the child has finished its work"
    assert not any(m["type"] == "abort" for m in stdin.sent)
    child._on_prompt({"success": True})
    assert child.phase in (Phase.ABORTING,)  # (mypy keeps the narrowing of the line above)
    assert [m["type"] for m in stdin.sent][-1] == "abort"
    assert hooks.steers == [("r1", "failed")]
    child._on_response({"id": stdin.sent[-1]["id"], "type": "response", "success": True})
    assert child.phase is Phase.FINISHED and stdin.closed


def _update(delta: object, kind: str = "text_delta") -> bytes:
    return _line(
        {"type": "message_update", "assistantMessageEvent": {"type": kind, "contentIndex": 0, "delta": delta}}
    )


def _assistant_end(text: str) -> bytes:
    message = {"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": "stop"}
    return _line({"type": "message_end", "message": message})


def test_a_reply_goes_to_the_log_as_its_deltas_come_and_its_end_adds_only_the_rest(tmp_path: Path) -> None:
    child, hooks, _ = _child(tmp_path)
    log = tmp_path / "output-0.log"
    child.feed(_line({"type": "message_start", "message": {"role": "assistant", "content": []}}))
    child.feed(_update("Hel"))
    assert log.read_text() == "Hel"
    child.feed(_update("lo \x1b[31mred"))  # kept as written: `logs` and the transcript escape it
    child.feed(_update("thinking...", kind="thinking_delta"))  # not the reply's text
    assert log.read_text() == "Hello \x1b[31mred"
    child.feed(_assistant_end("Hello \x1b[31mred, and the rest"))
    assert log.read_text() == "Hello \x1b[31mred, and the rest\n"
    assert child.final_text == "Hello \x1b[31mred, and the rest"
    assert hooks.output_bytes == len(log.read_bytes())
    assert "message_update" not in hooks.raw
    child.feed(_assistant_end("Second message, not streamed"))
    assert log.read_text().endswith("rest\nSecond message, not streamed\n")


@pytest.mark.parametrize(
    "update",
    [
        _update(123),
        _update(None),
        _update({"text": "x"}),
        _update(""),
        _line({"type": "message_update", "assistantMessageEvent": "text_delta"}),
        _line({"type": "message_update"}),
        _line({"type": "message_update", "assistantMessageEvent": {"type": ["text_delta"], "delta": "x"}}),
        b'{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"'
        + b"x" * 70_000
        + b'"}}\n',
        b'{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"\\ud800\\udfff-lone-\\ud800"}}\n',
        b'{"type":"message_update", "broken\n',
    ],
)
def test_hostile_updates_never_break_the_log_or_the_final_text(tmp_path: Path, update: bytes) -> None:
    child, _hooks, _ = _child(tmp_path)
    child.feed(update)
    child.feed(_assistant_end("The final text."))
    log = (tmp_path / "output-0.log").read_bytes()
    assert log.endswith(b"The final text.\n")
    assert log.count(b"The final text.") == 1
    assert child.final_text == "The final text."


def test_a_final_text_that_is_not_what_was_streamed_is_written_whole_after_a_line_break(
    tmp_path: Path,
) -> None:
    child, _, _ = _child(tmp_path)
    child.feed(_update("draft words"))
    child.feed(_assistant_end("Other words."))
    assert (tmp_path / "output-0.log").read_text() == "draft words\nOther words.\n"
    child.feed(_update("Cut sho"))  # pi ended with less than it streamed (an abort): nothing more
    child.feed(_assistant_end("Cut"))
    assert (tmp_path / "output-0.log").read_text().endswith("Other words.\nCut sho\n")


def test_streamed_text_stays_within_the_output_cap(tmp_path: Path) -> None:
    child, hooks, _ = _child(tmp_path)
    child.log.cap = 50
    child.reply.keep = 50
    for _ in range(100):
        child.feed(_update("0123456789"))
    child.feed(_assistant_end("0123456789" * 100))
    assert (tmp_path / "output-0.log").read_bytes() == b"0123456789" * 5
    assert [e for e, _ in hooks.events].count("child.output_truncated") == 1
    assert child.final_text == "0123456789" * 100
