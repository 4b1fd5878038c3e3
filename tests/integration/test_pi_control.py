"""Steering, interrupting and stopping the real pi through the inbox."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.core.procs import marked_processes
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pid_alive, pisub_cli, wait_for
from tests.helpers import sent_with

pytestmark = pytest.mark.pi


def _user_texts(request: dict[str, Any]) -> list[str]:
    texts = []
    for message in request["messages"]:
        if message["role"] == "user":
            content = message["content"]
            texts.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
    return texts


@pytest.mark.pi_versions
def test_steer_mid_stream_queued_then_delivered_at_turn_boundary(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    run = pisub.launch("pi", f"SLOW:60 story {tag}")
    wait_for(lambda: sent_with(model_server, tag), timeout=30, what="pi to call the model")
    steer_text = f"STEER {tag}: now say hi"
    proc = pisub_cli("steer", run.id, steer_text, "--json", "--wait", "10")
    assert proc.returncode == 0, proc.stderr
    receipt = json.loads(proc.stdout)
    assert receipt["state"] == "queued" and receipt["deliveryStatus"] == "queued"
    result = run.wait(timeout=60)
    assert result.state == "complete"
    assert result.details.results[0].output == f"Hello from the fake LLM. You said: {steer_text}"
    final = run.receipt(receipt["requestId"])
    assert final is not None and final.state == "delivered" and final.targets[0].delivered_at
    # The model saw the story's whole turn, then the steer as the next user message.
    second = sent_with(model_server, steer_text)[0]
    roles = [m["role"] for m in second["messages"]]
    assert roles[-3:] == ["user", "assistant", "user"]
    assert _user_texts(second)[-1] == steer_text
    assert run.status().steering.delivered == 1


def test_steer_in_the_startup_window_is_still_delivered(pi_home: Path, model_server: FakeModelServer) -> None:
    tag = uuid.uuid4().hex[:8]
    run = pisub.launch("pi", f"SLOW:20 story {tag}")
    rid = run.send_steer(f"EARLY {tag}")  # pi has not even answered get_state yet
    receipt = run.wait_for_receipt(rid, timeout=20)
    assert receipt is not None and receipt.state in ("queued", "delivered")
    result = run.wait(timeout=60)
    assert result.details.results[0].output == f"Hello from the fake LLM. You said: EARLY {tag}"
    final = run.receipt(rid)
    assert final is not None and final.state == "delivered"
    types = [json.loads(line)["type"] for line in (run.dir / "events.jsonl").read_text().splitlines()]
    assert types.index("control.received") < types.index("pi.agent_start"), (
        "the steer came before pi was ready"
    )


def test_steer_held_in_the_startup_window_is_not_sent_after_an_interrupt(pi_home: Path) -> None:
    run = pisub.launch("pi", "SLOW:100 story")
    held = run.send_steer("held steer")
    stop = run.send_interrupt()
    assert run.wait(timeout=60).state == "paused"
    receipt = run.receipt(held)
    # never sent: kept for the next resume when pi already had a session, else failed
    assert receipt is not None and receipt.state in ("failed", "scheduled"), receipt
    assert receipt.state == "failed" or (receipt.reason or "").startswith("carried to the next resume")
    assert run.receipt(stop) is not None


@pytest.mark.pi_versions
def test_stop_leaves_nothing_of_pi(pi_home: Path) -> None:
    run = pisub.launch("pi", "please run TOOL: sleep 45")
    pi_pid = wait_for(lambda: run.status().steps[0].pid)
    wait_for(
        lambda: [
            p
            for p in marked_processes(run.id)
            if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep\x0045")
        ],
        timeout=30,
    )
    proc = pisub_cli("stop", run.id)
    assert proc.returncode == 0 and proc.stdout.startswith("delivered: stop")
    result = run.wait(timeout=30)
    assert result.state == "stopped"
    assert not pid_alive(pi_pid)
    assert not marked_processes(run.id)
