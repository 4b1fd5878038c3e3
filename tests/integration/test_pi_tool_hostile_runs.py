"""What a child (or a model) can put in front of the `subagent` tool: a session nested past the
stack, a run directory whose files are garbage, a run id of its own to hide behind; and start
options given with actions that would drop them. Each in pi's Node, through the exported
functions (the outside attack on issue 25's tool)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_terminal_output import _extension

RUN = "0f0f0f0f-0000-4000-8000-0f0f0f0f0f0f"
OTHER = "1e1e1e1e-0000-4000-8000-1e1e1e1e1e1e"
DEEP = 100_000


def _deep_session(path: Path) -> Path:
    arguments = '{"a":' * DEEP + "1" + "}" * DEEP
    line = (
        '{"type":"message","message":{"role":"assistant","content":'
        '[{"type":"text","text":"hello"},{"type":"toolCall","name":"bash","arguments":' + arguments + "}]}}"
    )
    path.write_text(line + "\n")
    return path


def test_a_session_nested_past_the_stack_is_shown_not_thrown(tmp_path: Path) -> None:
    session = _deep_session(tmp_path / "s.jsonl")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    status = {"runId": RUN, "state": "running", "sessionFile": str(session), "steps": [], "startedAt": "x"}
    (run_dir / "status.json").write_text(json.dumps(status))
    items, update = _extension(
        tmp_path, [["displayItems", session.read_text()], ["streamingUpdate", str(run_dir)]]
    )
    assert isinstance(items, list) and {"type": "text", "text": "hello"} in items
    calls = [i for i in items if isinstance(i, dict) and i.get("type") == "toolCall"]
    assert calls and "nested too deeply" in json.dumps(calls[0]), calls
    assert isinstance(update, dict) and update["details"]["streaming"]["displayItems"], update


def test_a_fleet_inside_a_run_shows_only_its_own_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PISUB_RUN_ID", RUN)
    rows = [
        {"runId": RUN, "key": None, "parentRunId": None, "agent": "pi", "state": "running"},
        {"runId": OTHER, "key": None, "parentRunId": None, "agent": "pi", "state": "running"},
    ]
    stdout = "".join(json.dumps(r) + "\n" for r in rows)
    answers = _extension(tmp_path, [["shape", {"action": "fleet"}, ["fleet", "--json"], 0, stdout, ""]])
    answer = answers[0]
    assert isinstance(answer, dict)
    assert [r["runId"] for r in answer["details"]["items"]] == [RUN]
    assert OTHER[:8] not in answer["content"][0]["text"]


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ({"action": "resume", "id": RUN, "sessionDir": "/x"}, "sessionDir is for action run"),
        ({"action": "status", "id": RUN, "isolation": "worktree"}, "isolation is for action run"),
        ({"action": "doctor", "maxOutput": {"bytes": 5}}, "maxOutput is for action run"),
        ({"action": "list", "topic": "overview"}, "topic is for action guide"),
        ({"action": "status", "id": RUN, "index": 1e308}, "index: expected a whole number"),
        ({"agent": "pi", "task": "x", "timeoutMs": 1e308}, "timeoutMs: at most"),
    ],
)
def test_what_an_action_would_drop_or_cannot_hold_is_refused(
    tmp_path: Path, call: dict[str, object], expected: str
) -> None:
    checked, planned = _extension(tmp_path, [["checkParams", call], ["plan", call, {}]])
    answer = checked if checked is not None else planned
    assert isinstance(answer, dict), (call, answer)
    text = answer["content"][0]["text"]
    assert text.startswith("INVALID_INPUT: ") and expected in text, (call, text)
