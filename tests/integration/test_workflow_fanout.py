"""A wide fan-out of external-CLI children (issue 29): every child starts (no waves of a fixed
thread count), and one stop of the workflow reaches every child — each answers the workflow's
stop request with exactly one receipt — and leaves no process behind; the journal holds one
start and one end per key."""

from __future__ import annotations

import json
from pathlib import Path

import pisub
from tests.conftest import AgentMaker, pisub_cli, processes_of, wait_for, wait_no_processes
from tests.helpers import run_receipts

CHILDREN = 32


def _steps(run: pisub.Run) -> list[str]:
    return [str(s.status) for s in run.status().steps]


def test_a_wide_fan_out_runs_every_child_and_one_stop_ends_them_all(
    home: Path, make_agent: AgentMaker
) -> None:
    make_agent("sleeper", command="sleep", args=["3600"])
    tasks = [arg for _ in range(CHILDREN) for arg in ("--task", "sleeper=x")]
    launched = pisub_cli("run", "--concurrency", str(CHILDREN), *tasks, "--json", check=True)
    run = pisub.Run(json.loads(launched.stdout)["runId"])
    wait_for(
        lambda: _steps(run).count("running") == CHILDREN,
        timeout=120,
        interval=0.05,
        what=f"all {CHILDREN} children running",
    )
    children = [s.run_id for s in run.status().steps]
    assert len(set(children)) == CHILDREN and all(children)
    assert len(processes_of(home)) >= 2 * CHILDREN + 1  # the coordinator, each child's runner and sleep

    stopped = pisub_cli("stop", run.id, check=True)
    assert stopped.returncode == 0, stopped.stderr
    run.wait_until_terminal(60)
    wait_no_processes(home, timeout=30)

    assert run.status().state.value == "stopped"
    assert [str(s.status) for s in run.status().steps] == ["stopped"] * CHILDREN
    for child_id in children:  # the workflow's stop reached each: one request, one receipt
        assert child_id is not None
        child = pisub.Run(child_id)
        assert child.status().state.value == "stopped"
        receipts = [r for r in run_receipts(child).values() if r.get("type") == "stop"]
        assert len(receipts) == 1, (child_id, receipts)  # the workflow's stop, answered once
        assert receipts[0]["state"] == "delivered", receipts[0]
        requests = sorted(p.name for p in (child.dir / "inbox" / "new").iterdir())
        assert requests == [], requests  # nothing left unclaimed
        events = [json.loads(line) for line in (child.dir / "events.jsonl").read_text().splitlines()]
        received = [e for e in events if e["type"] == "control.received"]
        assert len(received) == 1 and received[0]["data"]["request"] == "stop"
        assert received[0]["data"]["id"] == receipts[0]["requestId"]

    journal = run.dir / "journal.jsonl"
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    for kind in ("started", "created", "ended"):
        keys = [e["key"] for e in entries if e.get("t") == kind]
        assert sorted(keys) == sorted(set(keys)) and len(keys) == CHILDREN, (kind, len(keys))
    first_end = min(i for i, e in enumerate(entries) if e.get("t") == "ended")
    last_start = max(i for i, e in enumerate(entries) if e.get("t") == "started")
    assert last_start < first_end
    # ended by the workflow's own stop: not the keys' results (a resume would start them again)
    assert all(not e["settled"] for e in entries if e.get("t") == "ended")
