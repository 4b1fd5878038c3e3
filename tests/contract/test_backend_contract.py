"""The backend contract: every backend (where a runner lives) keeps these promises.

``local`` always runs; ``slurm`` needs the one-node cluster of ``scripts/slurm-up.sh`` (CI starts
it) and is marked ``slurm`` (``-m slurm`` selects it, ``-m "not slurm"`` leaves it out; the other
contract suites of this folder need no cluster). Each test launches real runs through the real
backend: detached processes, or batch jobs.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import pisub
from pisub.backends import EngineState, Liveness, backend_for, liveness
from pisub.core.procs import host_name
from pisub.protocol.placement import BackendName
from pisub.protocol.status import RunState
from pisub.store.paths import RunPaths
from pisub.store.runs import load_placement, load_status
from tests.conftest import AgentMaker, wait_for
from tests.slurm import need_slurm

TICKER = "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"


@pytest.fixture(
    params=[
        pytest.param(BackendName.LOCAL, id="local"),
        pytest.param(BackendName.SLURM, id="slurm", marks=pytest.mark.slurm),
    ]
)
def backend(request: pytest.FixtureRequest, home: Path, make_agent: AgentMaker) -> Iterator[BackendName]:
    name: BackendName = request.param
    if name == BackendName.SLURM:
        need_slurm()
    make_agent("ticker", python=TICKER)
    make_agent("quick", python="print('done', flush=True)\n")
    (home / "config.toml").write_text("[placement]\nheartbeat_ttl = 4\n")
    yield name
    runs = home / "runs"
    jobs = [load_placement(RunPaths(p)).job_id for p in runs.iterdir()] if runs.is_dir() else []
    if any(jobs):
        subprocess.run(["scancel", *[j for j in jobs if j]], capture_output=True, check=False)


def _running(run: pisub.Run) -> None:
    wait_for(lambda: run.status().state == RunState.RUNNING, timeout=60, what="the run to be running")


def test_a_run_completes_with_its_placement_recorded(backend: BackendName) -> None:
    run = pisub.launch("quick", "go", backend=backend.value)
    result = run.wait(timeout=90)
    assert result.state == "complete"
    placement = run.placement()
    assert placement.backend == backend
    assert placement.launcher_host == host_name()
    assert (placement.job_id is not None) == (backend != BackendName.LOCAL)
    status = run.status()
    assert status.host == host_name()  # the node the runner ran on (one node here)
    assert status.state == RunState.COMPLETE


def test_a_live_runner_is_alive_and_a_stop_request_stops_it(backend: BackendName) -> None:
    run = pisub.launch("ticker", "go", backend=backend.value)
    _running(run)
    assert liveness(run.paths, load_status(run.paths)) == Liveness.ALIVE
    request_id, receipt = run.stop(wait=20)
    assert receipt is not None and receipt.state == "delivered", receipt
    assert run.wait(timeout=60).state == "stopped"
    assert run.receipt(request_id) is not None


def test_a_killed_runner_is_repaired_only_once_proven_dead(backend: BackendName) -> None:
    run = pisub.launch("ticker", "go", backend=backend.value)
    _running(run)
    pid = load_status(run.paths).pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    # Repaired by a reader once the backend proves the runner dead (slurm: the job ended and
    # the heartbeat lease of 4 s expired by the file server's clock).
    wait_for(lambda: run.status().state.is_terminal, timeout=60, what="the repair")
    status = run.status()
    assert status.state == RunState.FAILED
    assert "exited or disappeared" in (status.error.message if status.error else "")
    assert liveness(run.paths, status) in (Liveness.DEAD, Liveness.ALIVE, Liveness.UNKNOWN)


def test_observe_answers_for_every_placement_in_one_call(backend: BackendName) -> None:
    runs = [pisub.launch("ticker", f"go {i}", backend=backend.value) for i in range(3)]
    placements = [load_placement(r.paths) for r in runs]
    states = backend_for(backend).observe(placements)
    assert set(states) == {p.job_id for p in placements if p.job_id is not None}
    assert all(s in (EngineState.QUEUED, EngineState.RUNNING) for s in states.values())
    for run in runs:
        run.send_stop()  # its end is awaited below
    for run in runs:
        assert run.wait(timeout=60).state == "stopped"


def test_cancel_is_a_backstop_that_ends_the_run_stopped(backend: BackendName) -> None:
    run = pisub.launch("ticker", "go", backend=backend.value)
    _running(run)
    accepted = backend_for(backend).cancel(run.placement())
    if backend == BackendName.LOCAL:
        assert accepted is False  # a local runner is stopped through its inbox only
        run.send_stop()  # its end is awaited below
    else:
        assert accepted is True
    assert run.wait(timeout=60).state == "stopped"
