"""Schedules and missions through the `subagent` tool (issue 28; audit rows #86-#96): first the
extension's ``plan`` in pi's Node (every action's argv, every refusal rule, the presence file),
then a real parent pi against the scripted model, whose calls run the real ``pisub schedule`` and
``pisub mission`` commands: schedules created, listed, fired, paused, resumed and deleted, their
notices (noisy, quiet, session-only), missions from create to close, workflows sharing a
mission's state, ``mission: false``, the goal continuation notice, the stop picker's schedules."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pisub_cli, wait_for
from tests.integration.test_pi_subagent_tool import _started
from tests.integration.test_pi_tool_face import Face, _details, _session_messages, _text
from tests.integration.test_terminal_output import _extension, assert_clean

RUN = "0123abcd-0000-4000-8000-000000000001"
KEY = "0123456789abcdef0123456789abcdef"
JS = "return 1"

# ---------------------------------------------------------------------------- plan, in Node

# (call, context, argv): what each schedule and mission call becomes.
MAPPED: list[tuple[dict[str, Any], dict[str, Any], list[str]]] = [
    (
        {"action": "schedule.create", "every": "6h", "workflowScriptPath": "workflows/review.js"},
        {"sessionKey": KEY},
        [
            "schedule",
            "create",
            "--json",
            "--workflow=workflows/review.js",
            "--every=6h",
            f"--session-key={KEY}",
        ],
    ),
    (
        {
            "action": "schedule.create",
            "id": "evening-review",
            "name": "Evening review",
            "at": "+30m",
            "baseRef": "refs/heads/release",
            "workflowScript": JS,
        },
        {"sessionKey": KEY},
        [
            "schedule",
            "create",
            "--json",
            "--workflow-script=-",
            "--at=+30m",
            "--name=Evening review",
            "--id=evening-review",
            f"--session-key={KEY}",
            "--base-ref=refs/heads/release",
        ],
    ),
    (
        {
            "action": "schedule.create",
            "id": "nightly-sweep",
            "every": "24h",
            "quiet": True,
            "sessionOnly": True,
            "catchUp": "none",
            "overlap": "skip",
            "workflowScriptPath": "sweep.py",
            "cwd": "/p",
            "args": {"n": "1"},
            "timeoutMs": 90000,
        },
        {"sessionKey": KEY, "sessionFile": "/s.jsonl"},
        [
            "schedule",
            "create",
            "--json",
            "--workflow=/p/sweep.py",
            "--every=24h",
            "--id=nightly-sweep",
            "--catch-up=none",
            "--quiet",
            "--session-only",
            f"--session-key={KEY}",
            "--cwd=/p",
            '--args={"n":"1"}',
            "--timeout=90",
        ],
    ),
    (
        {"action": "schedule.create", "at": "2030-01-01T08:00:00+01:00", "workflowScript": JS},
        {},
        ["schedule", "create", "--json", "--workflow-script=-", "--at=2030-01-01T08:00:00+01:00"],
    ),
    ({"action": "schedule.list"}, {}, ["schedule", "list", "--json"]),
    ({"action": "schedule.run-due"}, {}, ["schedule", "run-due", "--json"]),
    ({"action": "schedule.show", "id": "backlog"}, {}, ["schedule", "show", "--json", "--", "backlog"]),
    ({"action": "schedule.history", "id": "backlog"}, {}, ["schedule", "history", "--json", "--", "backlog"]),
    ({"action": "schedule.pause", "id": "backlog"}, {}, ["schedule", "pause", "--json", "--", "backlog"]),
    ({"action": "schedule.resume", "id": "backlog"}, {}, ["schedule", "resume", "--json", "--", "backlog"]),
    ({"action": "schedule.delete", "id": "backlog"}, {}, ["schedule", "delete", "--json", "--", "backlog"]),
    ({"action": "schedule.run", "id": "backlog"}, {}, ["schedule", "run", "--json", "--", "backlog"]),
    (
        {"action": "schedule.run", "id": "backlog", "quiet": True},
        {},
        ["schedule", "run", "--json", "--quiet", "--", "backlog"],
    ),
    (
        {
            "action": "mission.create",
            "mission": {
                "title": "Ship auth refresh",
                "objective": "Implement and validate token refresh",
                "goal": True,
                "budget": {"tokens": 400000},
                "labels": ["auth", "q4"],
            },
        },
        {"sessionKey": KEY},
        [
            "mission",
            "create",
            "--json",
            "--title=Ship auth refresh",
            "--objective=Implement and validate token refresh",
            "--goal",
            "--budget-tokens=400000",
            "--label=auth",
            "--label=q4",
            f"--session-key={KEY}",
        ],
    ),
    (
        {"action": "mission.create", "mission": {"summary": "A summary"}, "cwd": "/p"},
        {},
        ["mission", "create", "--json", "--summary=A summary", "--cwd=/p"],
    ),
    ({"action": "mission.list"}, {}, ["mission", "list", "--json"]),
    (
        {"action": "mission.list", "missionScope": "global"},
        {},
        ["mission", "list", "--json", "--scope=global"],
    ),
    ({"action": "mission.show", "missionId": "m-1"}, {}, ["mission", "show", "--json", "--", "m-1"]),
    (
        {
            "action": "mission.update",
            "missionId": "m-1",
            "missionUpdate": {"decisions": [{"title": "Ship?"}]},
        },
        {},
        ["mission", "update", "--json", '--set={"decisions":[{"title":"Ship?"}]}', "--", "m-1"],
    ),
    (
        {"action": "mission.resolve-decision", "missionId": "m-1", "id": "d-1", "summary": "yes, ship it"},
        {},
        ["mission", "resolve-decision", "--json", "--summary=yes, ship it", "--", "m-1", "d-1"],
    ),
    (
        {"action": "mission.attach-run", "missionId": "m-1", "runId": RUN, "runMode": "run"},
        {},
        ["mission", "attach-run", "--json", "--mode=run", "--", "m-1", RUN],
    ),
    (
        {"action": "mission.attach-run", "missionId": "m-1", "id": RUN},
        {},
        ["mission", "attach-run", "--json", "--", "m-1", RUN],
    ),
    (
        {"action": "mission.close", "missionId": "m-1"},
        {},
        ["mission", "close", "--json", "--status=completed", "--", "m-1"],
    ),
    (
        {"action": "mission.close", "missionId": "m-1", "missionStatus": "cancelled", "summary": "dropped"},
        {},
        ["mission", "close", "--json", "--status=cancelled", "--summary=dropped", "--", "m-1"],
    ),
    (
        {"workflowScript": JS, "missionId": "m-1"},
        {"sessionKey": KEY},
        ["run", "--json", "--workflow-script=-", "--mission-id=m-1"],
    ),
    (
        {"workflowScriptPath": "wf.py", "mission": False},
        {"sessionKey": KEY},
        ["run", "--json", "--workflow=wf.py", "--no-mission"],
    ),
    (
        {"lanes": "lanes.json", "cwd": "/p"},
        {"sessionKey": KEY},
        ["run", "--json", "--cwd=/p", "--lanes=/p/lanes.json", f"--session-key={KEY}"],
    ),
    (
        {"workflow": "review", "args": {"task": "x"}, "mission": {"title": "Review", "labels": ["r"]}},
        {"sessionKey": KEY},
        [
            "run",
            "--json",
            "--resource=review",
            '--args={"task":"x"}',
            '--mission={"title":"Review","labels":["r"]}',
            f"--session-key={KEY}",
        ],
    ),
    (
        {"agent": "a", "task": "t", "mission": False},
        {"sessionKey": KEY},
        ["run", "--json", "--agent=a", "--", "t"],
    ),
]

# (call, context, code, a part of the one-line answer): the seed's rules, refused before anything runs.
REFUSED: list[tuple[dict[str, Any], dict[str, Any], str, str]] = [
    (
        {"action": "schedule.create", "at": "+10m", "every": "6h", "workflowScript": JS},
        {},
        "INVALID_INPUT",
        "exactly one trigger",
    ),
    ({"action": "schedule.create", "workflowScript": JS}, {}, "INVALID_INPUT", "exactly one trigger"),
    (
        {"action": "schedule.create", "every": "6h"},
        {},
        "INVALID_INPUT",
        "needs workflowScript or workflowScriptPath",
    ),
    (
        {"action": "schedule.create", "every": "6h", "agent": "scout", "task": "t"},
        {},
        "INVALID_INPUT",
        "not agent/task",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "agent": "scout"},
        {},
        "INVALID_INPUT",
        "not agent/task",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "missionId": "m"},
        {},
        "INVALID_INPUT",
        "no mission fields",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "mission": {"title": "x"}},
        {},
        "INVALID_INPUT",
        "no mission fields",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "missionUpdate": {}},
        {},
        "INVALID_INPUT",
        "no mission fields",
    ),
    (
        {"action": "schedule.create", "at": "+10m", "workflowScript": JS, "quiet": True},
        {},
        "INVALID_INPUT",
        "quiet is for a recurring",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "async": False},
        {},
        "INVALID_INPUT",
        "background",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "context": "fork"},
        {},
        "INVALID_INPUT",
        "context is for action run",
    ),
    ({"action": "schedule.create", "every": "6x", "workflowScript": JS}, {}, "INVALID_INPUT", "every:"),
    ({"action": "schedule.create", "every": "0m", "workflowScript": JS}, {}, "INVALID_INPUT", "every:"),
    ({"action": "schedule.create", "at": "tomorrow", "workflowScript": JS}, {}, "INVALID_INPUT", "at:"),
    (
        {"action": "schedule.create", "at": "2030-01-01T08:00:00", "workflowScript": JS},
        {},
        "INVALID_INPUT",
        "with a zone",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "id": "-rf"},
        {},
        "INVALID_INPUT",
        "id (a schedule id",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "id": "a/b"},
        {},
        "INVALID_INPUT",
        "id (a schedule id",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "baseRef": "HEAD~1"},
        {},
        "INVALID_INPUT",
        "baseRef",
    ),
    ({"action": "schedule.create", "every": "6h", "workflowScript": "  "}, {}, "INVALID_INPUT", "non-empty"),
    (
        {"action": "schedule.create", "every": "6h", "workflowScriptPath": "w.ts"},
        {},
        "INVALID_INPUT",
        "TypeScript",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflow": "review"},
        {},
        "INVALID_INPUT",
        "named workflow resource",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "sessionOnly": True},
        {},
        "INVALID_INPUT",
        "persisted session",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "overlap": "queue"},
        {},
        "INVALID_INPUT",
        "overlap:",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "catchUp": "all"},
        {},
        "INVALID_INPUT",
        "catchUp:",
    ),
    (
        {"action": "schedule.create", "every": "day", "workflowScript": JS},
        {},
        "NOT_AVAILABLE_YET",
        "calendar schedules",
    ),
    (
        {"action": "schedule.create", "every": "6h", "workflowScript": JS, "timezone": "UTC"},
        {},
        "NOT_AVAILABLE_YET",
        "defers",
    ),
    (
        {"action": "schedule.create", "on": "monday", "workflowScript": JS},
        {},
        "NOT_AVAILABLE_YET",
        "calendar",
    ),
    (
        {"action": "schedule.create", "cron": "0 * * * *", "workflowScript": JS},
        {},
        "NOT_AVAILABLE_YET",
        "calendar",
    ),
    ({"action": "schedule.show"}, {}, "INVALID_INPUT", "needs id"),
    ({"action": "schedule.pause", "id": "--all"}, {}, "INVALID_INPUT", "id (a schedule id)"),
    ({"action": "schedule.list", "id": "x"}, {}, "INVALID_INPUT", "takes no id"),
    (
        {"action": "schedule.show", "id": "x", "quiet": True},
        {},
        "INVALID_INPUT",
        "quiet is for action schedule.create / schedule.run",
    ),
    ({"action": "status", "every": "6h"}, {}, "INVALID_INPUT", "every is for action schedule.create"),
    (
        {"agent": "a", "task": "t", "sessionOnly": True},
        {},
        "INVALID_INPUT",
        "sessionOnly is for action schedule.create",
    ),
    ({"action": "schedule.lst"}, {}, "INVALID_INPUT", 'Did you mean "schedule.list"? (not run)'),
    ({"action": "mision.list"}, {}, "INVALID_INPUT", 'Did you mean "mission.list"? (not run)'),
    ({"action": "mission.create"}, {}, "INVALID_INPUT", "mission.create needs mission"),
    (
        {"action": "mission.create", "mission": {"title": "a", "summary": "b"}},
        {},
        "INVALID_INPUT",
        "not both",
    ),
    (
        {"action": "mission.create", "mission": {"objective": "o"}},
        {},
        "INVALID_INPUT",
        "needs a title or a summary",
    ),
    (
        {"action": "mission.create", "mission": {"title": " "}},
        {},
        "INVALID_INPUT",
        "mission.title: expected a non-empty",
    ),
    (
        {"action": "mission.create", "mission": {"title": "a", "goal": True}},
        {},
        "INVALID_INPUT",
        "mission.budget: goal: true needs",
    ),
    (
        {"action": "mission.create", "mission": {"title": "a", "goal": False}},
        {},
        "INVALID_INPUT",
        "mission.goal: only true",
    ),
    (
        {"action": "mission.create", "mission": {"title": "a", "budget": {"tokens": 0}}},
        {},
        "INVALID_INPUT",
        "mission.budget.tokens: expected a positive",
    ),
    (
        {"action": "mission.create", "mission": {"title": "a", "budget": {"tokens": 5, "usd": 1}}},
        {},
        "INVALID_INPUT",
        'mission.budget."usd": unknown field',
    ),
    (
        {"action": "mission.create", "mission": {"title": "a", "labels": ["ok", ""]}},
        {},
        "INVALID_INPUT",
        "mission.labels[1]",
    ),
    (
        {"action": "mission.create", "mission": {"title": "a", "\x1b]0;x": 1}},
        {},
        "INVALID_INPUT",
        "unknown field",
    ),
    (
        {"action": "mission.create", "mission": True},
        {},
        "INVALID_INPUT",
        "mission: expected an object or false",
    ),
    ({"action": "mission.show"}, {}, "INVALID_INPUT", "needs missionId"),
    ({"action": "mission.show", "missionId": "-x"}, {}, "INVALID_INPUT", "missionId"),
    (
        {"action": "mission.show", "missionId": "m", "id": "m"},
        {},
        "INVALID_INPUT",
        "names its mission with missionId",
    ),
    ({"action": "mission.update", "missionId": "m"}, {}, "INVALID_INPUT", "needs missionUpdate"),
    (
        {"action": "mission.update", "missionId": "m", "missionUpdate": []},
        {},
        "INVALID_INPUT",
        "missionUpdate: expected a object",
    ),
    (
        {"action": "mission.resolve-decision", "missionId": "m", "id": "d"},
        {},
        "INVALID_INPUT",
        "needs summary",
    ),
    (
        {"action": "mission.resolve-decision", "missionId": "m", "summary": "s"},
        {},
        "INVALID_INPUT",
        "needs id",
    ),
    ({"action": "mission.attach-run", "missionId": "m"}, {}, "INVALID_INPUT", "needs runId"),
    ({"action": "mission.attach-run", "missionId": "m", "runId": "; rm -rf"}, {}, "INVALID_INPUT", "runId"),
    (
        {"action": "mission.close", "missionId": "m", "missionStatus": "active"},
        {},
        "INVALID_INPUT",
        "missionStatus",
    ),
    ({"action": "mission.list", "missionScope": "everywhere"}, {}, "INVALID_INPUT", "missionScope:"),
    (
        {"action": "mission.show", "missionId": "m", "summary": "s"},
        {},
        "INVALID_INPUT",
        "summary is for action",
    ),
    ({"workflowScript": JS, "missionId": "m", "mission": False}, {}, "INVALID_INPUT", "contradict"),
    ({"workflowScript": JS, "missionId": "m", "mission": {"title": "t"}}, {}, "INVALID_INPUT", "not both"),
    ({"workflowScript": JS, "mission": {"title": "t", "goal": True}}, {}, "INVALID_INPUT", "mission.budget"),
    ({"agent": "a", "task": "t", "missionId": "m"}, {}, "INVALID_INPUT", "a mission encloses a workflow"),
    (
        {"agent": "a", "task": "t", "mission": {"title": "t"}},
        {},
        "INVALID_INPUT",
        "a mission encloses a workflow",
    ),
]


def test_every_schedule_and_mission_call_maps_onto_pisub_in_node(tmp_path: Path) -> None:
    answers = _extension(tmp_path, [["plan", call, context] for call, context, _ in MAPPED])
    for (call, _context, argv), answer in zip(MAPPED, answers, strict=True):
        assert answer == argv, (call, answer)
    # an inline script goes to pisub's stdin, never into the argv
    stdin = _extension(tmp_path, [["inputOf", MAPPED[1][0], MAPPED[1][2]]])
    assert stdin == [JS]


def test_every_seed_rule_is_refused_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    answers = _extension(tmp_path, [["plan", call, context] for call, context, _, _ in REFUSED])
    for (call, _context, code, expected), answer in zip(REFUSED, answers, strict=True):
        assert isinstance(answer, dict), (call, answer)
        text = answer["content"][0]["text"]
        assert text.startswith(code + ": ") and expected in text and "\n" not in text, (call, text)
        assert answer["isError"] is True and answer["details"]["error"]["code"] == code, (call, answer)
        assert_clean(f"plan({call!r:.60})", text.encode())


def test_the_start_ticks_of_a_stat_line_and_the_presence_file(tmp_path: Path) -> None:
    """Field 22 of /proc/PID/stat, counted after the last ``)`` (a process name may hold spaces
    and parentheses); the presence file of this process, and a stale one swept away."""
    fields = " ".join(str(n) for n in range(3, 40))  # field n holds n
    ledger = tmp_path / "ledger"
    (ledger / "presence").mkdir(parents=True)
    stale = ledger / "presence" / "999999999.json"
    stale.write_text(json.dumps({"v": 1, "pid": 999999999, "startTicks": 1}))
    garbage = ledger / "presence" / "notes.txt"
    garbage.write_text("x")
    answers = _extension(
        tmp_path,
        [
            ["startTicksOf", f"123 (pi) {fields}"],
            ["startTicksOf", f"123 (a b) c) (d) {fields}"],
            ["startTicksOf", "123 (pi"],
            ["startTicksOf", "123 (pi) S 4 5"],
            ["writePresence", str(ledger), os.getpid()],
            ["writePresence", None],
        ],
    )
    assert answers[:4] == [22, 22, None, None]
    written = Path(str(answers[4]))
    assert written == ledger / "presence" / f"{os.getpid()}.json"
    record = json.loads(written.read_text())
    with open(f"/proc/{os.getpid()}/stat") as fh:
        ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    assert record == {"v": 1, "pid": os.getpid(), "startTicks": ticks}
    assert written.stat().st_mode & 0o777 == 0o600
    assert (ledger / "presence").stat().st_mode & 0o777 == 0o700
    assert not stale.exists() and garbage.exists()  # a dead pid's file goes; what is not one stays
    assert answers[5] is None


# ---------------------------------------------------------------------------- a real pi


@pytest.fixture
def face(pi_home: Path, pi_bin: str, tmp_path: Path) -> Iterator[Face]:
    pi = Face(pi_bin, tmp_path / "parent.jsonl", tmp_path)
    yield pi
    pi.close()


def _needs(*command: str, option: str = "") -> None:
    """Skip until the CLI the tool maps onto exists (the other helpers' commands)."""
    proc = pisub_cli(*command, "--help")
    if proc.returncode != 0 or option not in proc.stdout:
        pytest.skip(f"`pisub {' '.join(command)} {option}` is not built here yet")


def _schedule_notices(server: FakeModelServer, name: str) -> list[dict[str, Any]]:
    """The model requests whose last message is a notice of schedule ``name``'s fire."""
    found = []
    for request in list(server.requests):
        messages = request.get("messages") or []
        last = json.dumps(messages[-1]) if messages else ""
        if f"pisub: schedule {name} fired run" in last:
            found.append(request)
    return found


def _notice_messages(face: Face, run_id: str) -> list[dict[str, Any]]:
    return [
        m for m in _session_messages(face, "pisub-notice") if (m.get("details") or {}).get("runId") == run_id
    ]


def _tick() -> list[Any]:
    """One tick, as a timer gives it; nothing (so that ``_tick() or ...`` polls)."""
    proc = pisub_cli("schedule", "tick", "--from", "manual", "--json")
    assert proc.returncode == 0, proc.stderr
    return []


def _runs_of(schedule: str) -> list[dict[str, Any]]:
    """The fires of ``schedule`` that started a run, newest first."""
    fires: list[dict[str, Any]] = json.loads(pisub_cli("schedule", "history", schedule, "--json").stdout)
    return [f for f in fires if f.get("runId")]


def _due(schedule: str) -> bool:
    record = json.loads(pisub_cli("schedule", "show", schedule, "--json").stdout)
    return datetime.fromisoformat(record["nextRunAt"]) <= datetime.now(UTC)


def _fired(face: Face, arguments: dict[str, Any]) -> str:
    """schedule.run through the tool: the run id it fired."""
    end = face.result(arguments)
    fired = _details(end).get("fired") or {}
    assert isinstance(fired.get("runId"), str), (_text(end), _details(end))
    return str(fired["runId"])


def _presence(home: Path) -> list[Path]:
    return sorted(home.glob("notices/*/presence/*.json"))


@pytest.mark.pi
def test_a_schedule_is_created_listed_fired_noticed_paused_resumed_and_deleted(
    face: Face, model_server: FakeModelServer, tmp_path: Path
) -> None:
    _needs("schedule", "create")
    (tmp_path / "review.js").write_text(
        'return runs.run("main", { agent: "pi", task: "scheduled review" })\n'
    )
    created = face.result(
        {
            "action": "schedule.create",
            "id": "backlog",
            "name": "backlog-sweep",
            "every": "6h",
            "workflowScriptPath": "review.js",
        }
    )
    assert not created.get("result", {}).get("isError"), _text(created)
    assert "backlog" in _text(created) and "every 6h" in _text(created), _text(created)
    listed = face.result({"action": "schedule.list"})
    assert "backlog" in _text(listed) and "every 6h" in _text(listed), _text(listed)
    assert [s["id"] for s in _details(listed)["items"]] == ["backlog"]
    shown = _text(face.result({"action": "schedule.show", "id": "backlog"}))
    assert shown.startswith("schedule backlog") and "backlog-sweep" in shown, shown

    run_id = _fired(face, {"action": "schedule.run", "id": "backlog"})
    assert pisub.Run(run_id).wait(timeout=120).state == "complete"
    notices = wait_for(
        lambda: _schedule_notices(model_server, "backlog-sweep"), timeout=60, what="the schedule's notice"
    )
    assert len(notices) == 1 and run_id in json.dumps(notices[0]["messages"][-1])  # it started a turn
    history = face.result({"action": "schedule.history", "id": "backlog"})
    assert run_id in _text(history), _text(history)

    assert "paused" in _text(face.result({"action": "schedule.pause", "id": "backlog"})).lower()
    paused = _details(face.result({"action": "schedule.list"}))["items"][0]
    assert paused.get("paused") is True or paused.get("state") == "paused", paused
    face.result({"action": "schedule.resume", "id": "backlog"})
    resumed = _details(face.result({"action": "schedule.list"}))["items"][0]
    assert resumed.get("paused") is not True and resumed.get("state") != "paused", resumed
    deleted = face.result({"action": "schedule.delete", "id": "backlog"})
    assert not deleted.get("result", {}).get("isError"), _text(deleted)
    assert _details(face.result({"action": "schedule.list"}))["items"] == []
    gone = _text(face.result({"action": "schedule.show", "id": "backlog"}))
    assert gone.startswith("SCHEDULE_NOT_FOUND: "), gone


@pytest.mark.pi
def test_a_one_shot_schedule_fires_from_the_tick_and_its_notice_reaches_the_session(
    face: Face, model_server: FakeModelServer, tmp_path: Path
) -> None:
    _needs("schedule", "tick")
    created = face.result(
        {
            "action": "schedule.create",
            "id": "soon",
            "at": "+1s",
            "workflowScript": 'return runs.run("main", { agent: "pi", task: "one shot" })',
        }
    )
    assert not created.get("result", {}).get("isError"), _text(created)
    # the slot is due one second after its creation: nothing but the ticks (a timer's) fires it
    fires = wait_for(lambda: _tick() or _runs_of("soon"), timeout=30, interval=0.5, what="the fire")
    run_id = fires[0]["runId"]
    assert pisub.Run(run_id).wait(timeout=120).state == "complete"
    wait_for(lambda: _schedule_notices(model_server, "soon"), timeout=60, what="the one-shot's notice")


@pytest.mark.pi
def test_a_quiet_fire_is_shown_without_a_turn_and_a_failed_one_starts_a_turn(
    face: Face, model_server: FakeModelServer, tmp_path: Path
) -> None:
    _needs("schedule", "run")
    good = 'return runs.run("main", { agent: "pi", task: "quiet work" })'
    face.result(
        {"action": "schedule.create", "id": "hush", "every": "1d", "quiet": True, "workflowScript": good}
    )
    shown = face.result({"action": "schedule.show", "id": "hush"})
    assert "quiet" in _text(shown), _text(shown)
    ends = face.ends()
    run_id = _fired(face, {"action": "schedule.run", "id": "hush", "quiet": True})
    assert pisub.Run(run_id).wait(timeout=120).state == "complete"
    message = wait_for(lambda: _notice_messages(face, run_id), timeout=60, what="the quiet notice")[0]
    assert "pisub: schedule hush fired run" in json.dumps(message) and message["details"]["quiet"] is True
    time.sleep(2)  # a turn the notice would start begins at once; none may
    assert face.ends() == ends + 1 and face.idle()  # only the schedule.run call's own turn
    assert not _schedule_notices(model_server, "hush")  # never sent to the model as the last message

    bad = 'throw new Error("the scheduled work failed")'
    face.result(
        {"action": "schedule.create", "id": "loud", "every": "1d", "quiet": True, "workflowScript": bad}
    )
    failed = _fired(face, {"action": "schedule.run", "id": "loud", "quiet": True})
    assert pisub.Run(failed).wait(timeout=120).state == "failed"
    notices = wait_for(
        lambda: _schedule_notices(model_server, "loud"), timeout=60, what="the failed fire's turn"
    )
    assert len(notices) == 1 and "ended failed" in json.dumps(notices[0]["messages"][-1])


@pytest.mark.pi
def test_presence_binds_a_session_only_schedule_to_its_open_session(
    pi_home: Path, pi_bin: str, tmp_path: Path, model_server: FakeModelServer
) -> None:
    _needs("schedule", "tick")
    session = tmp_path / "owner.jsonl"
    owner = Face(pi_bin, session, tmp_path)
    try:
        owner.call({"action": "schedule.list"})
        files = wait_for(lambda: _presence(pi_home), timeout=30, what="the presence file")
        record = json.loads(files[0].read_text())
        assert record["pid"] == owner.proc.pid and record["v"] == 1 and isinstance(record["startTicks"], int)
        assert files[0].stat().st_mode & 0o777 == 0o600
        job = 'return runs.run("main", { agent: "pi", task: "bound to its session" })'
        made = owner.result(
            {
                "action": "schedule.create",
                "id": "mine",
                "every": "1d",
                "sessionOnly": True,
                "workflowScript": job,
            }
        )
        assert not made.get("result", {}).get("isError"), _text(made)
        assert "session-only" in _text(made), _text(made)
    finally:
        owner.close()
    assert _presence(pi_home) == []  # removed on session_shutdown
    # with its session closed, a due slot of a sessionOnly schedule does not fire (it stays due)
    key = files[0].parent.parent.name  # <home>/notices/<session key>/presence/<pid>.json
    job = 'return runs.run("main", { agent: "pi", task: "later" })'
    proc = pisub_cli(
        *("schedule", "create", "--id", "later", "--at", "+1s", "--session-only", "--session-key", key),
        *("--workflow-script", job, "--json"),
    )
    assert proc.returncode == 0, proc.stderr
    wait_for(lambda: _due("later"), timeout=30, interval=0.2, what="the slot to be due")
    _tick()
    assert _runs_of("later") == []
    again = Face(pi_bin, session, tmp_path)  # the session is back: the slot fires on the next tick
    try:
        again.call({"action": "schedule.list"})
        wait_for(lambda: _presence(pi_home), timeout=30, what="the presence file")
        _tick()
        fired = wait_for(lambda: _runs_of("later"), timeout=30, what="the fire once the session is back")
        assert pisub.Run(fired[0]["runId"]).wait(timeout=120).state == "complete"
    finally:
        again.close()


@pytest.mark.pi
def test_the_stop_picker_lists_active_schedules_and_pauses_the_one_picked(face: Face, tmp_path: Path) -> None:
    _needs("schedule", "pause")
    face.result({"action": "schedule.create", "id": "picker", "every": "1d", "workflowScript": JS})
    mark = len(face.events)
    face.prompt("/subagents-stop")
    picker = face.ui("select", mark)
    options = [o for o in picker["options"] if o.startswith("[schedule] picker")]
    assert options and options[0].endswith("(pauses it)"), picker
    face.send({"type": "extension_ui_response", "id": picker["id"], "value": options[0]})
    sure = face.ui("confirm", mark)
    assert "Pause schedule picker" in json.dumps(sure), sure
    face.send({"type": "extension_ui_response", "id": sure["id"], "confirmed": True})
    assert face.notified(mark).startswith("paused schedule picker"), face.events[mark:]
    record = json.loads(pisub_cli("schedule", "show", "picker", "--json").stdout)
    assert record.get("paused") is True or record.get("state") == "paused", record
    assert face.command("/subagents-stop").startswith("no run started from this session is running")


@pytest.mark.pi
def test_a_mission_from_create_to_close(face: Face, tmp_path: Path) -> None:
    _needs("mission", "create")
    created = face.result(
        {"action": "mission.create", "mission": {"title": "Ship auth refresh", "objective": "Refresh tokens"}}
    )
    mission = _details(created).get("missionId")
    assert isinstance(mission, str) and mission in _text(created), _text(created)
    assert "planned" in _text(created), _text(created)
    assert mission in _text(face.result({"action": "mission.list"}))
    updated = face.result(
        {
            "action": "mission.update",
            "missionId": mission,
            "missionUpdate": {"decisions": [{"title": "Ship on Friday?"}]},
        }
    )
    assert "Ship on Friday?" in _text(updated), _text(updated)
    decision = _details(face.result({"action": "mission.show", "missionId": mission}))["items"][0][
        "decisions"
    ][0]
    shown = _text(face.result({"action": "mission.show", "missionId": mission}))
    assert "open" in shown and decision["id"] in shown, shown
    resolved = face.result(
        {"action": "mission.resolve-decision", "missionId": mission, "id": decision["id"], "summary": "yes"}
    )
    assert "resolved" in _text(resolved), _text(resolved)
    run_id = json.loads(pisub_cli("run", "--agent", "pi", "--json", "a linked run").stdout)["runId"]
    attached = face.result({"action": "mission.attach-run", "missionId": mission, "runId": run_id})
    assert run_id in _text(attached), _text(attached)
    closed = face.result({"action": "mission.close", "missionId": mission, "summary": "shipped"})
    assert "completed" in _text(closed), _text(closed)
    bad = _text(
        face.result({"action": "mission.update", "missionId": mission, "missionUpdate": {"bogus": 1}})
    )
    assert bad.startswith("INVALID_INPUT: ") and "bogus" in bad, bad  # pisub's strict check, with the field
    missing = _text(face.result({"action": "mission.show", "missionId": "0123456789ab"}))
    assert missing.startswith("MISSION_NOT_FOUND: "), missing


@pytest.mark.pi
def test_workflows_share_a_missions_state_and_mission_false_has_none(face: Face, tmp_path: Path) -> None:
    _needs("run", option="--mission-id")
    mission = _details(face.result({"action": "mission.create", "mission": {"title": "Shared state"}}))[
        "missionId"
    ]
    first = _started(
        face.call({"workflowScript": 'await state.set("n", 41); return "set"', "missionId": mission})
    )
    assert pisub.Run(first).wait(timeout=120).state == "complete"
    second = _started(
        face.call({"workflowScript": 'return String((await state.get("n")) + 1)', "missionId": mission})
    )
    result = pisub.Run(second).wait(timeout=120)
    assert result.state == "complete" and "42" in result.content[0].text, result
    runs = {
        r["runId"]
        for r in _details(face.result({"action": "mission.show", "missionId": mission}))["items"][0]["runs"]
    }
    assert {first, second} <= runs
    ephemeral = _started(
        face.call(
            {
                "workflowScript": 'return String(typeof state === "undefined" || state === null)',
                "mission": False,
            }
        )
    )
    out = pisub.Run(ephemeral).wait(timeout=120)
    assert out.state == "complete" and "true" in out.content[0].text, out


@pytest.mark.pi
def test_a_goal_missions_continuation_notice_comes_once_and_not_again_without_progress(
    face: Face, model_server: FakeModelServer
) -> None:
    _needs("mission", "next")
    made = face.result(
        {
            "action": "mission.create",
            "mission": {"title": "Goal work", "goal": True, "budget": {"tokens": 100000}},
        }
    )
    mission = _details(made)["missionId"]
    face.result(
        {
            "action": "mission.update",
            "missionId": mission,
            "missionUpdate": {"decisions": [{"title": "Pick a path"}]},
        }
    )
    notices = wait_for(lambda: _session_messages(face, "pisub-mission"), timeout=60, what="the goal notice")
    assert notices[0]["details"]["missionId"] == mission and len(str(notices[0]["content"])) <= 500
    wait_for(face.idle, timeout=60, what="the turn the notice started to end")
    face.call({"action": "mission.list"})  # another idle turn, nothing moved
    time.sleep(3)  # a second notice would come at once after the turn; none may
    assert len(_session_messages(face, "pisub-mission")) == 1


@pytest.mark.pi
def test_each_refusal_rule_through_the_real_tool(face: Face) -> None:
    """A few of the rules the Node test covers, as a model meets them: one line, nothing runs."""
    for call, _context, code, expected in REFUSED[:12]:
        text = face.call(call)
        assert text.startswith(code + ": ") and expected in text, (call, text)
    assert not list(Path(os.environ["PISUB_HOME"]).glob("schedules/*/schedule.json"))
