"""What the model and the person see of the `subagent` tool in a real pi (issue 25, part 3):
readable text with the structure kept in `details`, `displayItems`, streaming updates while a
foreground run works, the `wait` action, the guide topics, the slash commands, and a bare
`status` inside a run that shows only that run's own."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.pi_integration import TOPICS, extension_path, guide
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pi_version, pisub_cli, wait_for
from tests.integration.test_pi_subagent_tool import ParentPi

pytestmark = pytest.mark.pi

JSON_TEXT = re.compile(r'^\s*[{\[]|"\w+":')  # a JSON object or array, or a "key": pair


class Face(ParentPi):
    """A parent pi whose tool results are read whole (text, details, isError), whose partial
    results are collected, and whose extension UI requests are answered."""

    def result(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The tool_execution_end event of one tool call."""
        ends = self._count("tool_execution_end")
        self.call(arguments)
        return [e for e in list(self.events) if e.get("type") == "tool_execution_end"][ends]

    def updates(self) -> list[dict[str, Any]]:
        return [e["partialResult"] for e in list(self.events) if e.get("type") == "tool_execution_update"]

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()

    def ui(self, method: str, after: int = 0) -> dict[str, Any]:
        """The first extension UI request of ``method`` past index ``after`` of the events."""

        def found() -> dict[str, Any] | None:
            for event in list(self.events)[after:]:
                if event.get("type") == "extension_ui_request" and event.get("method") == method:
                    return event
            return None

        request: dict[str, Any] = wait_for(found, timeout=60, what=f"an extension UI {method}")
        return request

    def notified(self, after: int) -> str:
        return str(self.ui("notify", after)["message"])

    def command(self, line: str) -> str:
        """Run a slash command; the notification it shows."""
        mark = len(self.events)
        self.prompt(line)
        return self.notified(mark)


@pytest.fixture
def face(pi_home: Path, pi_bin: str, tmp_path: Path) -> Iterator[Face]:
    pi = Face(pi_bin, tmp_path / "parent.jsonl", tmp_path)
    yield pi
    pi.close()


def _text(end: dict[str, Any]) -> str:
    return str(((end.get("result") or {}).get("content") or [{}])[0].get("text", ""))


def _details(end: dict[str, Any]) -> dict[str, Any]:
    details = (end.get("result") or {}).get("details")
    assert isinstance(details, dict), end
    return details


def _readable(end: dict[str, Any]) -> str:
    text = _text(end)
    assert text and not JSON_TEXT.search(text), text
    return text


@pytest.mark.pi_versions
def test_every_answer_is_a_readable_summary_and_details_keep_the_structure(face: Face) -> None:
    tag = uuid.uuid4().hex[:8]
    started = face.result({"agent": "pi", "task": f"SLOW:100 summary {tag}"})
    text = _readable(started)
    run_id = _details(started)["runId"]
    assert text.startswith(f"started run {run_id} (pi): running") and '{action: "wait"' in text
    wait_for(lambda: pisub.Run(run_id).status().state == "running", timeout=30)
    live = face.result({"action": "status", "id": run_id})
    assert _readable(live).startswith(f"run {run_id}: running (agent pi, runner pi)")
    assert _details(live)["items"][0]["runId"] == run_id  # the status object as pisub printed it
    fleet = _readable(face.result({"action": "fleet"}))
    assert run_id in fleet and "turns" in fleet
    steered = face.result({"action": "steer", "id": run_id, "message": "hurry"})
    assert re.match(rf"(delivered|queued): steer \S+ → run {run_id}", _readable(steered))
    assert _details(steered)["receipt"]["runId"] == run_id
    assert pisub.Run(run_id).wait(timeout=120).state == "complete"
    done = _readable(face.result({"action": "status", "id": run_id}))
    assert "complete" in done and '{action: "get"' in done
    assert run_id in _readable(face.result({"action": "status"}))
    assert "Slow chunk" in _readable(face.result({"action": "status", "id": run_id, "view": "transcript"}))
    agents = face.result({"action": "list"})
    assert "pi [pi, user] the real pi" in _readable(agents)
    assert any(a["name"] == "pi" for a in _details(agents)["items"])
    assert "fake/fake-model" in _readable(face.result({"action": "models"}))
    assert _readable(face.result({"action": "get", "agent": "pi"})).startswith("agent pi (user, runner pi)")
    assert _readable(face.result({"action": "children.list"})) == "(no retained children)"
    late = _readable(face.result({"action": "stop", "id": run_id}))
    assert late.startswith(f"failed: stop → run {run_id}: run {run_id} has finished"), late
    missing = face.result({"action": "status", "id": "0" * 8})
    assert _readable(missing).startswith("RUN_NOT_FOUND: ")
    assert _details(missing)["error"]["code"] == "RUN_NOT_FOUND"


