"""A workflow's coordinator killed at each point of a child's launch, then resumed (once, or twice
at the same time): every key's agent runs exactly once and the workflow ends ``complete`` with
every child's real output (issue 23, finding 2).

The points are reached deterministically through ``tests/faultinject/sitecustomize.py``: the
coordinator kills itself (``SIGKILL``) when launching key ``k2`` reaches the point — or, for
``launch.before-commit``, the child's runner stops itself before its startup commit and the test
kills the coordinator, then lets the runner go on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pisub
from tests.conftest import AgentMaker, wait_for

ROOT = Path(__file__).resolve().parents[2]

# Each start of the agent appends its task to $PISUB_TEST_COUNT: the side effect counted. The
# child of k1 ends only once k2's has started, so that k2 is launched alone (with a warm runner
# of its own: two launches at once share the launcher's one warm runner, and one goes cold).
WORKER = """
import os, sys, time
task = sys.stdin.read().strip()
count = os.environ["PISUB_TEST_COUNT"]
with open(count, "a") as fh:
    fh.write(task + "\\n")
deadline = time.monotonic() + 30
while task == "task 1" and "task 2" not in open(count).read().split("\\n"):
    if time.monotonic() > deadline:
        sys.exit("k2 never started")
    time.sleep(0.02)
print("did:", task)
"""

SCRIPT = """
async def main(runs, state, args):
    calls = [{"key": f"k{i}", "agent": "worker", "task": f"task {i}"} for i in range(4)]
    return [r.output for r in await runs.all(calls)]
"""

POINTS = (
    "launch.before-create",
    "launch.created",
    "launch.handoff-sent",
    "launch.got",
    "launch.go",
    "launch.before-commit",
)
KEYS = [f"k{i}" for i in range(4)]
REFUSALS = ("LEASE_HELD", "NOT_RESUMABLE", "resumed by run", "cannot take over the workflow's journal")
"""How the resume that lost the race is refused."""


@pytest.fixture
def launch(home: Path, make_agent: AgentMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The worker agent, its count file (returned) and the fault points' environment."""
    count = tmp_path / "starts.txt"
    count.touch()
    latch = tmp_path / "latch"
    latch.mkdir()
    monkeypatch.setenv("PISUB_TEST_COUNT", str(count))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "faultinject"), str(ROOT)]))
    monkeypatch.setenv("PISUB_FAULT_KEY", "k2")  # the first child of the second batch
    monkeypatch.setenv("PISUB_FAULT_LATCH", str(latch))
    make_agent("worker", python=WORKER)
    return count


def _kill_coordinator(run: pisub.Run, point: str, latch: Path) -> None:
    """Wait until ``point`` was reached; for the runner's stop, kill the coordinator and let the
    stopped runner go on once its launcher is dead."""
    fired = latch / point
    wait_for(lambda: fired.is_file() and fired.read_text(), 30, what=f"the launch to reach {point}")
    if point != "launch.before-commit":
        return
    runner = int(fired.read_text())
    coordinator = run.status().pid
    assert coordinator is not None
    os.kill(coordinator, signal.SIGKILL)
    wait_for(lambda: run.status().state == "failed", 20, what="the coordinator's repair")
    os.kill(runner, signal.SIGCONT)


def _resume(run_id: str, times: int) -> list[str]:
    """Resume ``run_id`` ``times`` times at once (separate CLI processes); the runs started."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pisub", "resume", run_id],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(times)
    ]
    started = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        if proc.returncode == 0:
            started.append(out.strip())
        else:  # the other one holds the journal (or has already taken it over)
            refusals = (
                "LEASE_HELD",
                "NOT_RESUMABLE",
                "resumed by run",
                "cannot take over the workflow's journal",
            )
            assert any(why in err for why in refusals), err
    return started


@pytest.mark.parametrize("resumes", [1, 2], ids=["one-resume", "two-resumes"])
@pytest.mark.parametrize("point", POINTS)
def test_a_coordinator_killed_while_launching_a_child_loses_no_key_and_runs_none_twice(
    home: Path, launch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, resumes: int
) -> None:
    script = tmp_path / "wf.py"
    script.write_text(textwrap.dedent(SCRIPT))
    monkeypatch.setenv("PISUB_FAULT_AT", point)
    run = pisub.launch_workflow(script, concurrency=2)
    _kill_coordinator(run, point, tmp_path / "latch")
    repaired = wait_for(lambda: (st := run.status()).state == "failed" and st, 20, what="the repair")
    assert repaired.state == "failed"

    started = _resume(run.id, resumes)
    results = [pisub.Run(rid).wait(timeout=60) for rid in started]
    finished = [r for r in results if r.state == "complete"]
    assert len(finished) == 1, [r.content[0].text for r in results]
    result = finished[0]
    # every child's real output, never the "" of a child that did not run
    assert json.loads(result.content[0].text) == [f"did: task {i}\n" for i in range(4)]
    assert [r.key for r in result.details.results] == KEYS
    assert all(r.state == "complete" for r in result.details.results)
    # the agent of each key ran exactly once
    assert sorted(launch.read_text().splitlines()) == [f"task {i}" for i in range(4)]
    # and no key has two runs that both ran
    tree = [s for s in pisub.list_runs(children=True) if s.key in KEYS]
    for key in KEYS:
        ran = [s for s in tree if s.key == key and s.state == "complete"]
        assert len(ran) == 1, (key, [(s.run_id, s.state) for s in tree if s.key == key])


def test_a_child_that_never_starts_is_relaunched_then_fails_the_workflow_and_a_resume_runs_it(
    home: Path, launch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k2's runner dies before its startup commit at every launch the first coordinator makes (it
    relaunches it three times): the workflow ends ``failed`` naming k2, never ``complete`` with
    a child that did not run; a resume starts k2 (once) and completes."""
    script = tmp_path / "wf.py"
    script.write_text(
        textwrap.dedent(
            """
            async def main(runs, state, args):
                calls = [{"key": f"k{i}", "agent": "worker", "task": f"job {i}"} for i in range(3)]
                return [r.output for r in await runs.all(calls)]
            """
        )
    )
    monkeypatch.setenv("PISUB_FAULT_AT", "launch.before-commit")
    monkeypatch.setenv("PISUB_FAULT_ACTION", "kill")
    monkeypatch.setenv("PISUB_FAULT_TIMES", "4")  # the first launch and its three relaunches
    run = pisub.launch_workflow(script, concurrency=3)
    first = run.wait(timeout=60)
    assert first.state == "failed", first.content[0].text
    assert first.details.error is not None and "k2" in first.details.error.message
    assert sorted(launch.read_text().splitlines()) == ["job 0", "job 1"]
    never = [s for s in pisub.list_runs(children=True) if s.key == "k2"]
    assert len(never) == 4 and all(s.repaired == "never-started" for s in never), never

    (again,) = _resume(run.id, 1)
    result = pisub.Run(again).wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    assert json.loads(result.content[0].text) == [f"did: job {i}\n" for i in range(3)]
    assert sorted(launch.read_text().splitlines()) == ["job 0", "job 1", "job 2"]
