"""Tool timeouts and the deadline checkpoint with the real pi against the scripted model."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import pisub
from pisub.procs import marked_processes
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pid_alive, pisub_cli, wait_for

pytestmark = pytest.mark.pi


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_hung_tool_ends_the_run_at_its_tool_timeout(pi_home: Path) -> None:
    run = pisub.launch("pi", "please run TOOL: sleep 45", timeout=120, tool_timeout=2)
    (sleep_pid,) = wait_for(
        lambda: [p for p in marked_processes(run.id) if _cmdline(p).startswith("sleep 45")], timeout=30
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