def test_a_result_carries_display_items(face: Face) -> None:
    end = face.result({"agent": "pi", "task": "TOOL:echo shown-item", "async": False})
    assert _text(end).startswith("Tool said: shown-item"), _text(end)
    result = _details(end)["results"][0]
    assert result["output"].startswith("Tool said") and result["exitCode"] == 0  # the seed's fields
    items = result["displayItems"]
    assert {"type": "toolCall", "name": "bash", "args": {"command": "echo shown-item"}} in items
    assert items[-1]["type"] == "text" and items[-1]["text"].startswith("Tool said: shown-item")
    again = face.result({"action": "get", "id": _details(end)["runId"]})
    assert _details(again)["results"][0]["displayItems"] == items


def test_a_foreground_run_streams_updates_while_it_works(face: Face) -> None:
    end = face.result({"agent": "pi", "task": "TOOL:sleep 4; echo slept", "async": False})
    assert "slept" in _text(end)
    run_id = _details(end)["runId"]
    updates = [u for u in face.updates() if (u.get("details") or {}).get("runId") == run_id]
    assert len(updates) >= 2, face.updates()
    streaming = [u["details"]["streaming"] for u in updates]
    assert all(u["details"]["results"] == [] and u["details"]["mode"] == "single" for u in updates)
    assert any(s["turnCount"] >= 1 for s in streaming), streaming
    calls = [i for s in streaming for i in s["displayItems"] if i["type"] == "toolCall"]
    assert calls and calls[0]["name"] == "bash", streaming
    assert all(u["content"][0]["text"].startswith(f"run {run_id} (pi): ") for u in updates)
    assert "streaming" not in _details(end)  # the final result has none


def test_wait_blocks_until_the_end_and_a_wait_that_gives_up_leaves_the_run_going(face: Face) -> None:
    run_id = _details(face.result({"agent": "pi", "task": "SLOW:120 waited on"}))["runId"]
    gave_up = face.result({"action": "wait", "id": run_id, "timeoutMs": 500})
    assert _readable(gave_up).startswith(f"run {run_id} is still going: the wait gave up after 0.5 s")
    assert not gave_up.get("isError") and _details(gave_up)["waiting"] == {"done": False, "reason": "timeout"}
    assert pisub.Run(run_id).status().state == "running"
    # an interrupted wait (the parent's turn aborted) also leaves it going
    starts = face._count("tool_execution_start")
    face.prompt("CALLS:" + json.dumps([["subagent", {"action": "wait", "id": run_id}]]))
    wait_for(lambda: face._count("tool_execution_start") > starts, timeout=60, what="the wait to start")
    face.send({"type": "abort"})
    ends = wait_for(
        lambda: [e for e in list(face.events) if e.get("type") == "tool_execution_end"][starts:],
        timeout=60,
        what="the interrupted wait's result",
    )
    assert "was interrupted before the run ended; the run goes on" in _text(ends[0]), ends[0]
    assert pisub.Run(run_id).status().state == "running"
    waited = face.result({"action": "wait", "id": run_id[:8]})
    assert _text(waited).startswith("Slow chunk 1 of 120") and not waited.get("isError")
    assert pisub.Run(run_id).status().state == "complete"
    assert _text(face.result({"action": "wait"})) == "INVALID_INPUT: wait needs id"


