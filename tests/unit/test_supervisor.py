"""The supervisor's rules with a scripted child: no process is started, each run takes a second.

The real supervisor loop runs in this process — limits, deadlines, the inbox, the result and
the terminal status are all real; only the child is a script (pisub/testing/scripted_child.py).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pisub.children.base import Child, ChildHooks
from pisub.protocol import AgentSpec, Limits, Manifest, RunState, now_iso
from pisub.runner.supervise import Supervisor
from pisub.store.paths import Home, RunPaths
from pisub.store.runs import RunStore, load_result, load_status
from pisub.testing.scripted_child import NoProcesses, ScriptedChild, Step

RUN_ID = "5" * 8 + "-0000-4000-8000-" + "5" * 12
FOREVER = [Step(at=60, exit=0)]


@pytest.fixture(autouse=True)
def own_signals() -> Iterator[None]:
    """The supervisor installs its signal handlers in this process: put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    signal.set_wakeup_fd(-1)
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _run(
    tmp_path: Path,
    steps: list[Step],
    *,
    requests: dict[str, dict[str, Any]] | None = None,
    **limits: Any,
) -> tuple[RunPaths, ScriptedChild, dict[str, object]]:
    home = Home(tmp_path / "home")
    home.runs.mkdir(parents=True)
    settings: dict[str, Any] = {"timeout": 30.0, "idle_timeout": None, "grace": 0.2, "output_cap": 1 << 20}
    settings |= {"output_hard_cap": 1 << 26} | limits
    kinds = ("on_term", "abortable", "steerable")
    scripted: dict[str, Any] = {k: settings.pop(k) for k in kinds if k in settings}
    manifest = Manifest(
        v=1,
        run_id=RUN_ID,
        created_at=now_iso(),
        agent=AgentSpec(name="scripted", runner="external-cli", command="/bin/true"),
        task="x",
        cwd=str(tmp_path),
        umask=0o22,
        limits=Limits(**settings),
    )
    paths, lock = RunStore(home).create(manifest)
    for name, body in (requests or {}).items():
        (paths.box("new") / f"{name}.json").write_text(json.dumps(body))
    children: list[ScriptedChild] = []
    reports: dict[str, object] = {}

    def make(_manifest: Manifest, _paths: RunPaths, hooks: ChildHooks) -> Child:
        children.append(ScriptedChild(0, hooks, steps, **scripted))
        return children[0]

    try:
        assert Supervisor(paths, manifest, reports.update, make=make, tree=NoProcesses()).run() == 0
    finally:
        os.close(lock)
    return paths, children[0], reports


def _verdict(paths: RunPaths) -> tuple[RunState, int, str | None]:
    result = load_result(paths)
    assert result is not None
    error = result.details.error.code if result.details.error else None
    return RunState(result.state), result.details.results[0].exit_code, error


def test_a_clean_exit_completes_with_the_output(tmp_path: Path) -> None:
    paths, _, reports = _run(tmp_path, [Step(0.05, b"hello\n"), Step(0.1, exit=0)])
    assert _verdict(paths) == (RunState.COMPLETE, 0, None)
    result = load_result(paths)
    assert result is not None and result.details.results[0].output == "hello\n"
    status = load_status(paths)
    assert status.state == RunState.COMPLETE and status.steps[0].recent_output == ["hello"]
    assert reports["ok"] is True


def test_the_runtime_limit_ends_the_child(tmp_path: Path) -> None:
    paths, child, _ = _run(tmp_path, FOREVER, timeout=0.3)
    assert _verdict(paths) == (RunState.FAILED, 124, "SUBAGENT_TIMEOUT")
    assert child.calls == ["terminate"]


def test_a_child_that_ignores_term_is_killed_after_the_grace(tmp_path: Path) -> None:
    paths, child, _ = _run(tmp_path, FOREVER, timeout=0.3, on_term=None)
    assert _verdict(paths) == (RunState.FAILED, 124, "SUBAGENT_TIMEOUT")
    assert child.calls == ["terminate", "kill"]
    types = [json.loads(line)["type"] for line in paths.events.read_text().splitlines()]
    assert "child.killed" in types


def test_stop_and_timeout_together_make_the_run_stopped(tmp_path: Path) -> None:
    """The stop is taken at the first scan; the runtime limit passes while the child is ending."""
    stop = {"v": 1, "type": "stop"}
    paths, _, _ = _run(tmp_path, FOREVER, requests={"stop": stop}, timeout=0.1, on_term=None, grace=0.4)
    assert _verdict(paths) == (RunState.STOPPED, 137, "SUBAGENT_FAILED")


def test_silence_hits_the_idle_limit(tmp_path: Path) -> None:
    paths, _, _ = _run(tmp_path, [Step(0.05, b"one line\n"), *FOREVER], idle_timeout=0.3)
    result = load_result(paths)
    assert result is not None and result.details.results[0].timeout_reason == "idle"
    assert _verdict(paths)[:2] == (RunState.FAILED, 124)


def test_a_flood_past_the_hard_cap_is_stopped(tmp_path: Path) -> None:
    paths, _, _ = _run(tmp_path, [Step(0.05, b"x" * 4096), *FOREVER], output_hard_cap=1024)
    assert _verdict(paths) == (RunState.FAILED, 1, "SUBAGENT_OUTPUT_TRUNCATED")


def test_an_interrupt_pauses_with_the_childs_own_status(tmp_path: Path) -> None:
    interrupt = {"v": 1, "type": "interrupt"}
    paths, child, _ = _run(tmp_path, FOREVER, requests={"i": interrupt})
    assert _verdict(paths) == (RunState.PAUSED, 143, None)
    assert child.calls == ["abort", "terminate"]
    graceful, child, _ = _run(tmp_path / "again", FOREVER, requests={"i": interrupt}, abortable=True)
    assert _verdict(graceful) == (RunState.PAUSED, 0, None) and child.calls == ["abort"]


def test_a_steer_to_a_child_that_cannot_take_it_is_answered_failed(tmp_path: Path) -> None:
    steer = {"v": 1, "type": "steer", "message": "hi"}
    paths, _, _ = _run(tmp_path, [Step(0.3, exit=0)], requests={"s": steer})
    receipt = json.loads(paths.receipt("s").read_bytes())
    assert receipt["state"] == "failed" and "not supported" in receipt["reason"]
    assert _verdict(paths)[0] == RunState.COMPLETE


def test_the_status_beside_the_result_carries_the_last_steer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers take result.json as the end and show status.json beside it until the terminal one
    lands: when the result is written, the status already counts a steer delivered just before
    the end (a coalesced write could otherwise still be pending)."""
    import pisub.runner.shell as shell

    seen: list[dict[str, Any]] = []
    real = shell.write_result  # type: ignore[attr-defined]

    def spy(paths: RunPaths, result: Any) -> None:
        seen.append(json.loads(paths.status.read_bytes()))
        real(paths, result)

    monkeypatch.setattr(shell, "write_result", spy)
    steer = {"v": 1, "type": "steer", "message": "hi"}
    paths, _, _ = _run(tmp_path, [Step(0.05, exit=0)], requests={"s": steer}, steerable=True)
    assert json.loads(paths.receipt("s").read_bytes())["state"] == "delivered"
    assert seen and seen[0]["steering"]["delivered"] == 1
