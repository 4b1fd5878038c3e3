"""Many processes at once: steering one run, launching runs, reading while runners write."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pisub
from tests.conftest import AgentMaker, pisub_cli, wait_for

STEERER = textwrap.dedent("""
    import sys
    from pisub.api.client import Run
    run = Run(sys.argv[1])
    print("\\n".join(run.send_steer(f"{sys.argv[2]}:{i}") for i in range(4)))
""")


def test_fifty_processes_steering_one_run(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleepy", command="sleep", args=["600"])
    run = pisub.launch("sleepy", "x")
    procs = [
        subprocess.Popen([sys.executable, "-c", STEERER, run.id, f"p{n}"], stdout=subprocess.PIPE, text=True)
        for n in range(50)
    ]
    ids = [rid for p in procs for rid in p.communicate(timeout=120)[0].split()]
    assert all(p.returncode == 0 for p in procs)
    assert len(ids) == len(set(ids)) == 200
    wait_for(lambda: len(list((run.dir / "outbox").glob("*.json"))) == 200, timeout=60)
    assert {p.stem for p in (run.dir / "outbox").glob("*.json")} == set(ids)
    assert pisub_cli("stop", run.id).returncode == 0
    run.wait(timeout=30)


def test_twenty_runs_launched_at_once(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pisub", "run", "--agent", "quick", f"task {n}", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(20)
    ]
    launched = []
    for proc in procs:
        out, errs = proc.communicate(timeout=120)
        assert proc.returncode == 0, errs
        launched.append(json.loads(out)["runId"])
    assert len(set(launched)) == 20
    for run_id in launched:
        assert pisub.Run(run_id).wait(timeout=60).state == "complete"
    listed = pisub_cli("list", "--json", check=True).stdout.splitlines()
    assert sorted(json.loads(line)["runId"] for line in listed) == sorted(launched)


def test_list_and_status_read_while_runners_write(home: Path, make_agent: AgentMaker, tmp_path: Path) -> None:
    # The runners write until the reads are done (a fixed 3 s of ticks was over before a
    # loaded machine's second read).
    release = tmp_path / "release"
    make_agent(
        "ticker",
        python=f"""
        import os, time
        i = 0
        while not os.path.exists({str(release)!r}):
            print("tick", i, flush=True)
            i += 1
            time.sleep(0.01)
    """,
    )
    runs = [pisub.launch("ticker", "x") for _ in range(5)]
    deadline = time.monotonic() + 120
    for reads in range(10):
        assert time.monotonic() < deadline, f"only {reads} reads after 120 s"
        listed = pisub_cli("list", "--json", check=True).stdout.splitlines()
        assert len(listed) == 5 and all(json.loads(line)["runId"] for line in listed)
        status = json.loads(pisub_cli("status", runs[reads % 5].id, "--json", check=True).stdout)
        assert status["runId"] == runs[reads % 5].id
    assert not any(r.status().state.is_terminal for r in runs), "the reads were made while they ran"
    release.touch()
    assert all(r.wait(timeout=30).state == "complete" for r in runs)
