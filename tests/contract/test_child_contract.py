"""The child contract (pisub/children/base.py), which every kind of child passes: the
external CLI, pi in RPC mode (here a small stand-in that speaks pi's protocol) and the scripted
child the supervisor's unit tests use."""

from __future__ import annotations

import selectors
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pisub.children.base import Child, ChildHooks
from pisub.children.external_cli import ExternalCliChild
from pisub.children.pi.rpc import PiChild
from pisub.core.fsio import private_mkdir
from pisub.protocol import AgentSpec, Limits, Manifest
from pisub.protocol.control import ReceiptState
from pisub.store.paths import RunPaths
from pisub.testing.scripted_child import ScriptedChild, Step

# Speaks enough of pi's RPC protocol: answers every command, works on a prompt until stdin closes.
FAKE_PI = textwrap.dedent("""
    import json, sys
    def emit(obj):
        sys.stdout.write(json.dumps(obj) + "\\n"); sys.stdout.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        emit({"type": "response", "id": cmd.get("id"), "command": cmd["type"], "success": True,
              "data": {"isStreaming": False, "pendingMessageCount": 0}})
        if cmd["type"] == "prompt" and "FINISH" in cmd.get("message", ""):
            emit({"type": "agent_start"})
            emit({"type": "message_end", "message": {"role": "assistant",
                  "content": [{"type": "text", "text": "done"}], "stopReason": "stop"}})
            emit({"type": "agent_end", "messages": []})
""")


class Hooks:
    def __init__(self) -> None:
        self.activity_count = 0
        self.events: list[str] = []
        self.steers: list[tuple[str, ReceiptState]] = []

    def activity(self, child: int) -> None:
        self.activity_count += 1

    def output(self, child: int, nbytes: int, truncated: bool) -> None:
        return None

    def event(self, type_: str, child: int | None = None, **data: object) -> None:
        self.events.append(type_)

    def raw_event(self, child: int, kind: str, raw: bytes) -> None:
        self.events.append(f"pi.{kind}")

    def steer_update(self, request_id: str, state: ReceiptState, reason: str | None = None) -> None:
        self.steers.append((request_id, state))


def _manifest(tmp_path: Path, task: str, spec: AgentSpec) -> tuple[Manifest, RunPaths]:
    paths = RunPaths(tmp_path / "run")
    private_mkdir(paths.root)
    limits = Limits(timeout=None, idle_timeout=None, grace=1, output_cap=1 << 20, output_hard_cap=1 << 26)
    manifest = Manifest(
        v=1, run_id="r", created_at="t", agent=spec, task=task, cwd=str(tmp_path), umask=0o22, limits=limits
    )
    return manifest, paths


def external(tmp_path: Path, hooks: ChildHooks, finishes: bool) -> Child:
    script = "import sys; print(sys.stdin.read().strip()); sys.stdout.flush()" + (
        "" if finishes else "; import time; time.sleep(60)"
    )
    spec = AgentSpec(name="x", runner="external-cli", command=sys.executable, args=["-c", script])
    manifest, paths = _manifest(tmp_path, "FINISH", spec)
    return ExternalCliChild(0, hooks, manifest, paths, {})


def pi(tmp_path: Path, hooks: ChildHooks, finishes: bool) -> Child:
    fake = tmp_path / "fake-pi"
    fake.write_text(f"#!{sys.executable}\n{FAKE_PI}")
    fake.chmod(0o755)
    spec = AgentSpec(name="p", runner="pi", command=str(fake), pi_version="1.6.0")
    manifest, paths = _manifest(tmp_path, "FINISH" if finishes else "work on", spec)
    return PiChild(0, hooks, manifest, paths, {})


def scripted(tmp_path: Path, hooks: ChildHooks, finishes: bool) -> Child:
    steps = [Step(0.05, b"FINISH\n"), Step(0.1, exit=0)] if finishes else [Step(60, exit=0)]
    return ScriptedChild(0, hooks, steps)


KINDS: dict[str, Callable[[Path, ChildHooks, bool], Child]] = {
    "external-cli": external,
    "pi": pi,
    "scripted": scripted,
}


def _start(child: Child) -> selectors.BaseSelector:
    """Start the child and register it, as the runner does."""
    child.start()
    sel = selectors.DefaultSelector()
    child.register(sel)
    return sel


def _drive(
    child: Child, sel: selectors.BaseSelector, until: Callable[[], bool], timeout: float = 20.0
) -> None:
    """The runner's loop, until ``until()`` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "the child did not get there in time"
        for key, mask in sel.select(0.05):
            key.data(mask)


def _ended(child: Child) -> Callable[[], bool]:
    return lambda: child.poll() is not None and not child.streams_open


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> Callable[[Path, ChildHooks, bool], Child]:
    return KINDS[str(request.param)]


def test_it_runs_to_its_end_and_says_how(tmp_path: Path, kind: Any) -> None:
    hooks = Hooks()
    child: Child = kind(tmp_path, hooks, True)
    sel = _start(child)
    _drive(child, sel, _ended(child))
    outcome = child.outcome()
    child.close(sel)
    assert outcome.exit_code == 0 and outcome.error is None
    assert "done" in outcome.output or "FINISH" in outcome.output
    assert hooks.activity_count > 0


@pytest.mark.parametrize("how", ["terminate", "kill"])
def test_it_ends_when_told_to(tmp_path: Path, kind: Any, how: str) -> None:
    hooks = Hooks()
    child: Child = kind(tmp_path, hooks, False)
    sel = _start(child)
    getattr(child, how)()
    _drive(child, sel, _ended(child))
    child.close(sel)
    assert child.poll() is not None and child.outcome().exit_code != 0


def test_it_answers_a_steer_with_none_or_a_reason(tmp_path: Path, kind: Any) -> None:
    child: Child = kind(tmp_path, Hooks(), False)
    sel = _start(child)
    answer = child.steer("r1", "change course", "steer")
    assert answer is None or (isinstance(answer, str) and answer)
    child.kill()
    _drive(child, sel, _ended(child))
    child.close(sel)