def test_the_guide_topics_the_seed_names_say_what_exists(face: Face) -> None:
    for topic in ("missions", "observability", "watchdog", "extension-api"):
        assert topic in TOPICS and guide(topic).startswith("# ")
    # issue 28 built missions (and schedules): the guide says how, not "not built yet"
    assert "not built yet" not in guide("missions") and "`mission.create`" in guide("missions")
    assert "not built yet" not in guide("models") and '{action: "models"}' in guide("models")
    assert '{action: "list"}` (the agents)' in guide("overview")
    assert "`pisub agents list --json`" in guide("tool-reference")
    ts_topics = re.search(r"const GUIDE_TOPICS = \[(.*?)\];", extension_path().read_text(), re.S)
    assert ts_topics is not None and re.findall(r'"([\w-]+)"', ts_topics.group(1)) == list(TOPICS)
    text = _text(face.result({"action": "guide", "topic": "watchdog"}))
    assert text.startswith("# Watchdog") and "toolTimeoutMs" in text
    assert "extension-api" in _text(face.result({"action": "guide", "topic": "nope"}))
    assert pisub_cli("guide", "observability").stdout.startswith("# Observability")


def _session_messages(face: Face, custom_type: str) -> list[dict[str, Any]]:
    found = []
    for event in list(face.events):
        message = event.get("message") or {}
        if event.get("type") == "message_end" and message.get("customType") == custom_type:
            found.append(message)
    return found


def test_slash_commands_guide_stop_with_a_picker_and_steer_a_child(face: Face, tmp_path: Path) -> None:
    face.call({"action": "list"})  # the session started, the extension bound to the home
    face.prompt("/subagents-guide workflows")
    shown = wait_for(lambda: _session_messages(face, "pisub-guide"), timeout=30, what="the guide message")
    assert str(shown[0]["content"]).startswith("# Workflows")
    assert face.command("/subagents-guide no-such-topic").startswith("INVALID_INPUT: no guide topic")
    assert face.command("/subagents-stop").startswith("no run started from this session is running")

    run_id = _details(face.result({"agent": "pi", "task": "SLOW:400 stop me"}))["runId"]
    wait_for(lambda: pisub.Run(run_id).status().state == "running", timeout=30)
    mark = len(face.events)
    face.prompt("/subagents-stop")
    picker = face.ui("select", mark)
    assert picker["options"] == [f"{run_id}  pi  running"], picker
    face.send({"type": "extension_ui_response", "id": picker["id"], "value": picker["options"][0]})
    sure = face.ui("confirm", mark)
    face.send({"type": "extension_ui_response", "id": sure["id"], "confirmed": True})
    assert face.notified(mark).startswith("delivered: stop"), face.events[mark:]
    assert pisub.Run(run_id).wait(timeout=60).state == "stopped"

    script = tmp_path / "wf.py"
    script.write_text(
        "async def main(runs, state, args):\n"
        "    return await runs.run('kid', agent='pi', task='SLOW:300 kid')\n"
    )
    workflow = json.loads(pisub_cli("run", "--workflow", str(script), "--json").stdout)["runId"]
    kid = pisub.Run(workflow)
    wait_for(lambda: any(s.key == "kid" and s.status == "running" for s in kid.status().steps), timeout=60)
    said = face.command(f"/subagents-steer --child kid {workflow} -- --child is part of the message")
    assert re.match(rf"(delivered|queued): steer \S+ → run {workflow} child kid", said), said
    assert face.command(f"/subagents-steer {workflow}").startswith("usage: /subagents-steer")
    assert face.command("/subagents-steer --help me").startswith("not a run id")
    assert pisub_cli("stop", workflow).returncode == 0
    assert kid.wait(timeout=60).state == "stopped"


