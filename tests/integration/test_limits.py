"""Runtime and idle timeouts, output caps: 124 with the right reason, nothing left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pisub
from tests.conftest import AgentMaker, pid_alive, wait_for

# The child starts a grandchild in its own group and one in a new session, records
# their pids, then goes silent or keeps printing.
SPAWNER = """
import os, subprocess, sys, time
a = subprocess.Popen(["sleep", "300"])
b = subprocess.Popen(["sleep", "301"], start_new_session=True)
with open(os.environ["PISUB_RUN_DIR"] + "/pids.json", "w") as fh:
    fh.write('[%d, %d, %d]' % (os.getpid(), a.pid, b.pid))
print("started", flush=True)
while True:
    if MODE == "chatty":
        print("still here", flush=True)
    time.sleep(0.2)
"""


def spawner(mode: str) -> str:
    return f"MODE = {mode!r}\n" + SPAWNER


def _pids(run: pisub.Run) -> list[int]:
    path = run.dir / "pids.json"
    wait_for(path.exists, what="pids.json")
    pids: list[int] = wait_for(lambda: json.loads(path.read_text() or "null"), what="pids")
    return pids


def test_runtime_timeout_ends_every_process(home: Path, make_agent: AgentMaker) -> None:
    make_agent("chatty", python=spawner("chatty"))
    run = pisub.launch("chatty", "x", timeout=1.5, idle_timeout=10)
    pids = _pids(run)
    result = run.wait(timeout=30)
    single = result.details.results[0]
    assert result.state == "failed"
    assert single.exit_code == 124 and single.timeout_reason == "runtime"
    assert result.details.error is not None and result.details.error.code == "SUBAGENT_TIMEOUT"
    assert "maximum runtime" in result.details.error.message
    assert "still here" in (single.output or "")
    for pid in pids:
        assert not pid_alive(pid), f"process {pid} survived the timeout"


def test_silence_past_the_idle_limit_ends_the_child_and_its_tree(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quiet", python=spawner("quiet"), idleTimeout=2.5)
    run = pisub.launch("quiet", "x")
    pids = _pids(run)
    result = run.wait(timeout=30)
    single = result.details.results[0]
    assert single.exit_code == 124 and single.timeout_reason == "idle"
    assert result.details.error is not None and "without activity" in result.details.error.message
    for pid in pids:
        assert not pid_alive(pid), f"process {pid} survived the idle timeout"


def test_flood_past_hard_cap_is_stopped(home: Path, make_agent: AgentMaker) -> None:
    make_agent(
        "flood",
        python="import sys\nwhile True: sys.stdout.write('x' * 8192 + '\\n')",
        outputCap=100_000,
        outputHardCap=1_000_000,
    )
    run = pisub.launch("flood", "x")
    result = run.wait(timeout=30)
    assert result.state == "failed"
    assert result.details.error is not None
    assert result.details.error.code == "SUBAGENT_OUTPUT_TRUNCATED"
    assert (run.dir / "output-0.log").stat().st_size == 100_000
    step = run.status().steps[0]
    assert step.output_truncated and step.output_bytes > 1_000_000
    events = (run.dir / "events.jsonl").read_text()
    assert "child.output_truncated" in events


def test_leftover_background_process_is_ended_on_normal_exit(home: Path, make_agent: AgentMaker) -> None:
    make_agent(
        "leaver",
        python="""
        import os, subprocess
        p = subprocess.Popen(["sleep", "300"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open(os.environ["PISUB_RUN_DIR"] + "/pids.json", "w").write("[%d]" % p.pid)
        print("bye")
    """,
    )
    run = pisub.launch("leaver", "x")
    result = run.wait(timeout=30)
    assert result.state == "complete"
    (pid,) = json.loads((run.dir / "pids.json").read_text())
    assert not pid_alive(pid)
