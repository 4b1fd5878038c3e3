"""Tool timeouts and the deadline checkpoint with the real pi against the scripted model."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import pisub
from pisub.core.procs import marked_processes
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pid_alive, pisub_cli, wait_for
from tests.helpers import cmdline

pytestmark = pytest.mark.pi


@pytest.mark.pi_versions
def test_a_hung_tool_ends_the_run_at_its_tool_timeout(pi_home: Path) -> None:
    run = pisub.launch("pi", "please run TOOL: sleep 45", timeout=120, tool_timeout=2)
    (sleep_pid,) = wait_for(
        lambda: [p for p in marked_processes(run.id) if cmdline(p).startswith("sleep 45")], timeout=30
    )
    result = run.wait(timeout=60)
    single = result.details.results[0]
    assert result.state == "failed" and single.timeout_reason == "tool", result.content[0].text
    assert result.details.error is not None and result.details.error.code == "SUBAGENT_TIMEOUT"
    assert "Tool 'bash' exceeded its timeout of 2s" in result.details.error.message
    assert not pid_alive(sleep_pid) and not marked_processes(run.id)


def test_an_exempt_tool_and_the_config_file(pi_home: Path) -> None:
    (pi_home / "config.toml").write_text('[limits]\ntool_timeout_ms = 1500\ntool_timeout_exempt = ["bash"]\n')
    shown = {r["name"]: r for r in json.loads(pisub_cli("config", "show", "--json", check=True).stdout)}
    assert shown["limits.tool_timeout_ms"]["value"] == 1500
    run = pisub.launch("pi", "please run TOOL: sleep 3", timeout=60)
    assert run.manifest().limits.tool_timeout == 1.5
    assert run.wait(timeout=60).state == "complete"  # bash is exempt: 3 s is fine


@pytest.mark.pi_versions
@pytest.mark.serial  # a real pi's two turns and a 3 s tool within a 9 s runtime: no room for load
def test_a_checkpoint_steer_is_delivered_before_the_deadline(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    run = pisub.launch("pi", f"work {tag} TOOL: sleep 3", timeout=9, checkpoint_before_deadline=7.5)
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    events = [json.loads(line) for line in (run.dir / "events.jsonl").read_text().splitlines()]
    sent = [e for e in events if e.get("type") == "deadline.checkpoint"]
    assert len(sent) == 1
    receipt = run.receipt(sent[0]["data"]["requestId"] if "data" in sent[0] else sent[0]["requestId"])
    assert receipt is not None and receipt.state == "delivered"
    assert any("Checkpoint now" in json.dumps(r) for r in list(model_server.requests))


def test_no_checkpoint_when_less_than_a_second_would_remain(pi_home: Path) -> None:
    run = pisub.launch("pi", "please run TOOL: sleep 10", timeout=4, checkpoint_before_deadline=0.5)
    result = run.wait(timeout=60)
    assert result.state == "failed" and result.details.results[0].timeout_reason == "runtime"
    assert '"deadline.checkpoint"' not in (run.dir / "events.jsonl").read_text()


@pytest.mark.pi_versions
def test_past_the_hard_tool_budget_read_is_blocked_inside_pi_and_bash_still_works(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    calls = json.dumps([["bash", {"command": f"echo first-{tag}"}], ["read", {"path": "/etc/hostname"}]])
    run = pisub.launch("pi", f"CALLS:{calls}", timeout=60, tool_budget={"hard": 1})
    result = run.wait(timeout=60)
    assert result.state == "complete", result.content[0].text
    after = [
        r
        for r in list(model_server.requests)
        if f"first-{tag}" in json.dumps(r) and r["messages"][-1]["role"] == "tool"
    ]
    assert after, "the model never saw the tool results"
    sent = json.dumps(after[-1])
    assert "blocked by the tool budget" in sent and f"first-{tag}\\n" in sent
    assert '"budget.hard_blocked"' in (run.dir / "events.jsonl").read_text()


def test_the_soft_tool_budget_nudges_with_a_steer_and_the_tightest_budget_wins(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    run = pisub.launch("pi", f"go {tag} TOOL: sleep 2", timeout=60, tool_budget={"hard": 5, "soft": 1})
    assert run.wait(timeout=60).state == "complete"
    events = [json.loads(line) for line in (run.dir / "events.jsonl").read_text().splitlines()]
    assert any(e.get("type") == "budget.soft_reached" for e in events)
    assert any("tool budget allows" in json.dumps(r) for r in list(model_server.requests))
    (pi_home / "config.toml").write_text("[limits.tool_budget]\nhard = 2\n")
    assert pisub.launch("pi", "hi", tool_budget={"hard": 9}).manifest().limits.tool_budget.hard == 2  # type: ignore[union-attr]
    tight = pisub.launch("pi", "hi", tool_budget={"hard": 1, "block": ["*"]}).manifest().limits.tool_budget
    assert tight is not None and tight.hard == 1 and tight.block == ["*"]
    bad = pisub_cli("run", "--agent", "pi", "hi", "--tool-budget", '{"hard": 2, "soft": 3}')
    assert bad.returncode == 1 and "soft must not be above" in bad.stderr
