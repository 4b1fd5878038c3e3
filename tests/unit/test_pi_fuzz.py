"""pi's stdout is hostile input: a model steers what pi prints (a web page the agent read can
ask for a tool call with any arguments). Whatever arrives, the parser never raises, and what it
hands the runner — events, progress, usage, the outcome — always encodes."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pisub.children.pi.rpc import PiChild
from pisub.core.redact import scrub
from pisub.protocol import AgentSpec, Event, Limits, Manifest, RunState, Status, StepState, StepStatus, encode
from pisub.protocol.control import ReceiptState
from pisub.store.paths import RunPaths
from pisub.store.results import make_result

EVENT_TYPES = [
    "response",
    "agent_start",
    "agent_end",
    "turn_start",
    "turn_end",
    "message_start",
    "message_update",
    "message_end",
    "tool_execution_start",
    "tool_execution_end",
    "queue_update",
    "auto_retry_start",
    "compaction_start",
    "compaction_end",
]

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=25,
)
CONTENT = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "thinking", "toolCall", 5])}, optional={"text": JSON}
    ),
    max_size=3,
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "assistant", "toolResult", 3]) | JSON,
        "content": CONTENT | JSON,
        "usage": st.fixed_dictionaries(
            {},
            optional={
                "input": JSON,
                "output": JSON,
                "cacheRead": JSON,
                "cost": JSON | st.just({"total": 1e308}),
            },
        ),
        "stopReason": st.sampled_from(["stop", "error", "aborted"]) | JSON,
        "errorMessage": JSON,
    },
)
EVENT = st.fixed_dictionaries(
    {"type": st.sampled_from(EVENT_TYPES) | JSON},
    optional={
        "id": st.sampled_from([f"pisub-{n}" for n in range(1, 8)]) | JSON,
        "success": JSON,
        "error": JSON,
        "command": JSON,
        "data": st.fixed_dictionaries({}, optional={"isStreaming": JSON, "pendingMessageCount": JSON}) | JSON,
        "message": MESSAGE | JSON,
        "toolName": JSON,
        "args": JSON,
        "steering": st.lists(st.text(max_size=10), max_size=3) | JSON,
        "followUp": JSON,
    },
)


def _deep(depth: int, kind: str) -> bytes:
    nest = b"[" * depth + b"]" * depth if kind == "list" else b'{"a":' * depth + b"1" + b"}" * depth
    return b'{"type":"tool_execution_start","toolName":"bash","args":' + nest + b"}"


LINE = (
    EVENT.map(lambda e: json.dumps(e).encode())
    | st.binary(max_size=200)
    | st.tuples(st.integers(min_value=1, max_value=50_000), st.sampled_from(["list", "dict"])).map(
        lambda t: _deep(*t)
    )
    | st.sampled_from(
        [
            b'{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":5}]}}',
            b'{"type":"queue_update","steering":5,"followUp":{"a":1}}',
            b'{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":["x"]}]}}',
            b'{"type":"response","id":"pisub-3","success":false,"error":[[[[[]]]]]}',
            b'{"type":"message_end","message":{"role":"assistant","usage":{"input":1e400}}}',
            b'{"type":' + b'"x' * 10_000 + b'"}',
        ]
    )
)


class Hooks:
    """Encodes everything it is given, as the runner's recorder would."""

    def activity(self, child: int) -> None:
        return None

    def output(self, child: int, nbytes: int, truncated: bool) -> None:
        return None

    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        encode(Event(v=1, ts="t", type=type_, child=child, data=data))

    def raw_event(self, child: int, kind: str, raw: bytes) -> None:
        assert raw.startswith(b"{") and "\n" not in kind

    def steer_update(self, request_id: str, state: ReceiptState, reason: str | None = None) -> None:
        encode(reason)


def _child(tmp_path: Path) -> PiChild:
    spec = AgentSpec(name="pi", runner="pi", command="pi")
    limits = Limits(timeout=None, idle_timeout=None, grace=1, output_cap=1 << 16, output_hard_cap=1 << 30)
    manifest = Manifest(
        v=1, run_id="r", created_at="t", agent=spec, task="hello", cwd=str(tmp_path), umask=18, limits=limits
    )
    return PiChild(0, Hooks(), manifest, RunPaths(tmp_path), {})


def _assert_hands_over_cleanly(child: PiChild) -> None:
    progress = child.progress
    step = StepStatus(
        index=0,
        status=StepState.RUNNING,
        turn_count=progress.turns,
        tool_count=progress.tools,
        current_tool=progress.current_tool,
        recent_output=list(progress.recent),
    )
    status = Status(
        v=1,
        run_id="r",
        state=RunState.RUNNING,
        agent="pi",
        runner="pi",
        host="h",
        started_at="t",
        updated_at="t",
    )
    status.steps = [step]
    encode(scrub(status))
    error = child.failure(0, None)
    result = make_result(
        run_id="r",
        state="failed" if error else "complete",
        agent="pi",
        task="t",
        exit_code=1 if error else 0,
        output=child.final_text or child.diagnostic(),
        usage=child.totals.usage,
    )
    json.loads(encode(result))  # finite numbers: every JSON reader can take it back


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # examples: the profile's
@given(lines=st.lists(LINE, min_size=1, max_size=12), chunk=st.integers(min_value=1, max_value=4096))
def test_parser_never_raises_on_hostile_output(tmp_path: Path, lines: list[bytes], chunk: int) -> None:
    child = _child(tmp_path)
    child.steer("req-1", "x", "steer")
    data = b"\n".join(lines) + b"\n"
    for start in range(0, len(data), chunk):
        child.feed(data[start : start + chunk])
    _assert_hands_over_cleanly(child)
    child.log.close()
    child.stderr.close()


def test_deep_and_mistyped_tool_calls_are_survived(tmp_path: Path) -> None:
    """Repro 7 of the hardening issue, on the parser: 100,000 levels of nesting in a tool call's
    arguments, and ``"text": 5`` / ``"steering": 5`` where strings and lists belong."""
    child = _child(tmp_path)
    for line in (
        _deep(100_000, "list"),
        _deep(100_000, "dict"),
        b'{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":5}]}}',
        b'{"type":"queue_update","steering":5}',
        b'{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"done"}]}}',
    ):
        child.feed(line + b"\n")
    assert child.final_text == "done"
    _assert_hands_over_cleanly(child)


def test_a_deep_but_decodable_tool_call_gets_a_bounded_preview(tmp_path: Path) -> None:
    child = _child(tmp_path)
    child.feed(_deep(400, "list") + b"\n")
    assert child.progress.tools == 1
    assert child.progress.current_tool == "bash [[[[…]]]]"
