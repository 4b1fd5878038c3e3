"""A runner's start-up writes (spec/guarantees.md 1): the startup commit (``running``, the
runner's pid) is durable before the child starts; the commit that names the child's pid and the
one that records how the inbox is watched are atomic but not fsynced (they name only processes
of this boot); the launcher is answered after the child's pid is committed."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pisub.children.base import Child, ChildHooks
from pisub.protocol import AgentSpec, Limits, Manifest, Status, now_iso
from pisub.runner import recorder
from pisub.runner.supervise import Supervisor
from pisub.store.paths import Home, RunPaths
from pisub.store.runs import RunStore
from pisub.testing.scripted_child import NoProcesses, ScriptedChild, Step

RUN_ID = "6" * 8 + "-0000-4000-8000-" + "6" * 12


@pytest.fixture(autouse=True)
def own_signals() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    signal.set_wakeup_fd(-1)
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_the_startup_commit_is_durable_and_the_childs_pid_is_not_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = Home(tmp_path / "home")
    home.runs.mkdir(parents=True)
    manifest = Manifest(
        v=1,
        run_id=RUN_ID,
        created_at=now_iso(),
        agent=AgentSpec(name="scripted", runner="external-cli", command="/bin/true"),
        task="x",
        cwd=str(tmp_path),
        umask=0o22,
        limits=Limits(
            timeout=30.0, idle_timeout=None, grace=0.2, output_cap=1 << 20, output_hard_cap=1 << 26
        ),
    )
    paths, lock = RunStore(home).create(manifest)
    seen: list[tuple[str, Any, bool, bool]] = []
    started: list[bool] = []
    real = recorder.write_status  # type: ignore[attr-defined]

    def write_status(p: RunPaths, status: Status, *, durable: bool = True) -> None:
        step = status.steps[0].status.value if status.steps else None
        seen.append((status.state.value, step, durable, bool(started)))
        real(p, status, durable=durable)

    monkeypatch.setattr(recorder, "write_status", write_status)

    def make(_manifest: Manifest, _paths: RunPaths, hooks: ChildHooks) -> Child:
        child = ScriptedChild(0, hooks, [Step(0.05, exit=0)])
        start = child.start

        def starting() -> None:
            started.append(True)
            start()

        child.start = starting  # type: ignore[method-assign]
        return child

    answers: list[tuple[dict[str, object], int]] = []

    def report(message: dict[str, object]) -> None:
        answers.append((message, len(seen)))

    try:
        assert Supervisor(paths, manifest, report, make=make, tree=NoProcesses()).run() == 0
    finally:
        os.close(lock)
    first, second, inbox = seen[:3]
    assert first == ("running", "pending", True, False)  # durable, before the child started
    assert second == ("running", "running", False, True)  # the child started: not fsynced
    assert inbox[0] == "running" and inbox[2] is False
    assert answers == [({"ok": True, "pid": os.getpid()}, 2)]  # after the child's pid, before the inbox
    assert seen[-1][0] == "complete" and seen[-1][2] is True  # the end stays durable
