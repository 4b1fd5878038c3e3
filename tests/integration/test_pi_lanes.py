"""Lanes and retained children with the real pi against the scripted model server."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import pisub
from pisub.api.client import launch_lanes, retained_children
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pisub_cli
from tests.helpers import sent_with

pytestmark = pytest.mark.pi

SAID = "Hello from the fake LLM. You said: "


@pytest.mark.pi_versions
def test_resume_previous_carries_the_conversation_and_a_failing_lane_is_blocked(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    lanes = [
        {
            "key": "talk",
            "defaults": {"agent": "pi"},
            "stages": [
                {"key": "first", "task": f"remember {tag}-one"},
                {"key": "second", "task": f"again {tag}-two", "resume": "previous"},
            ],
        },
        {
            "key": "broken",
            "defaults": {"agent": "pi"},
            "stages": [
                {"key": "one", "task": f"fine {tag}-b1"},
                {"key": "two", "task": f"ERROR500 {tag}-b2"},
                {"key": "three", "task": f"never {tag}-b3"},
            ],
        },
    ]
    run = launch_lanes(lanes)
    result = run.wait(timeout=180)
    board = json.loads(result.content[0].text[result.content[0].text.index("[") :])
    talk, broken = board
    assert talk["state"] == "complete", json.dumps(talk)  # (whole, with the blocked stage's error)
    assert [s["state"] for s in broken["stages"]] == ["completed", "failed", "skipped"]
    assert broken["failedStage"] == "two" and result.state == "failed"
    # The second stage's request to the model carries the first stage's turn.
    second = sent_with(model_server, f"{tag}-two")
    assert second and f"{tag}-one" in json.dumps(second[-1])
    assert not sent_with(model_server, f"{tag}-b3")
    first_id = talk["stages"][0]["runId"]
    second_id = talk["stages"][1]["runId"]
    assert first_id != second_id
    assert pisub.Run(second_id).manifest().resumed_from == first_id


def test_children_list_says_which_are_resumable_and_a_follow_up_becomes_a_brief(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    run = launch_lanes(
        [
            {"key": "ok", "defaults": {"agent": "pi"}, "stages": [{"key": "s", "task": f"keep {tag}"}]},
            {"key": "bad", "defaults": {"agent": "pi"}, "stages": [{"key": "s", "task": f"ERROR500 {tag}"}]},
        ]
    )
    run.wait(timeout=120)
    found = {c.key: c for c in retained_children(parent=run.id)}
    assert set(found) == {"ok.s", "bad.s"}
    assert found["ok.s"].resumable and found["ok.s"].reason is None
    listed = json.loads(pisub_cli("children", "list", "--parent", run.id, "--json", check=True).stdout)
    assert {c["key"] for c in listed} == {"ok.s", "bad.s"}
    assert "resumable" in pisub_cli("children", "list", check=True).stdout

    # A follow-up to the finished child is stored for its next resume and says so.
    sent = pisub_cli("follow-up", run.id, "--child", "ok.s", f"also {tag}-brief", "--json", check=True)
    receipt = json.loads(sent.stdout)
    assert receipt["state"] == "scheduled" and "next resume" in receipt["reason"]
    child = pisub.Run(found["ok.s"].run_id)
    again = child.resume(f"continue {tag}-next")
    assert again.wait(timeout=120).state == "complete"
    request = sent_with(model_server, f"{tag}-next")[-1]
    assert f"{tag}-brief" in json.dumps(request)


def test_a_pi_stage_ending_with_a_blocked_verdict_blocks_its_lane(
    pi_home: Path, model_server: FakeModelServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    verdict = '```json\n{"verdict": "blocked", "why": "needs a human"}\n```'
    run = launch_lanes(
        [
            {
                "key": "review",
                "defaults": {"agent": "pi"},
                "stages": [
                    {"key": "look", "task": f"look {tag}\n{verdict}"},
                    {"key": "fix", "task": f"fix {tag}"},
                ],
            }
        ]
    )
    result = run.wait(timeout=120)
    board = json.loads(result.content[0].text[result.content[0].text.index("[") :])
    (lane,) = board
    assert lane["state"] == "blocked" and lane["failedStage"] == "look"
    assert lane["stages"][0]["verdict"] == "blocked" and lane["stages"][1]["state"] == "skipped"
    assert not sent_with(model_server, f"fix {tag}")