def test_a_bare_status_inside_a_run_shows_only_its_own_runs(
    pi_home: Path, pi_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_server: FakeModelServer
) -> None:
    outer = json.loads(pisub_cli("run", "--agent", "pi", "--json", "SLOW:300 the outer run").stdout)["runId"]
    other = json.loads(pisub_cli("run", "--agent", "pi", "--json", "an unrelated run").stdout)["runId"]
    for name, value in (("PISUB_RUN_ID", outer), ("PISUB_ROOT_RUN_ID", outer), ("PISUB_DEPTH", "0")):
        monkeypatch.setenv(name, value)
    inside = Face(pi_bin, tmp_path / "inside.jsonl", tmp_path)
    try:
        mine = _details(inside.result({"agent": "pi", "task": "a run of the inner pi"}))["runId"]
        assert pisub.Run(mine).wait(timeout=60).state == "complete"
        answer = inside.result({"action": "status"})
        bare = _readable(answer)
        assert {s["runId"] for s in _details(answer)["items"]} == {outer, mine}  # details too
    finally:
        inside.close()
    assert bare.startswith(f"inside run {outer}: this run and the runs it started"), bare
    assert mine in bare and outer in bare and other not in bare
    monkeypatch.delenv("PISUB_RUN_ID")
    assert other in pisub_cli("list", "--json").stdout  # outside a run, every run
    assert pisub_cli("stop", outer).returncode == 0


def test_hostile_run_files_reach_the_text_and_display_items_escaped_and_bounded(tmp_path: Path) -> None:
    """What a child controls (its session's messages, status fields, a FIFO or a symlink in
    place of a file) becomes escaped, one-line, bounded text, and never blocks the extension."""
    import os

    from tests.integration.test_terminal_output import HOSTILE_TEXT, _extension, assert_clean

    def assistant(*content: dict[str, Any]) -> str:
        return json.dumps({"type": "message", "message": {"role": "assistant", "content": list(content)}})

    session = "\n".join(
        [
            "not json at all assistant",
            assistant(
                {"type": "text", "text": HOSTILE_TEXT},
                {"type": "toolCall", "name": HOSTILE_TEXT, "arguments": {"c": HOSTILE_TEXT}},
            ),
            assistant({"type": "toolCall", "name": "bash", "arguments": {"big": "x" * 10_000}}),
            assistant({"type": "toolCall", "name": "bash", "arguments": ["not", "an", "object"]}),
            *[assistant({"type": "text", "text": f"item {i}"}) for i in range(60)],
        ]
    )
    head = "\n".join(session.split("\n")[:4])
    status = {
        "runId": HOSTILE_TEXT,
        "state": "running\nfake: line",
        "agent": HOSTILE_TEXT,
        "steps": [
            {
                "index": 0,
                "status": HOSTILE_TEXT,
                "currentTool": {"name": HOSTILE_TEXT},
                "recentOutput": [HOSTILE_TEXT],
            }
        ],
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "status.json")  # a FIFO where status.json belongs: no block, no update
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "real.jsonl").write_text(session)
    (linked / "s.jsonl").symlink_to(linked / "real.jsonl")
    (linked / "status.json").write_text(json.dumps({**status, "sessionFile": str(linked / "s.jsonl")}))
    calls: list[list[object]] = [
        ["displayItems", session],
        ["displayItems", head],
        ["shape", {}, ["status", "--json", "--", "x"], 0, json.dumps(status), ""],
        [
            "shape",
            {},
            ["fleet", "--json"],
            0,
            json.dumps({"runId": HOSTILE_TEXT, "currentTool": HOSTILE_TEXT}),
            "",
        ],
        [
            "shape",
            {},
            ["children", "list", "--json"],
            0,
            json.dumps([{"key": HOSTILE_TEXT, "reason": HOSTILE_TEXT}]),
            "",
        ],
        [
            "shape",
            {},
            ["workflow", "validate", "--json"],
            0,
            json.dumps({"ok": False, "errors": [{"message": HOSTILE_TEXT}]}),
            "",
        ],
        ["streamingUpdate", str(run_dir)],
        ["streamingUpdate", str(linked)],
        ["parseSteer", f"{HOSTILE_TEXT} hello"],
        ["parseSteer", "--child k\x1b]0;title\x07 abcd1234 hello"],
    ]
    items, first, summary, fleet, kids, invalid, fifo, symlinked, steer, child = _extension(tmp_path, calls)
    assert isinstance(items, list) and len(items) == 50 and items[-1] == {"type": "text", "text": "item 59"}
    assert isinstance(first, list) and len(first) == 4  # the line that is not JSON is skipped
    assert first[1]["name"].startswith("\\x1b") and "\\x1b]0;pwned-title" in first[1]["args"]["c"]
    assert (
        first[2]["args"] == {"truncated": first[2]["args"]["truncated"]}
        and len(first[2]["args"]["truncated"]) < 2100
    )
    assert first[3]["args"] == {}
    assert_clean("displayItems", json.dumps(first, ensure_ascii=False).encode())
    for answer in (summary, fleet, kids, invalid):
        assert isinstance(answer, dict)
        assert_clean("a summary", answer["content"][0]["text"].encode())
    assert isinstance(summary, dict)
    lines = summary["content"][0]["text"].split("\n")
    assert (
        lines[0].startswith("run ")
        and "running\\x0afake" in lines[0]
        and not any(line.startswith("fake:") for line in lines)
    )
    assert fifo is None
    assert isinstance(symlinked, dict) and symlinked["details"]["streaming"]["displayItems"] == []
    assert_clean("a streaming update", symlinked["content"][0]["text"].encode())
    assert isinstance(steer, str) and steer.startswith("not a run id: \\x1b") and "\x1b" not in steer
    assert isinstance(child, str) and child.startswith("not a child key") and "\x1b" not in child


