"""Resume across processes with the real pi: the lease, briefs, refusals, pause-and-revive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.client import resume
from pisub.core.procs import marked_processes
from pisub.errors import InvalidInput, NotResumable
from pisub.protocol import RunState
from pisub.store.leases import list_leases
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pisub_cli, wait_for
from tests.helpers import sent_with

pytestmark = pytest.mark.pi


def _done(pi_home: Path, task: str) -> pisub.Run:
    run = pisub.launch("pi", task)
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    return run


@pytest.mark.pi_versions
def test_resume_continues_the_conversation(pi_home: Path, model_server: FakeModelServer) -> None:
    tag = uuid.uuid4().hex[:8]
    source = _done(pi_home, f"first message {tag}")
    proc = pisub_cli("resume", source.id[:8], f"ECHO_HISTORY {tag}", "--json")
    assert proc.returncode == 0, proc.stderr
    launched = json.loads(proc.stdout)
    assert launched["resumedFrom"] == source.id and launched["runId"] != source.id
    new = pisub.Run(launched["runId"])
    result = new.wait(timeout=60)
    assert result.state == "complete"
    assert result.details.results[0].output == f"History: first message {tag} | ECHO_HISTORY {tag}"
    # The model was sent the earlier conversation: the first turn and pi's reply to it.
    sent = sent_with(model_server, f"ECHO_HISTORY {tag}")[0]
    assert [m["role"] for m in sent["messages"][1:]] == ["user", "assistant", "user"]
    assert new.status().session_file == source.status().session_file
    assert new.manifest().resumed_from == source.id
    assert [i for i in list_leases(pi_home / "leases") if i.owner is not None] == [], "the lease is released"


def test_running_stopped_external_and_sessionless_runs_are_not_resumable(
    pi_home: Path, make_agent: Any
) -> None:
    running = pisub.launch("pi", "SLOW:300 a long story")
    proc = pisub_cli("resume", running.id, "more")
    assert proc.returncode == 1 and f"run {running.id} is running; use steer" in proc.stderr
    assert pisub_cli("stop", running.id).returncode == 0
    running.wait(timeout=30)
    proc = pisub_cli("resume", running.id, "more")
    assert (
        proc.returncode == 1
        and "is stopped; start a new run" in proc.stderr
        and "NOT_RESUMABLE" in proc.stderr
    )
    make_agent("ext", python="print('x')")
    ext = pisub.launch("ext", "x")
    ext.wait(timeout=30)
    proc = pisub_cli("resume", ext.id, "more")
    assert proc.returncode == 1 and "is an external-cli run; only pi runs can be resumed" in proc.stderr
    early = pisub.launch("pi", "SLOW:100 hello", timeout=0.3)  # 10 s of reply: ended long before it
    assert early.wait(timeout=30).state == "failed"
    # A fast pi may have created its session file by then: without it, nothing can resume.
    session = early.status().session_file
    if session is not None:
        Path(session).unlink(missing_ok=True)
    proc = pisub_cli("resume", early.id, "more")
    assert proc.returncode == 1 and "has no session file" in proc.stderr
    with pytest.raises(NotResumable):
        resume(early.id, "more")


def test_briefs_reach_the_next_resume(pi_home: Path, model_server: FakeModelServer) -> None:
    tag = uuid.uuid4().hex[:8]
    source = _done(pi_home, f"start {tag}")
    ids = []
    for text in (f"brief one {tag}", f"brief two {tag}"):
        proc = pisub_cli("follow-up", source.id, text, "--json")
        assert proc.returncode == 0, proc.stderr
        receipt = json.loads(proc.stdout)
        assert receipt["state"] == "scheduled" and receipt["type"] == "follow_up"
        ids.append(receipt["requestId"])
    new = resume(source.id, f"go on {tag}")
    assert new.wait(timeout=60).state == "complete"
    user_turn = sent_with(model_server, f"go on {tag}")[0]["messages"][-1]
    text = json.dumps(user_turn)
    assert text.index(f"brief one {tag}") < text.index(f"brief two {tag}") < text.index(f"go on {tag}")
    for rid in ids:
        receipt = source.receipt(rid)
        assert receipt is not None and receipt.state == "delivered" and receipt.replacement_run_id == new.id
    assert not list((source.dir / "briefs").glob("*.json"))
    # A brief for a run whose session is being driven right now is refused.
    live = resume(new.id, "SLOW:200 keep going")
    proc = pisub_cli("follow-up", new.id, "not now")
    assert proc.returncode == 1 and "LEASE_HELD" in proc.stderr and live.id in proc.stderr
    pisub_cli("stop", live.id)
    live.wait(timeout=30)


def test_at_most_twenty_briefs(pi_home: Path) -> None:
    source = _done(pi_home, "start")
    for n in range(20):
        source.follow_up(f"brief {n}")
    with pytest.raises(InvalidInput, match="already holds 20 briefs"):
        source.follow_up("one too many")


ROUNDS = {2: 3, 20: 2}


@pytest.mark.parametrize("processes", [2, 20])
def test_simultaneous_resumes_exactly_one_wins(
    pi_home: Path, processes: int, request: pytest.FixtureRequest
) -> None:
    rounds = 50 if request.config.getoption("--stress") else ROUNDS[processes]
    source = _done(pi_home, "start")
    for r in range(rounds):
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "pisub", "resume", source.id, f"SLOW:60 round {r}", "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        outcomes = [(p.wait(timeout=120), *p.communicate()) for p in procs]
        winners = [json.loads(out)["runId"] for code, out, _ in outcomes if code == 0]
        assert len(winners) == 1, f"round {r}: {len(winners)} winners: {outcomes}"
        for code, _, errs in outcomes:
            if code != 0:
                assert f"driven by run {winners[0]}" in errs, errs
        winner = pisub.Run(winners[0])
        assert pisub_cli("stop", winner.id).returncode == 0
        winner.wait(timeout=30)


@pytest.mark.pi_versions
def test_pause_and_revive_a_frozen_pi(pi_home: Path, model_server: FakeModelServer) -> None:
    tag = uuid.uuid4().hex[:8]
    run = pisub.launch("pi", f"{tag} now TOOL: sleep 30")

    def sleeping() -> list[int]:
        return [
            p
            for p in marked_processes(run.id)
            if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep")
        ]

    wait_for(sleeping, timeout=30, what="the tool to run")
    wait_for(lambda: Path(str(run.status().session_file)).exists(), what="the session file")
    pi_pid = run.status().steps[0].pid
    assert pi_pid is not None
    os.kill(pi_pid, signal.SIGSTOP)  # pi cannot answer anything now
    proc = pisub_cli("steer", run.id, f"REVIVE {tag}", "--wait", "2", "--json", timeout=90)
    assert proc.returncode == 0, proc.stderr
    receipt = json.loads(proc.stdout)
    assert receipt["state"] == "recovered" and receipt["deliveryStatus"] == "delivered"
    assert run.status().state == RunState.PAUSED
    replacement = pisub.Run(receipt["replacementRunId"])
    assert replacement.manifest().resumed_from == run.id
    result = replacement.wait(timeout=60)
    assert result.details.results[0].output == f"Hello from the fake LLM. You said: REVIVE {tag}"
    assert not sleeping()
    # The claim stays: a late retry cannot start a second replacement.
    assert (run.dir / "recovery" / "claim.json").exists()


def test_a_resume_started_the_instant_a_result_appears_finds_the_lease_free(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    """Readers take ``result.json`` as the run's end: the runner has given the session's lease
    up by then. The source's runner is frozen the moment its result appears, and the resume
    must still start (a CI flake: a lane's ``resume: "previous"`` stage was refused LEASE_HELD)."""
    tag = uuid.uuid4().hex[:8]
    source = pisub.launch("pi", f"first message {tag}")
    runner_pid = wait_for(lambda: source.status().pid, timeout=30)
    assert wait_for(lambda: source.paths.result.exists(), timeout=60, interval=0.0005)
    os.kill(runner_pid, signal.SIGSTOP)
    try:
        new = resume(source.id, f"ECHO_HISTORY {tag}")
        result = new.wait(timeout=60)
    finally:
        os.kill(runner_pid, signal.SIGCONT)
    assert result.state == "complete", result.content[0].text
    assert source.wait(timeout=30).state == "complete"