def test_stop_without_a_ui_prints_the_exact_commands(
    pi_home: Path, pi_bin: str, tmp_path: Path, model_server: FakeModelServer
) -> None:
    """pi in JSON mode has no UI to pick from: /subagents-stop names each running run of the
    session with the exact tool call and slash command, and stops nothing."""
    import os
    import subprocess
    import sys

    from pisub.children.pi.versions import caps_of
    from pisub.testing.fake_model import PI_HERMETIC_ARGS

    session = tmp_path / "s.jsonl"
    first = Face(pi_bin, session, tmp_path)
    try:
        run_id = _details(first.result({"agent": "pi", "task": "SLOW:400 keep going"}))["runId"]
    finally:
        first.close()
    argv = [pi_bin, "--mode", "json", "--session", str(session), *PI_HERMETIC_ARGS]
    if caps_of(pi_version(pi_bin)).approve_flag:
        argv.append("--no-approve")
    argv += ["--extension", str(extension_path()), "/subagents-stop"]
    env = {**os.environ, "PISUB_ARGV": json.dumps([sys.executable, "-m", "pisub"])}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    exact = f'subagent({{action: \\"stop\\", id: \\"{run_id}\\"}})'  # as JSON carries it
    assert exact in proc.stdout, (proc.stdout[-3000:], proc.stderr)
    assert f"/subagents-stop {run_id}" in proc.stdout
    assert pisub.Run(run_id).status().state == "running"
    assert pisub_cli("stop", run_id).returncode == 0


def test_refine_command_writes_shows_and_rolls_back_the_projects_overlay(face: Face) -> None:
    face.call({"action": "list"})  # the session started
    made = face.command("/subagents-refine pi   answer in one word here")
    assert made.startswith("refined: ") and "revision 1" in made, made
    assert "answer in one word here" in face.command("/subagents-refine pi --show")
    assert face.command("/subagents-refine pi --rollback").startswith("rolled back: ")
    assert face.command("/subagents-refine --help").startswith("usage: /subagents-refine")
