"""Seed conformance (issue 25): every tool-call example of the seed's tool reference
(``shared/seeds/001``, "工具参考") sent as written, placeholders (``<run-id>``) replaced by real
runs. None fails the tool's validation; each has the effect the seed documents, or pisub's
stable answer where it does not build the feature (``NOT_AVAILABLE_YET`` for schedules and
missions; ``UNSUPPORTED_HERE`` for Herdr panes). The JavaScript workflow examples run in
tests/integration/test_seed_js_examples.py and test_pi_workflows_js.py; here, what they map to.
First the extension's ``plan`` in pi's Node (every example and hostile values, fast), then the
same calls through the real tool in a real pi against the scripted model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pisub_cli, wait_for
from tests.integration.test_pi_subagent_tool import ParentPi, _notices, _started
from tests.integration.test_seed_agents_cli import SEED_CREATE_CONFIG
from tests.integration.test_terminal_output import _extension, assert_clean
from tests.integration.test_worktree_runs import _two_writers, git, plant_merge, repo  # noqa: F401


def details(parent: ParentPi) -> dict[str, Any]:
    """The ``details`` of the tool's last result (the structure; the text is for reading)."""
    ends = [e for e in list(parent.events) if e.get("type") == "tool_execution_end"]
    found: dict[str, Any] = (ends[-1].get("result") or {}).get("details") or {}
    return found


def ask(parent: ParentPi, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """One tool call: its text and its details."""
    text = parent.call(arguments)
    return text, details(parent)


def receipt_state(parent: ParentPi, arguments: dict[str, Any]) -> str:
    """The state of the receipt a control call answered with."""
    text, found = ask(parent, arguments)
    assert "receipt" in found, text
    return str(found["receipt"]["state"])


def item(parent: ParentPi, arguments: dict[str, Any]) -> Any:
    """The first JSON object pisub printed for the call."""
    text, found = ask(parent, arguments)
    assert found.get("items"), text
    return found["items"][0]


def names(parent: ParentPi, arguments: dict[str, Any]) -> set[str]:
    _text, found = ask(parent, arguments)
    return {a["name"] for a in found.get("items", [])}


RUN = "0123abcd-0000-4000-8000-000000000001"
NESTED = "0123abcd-0000-4000-8000-000000000002"
SHA = "a" * 40
AT = "2026-08-27T16:23:00.000Z"
GATE = 'gate: "npm test" })'
JS_ONE = 'return runs.run("main", { agent: "scout", task: "Analyze the auth flow" })'

# What the seed defers and pisub does not build (calendar schedules: ``on``, ``timezone``, ``cron``):
# NOT_AVAILABLE_YET, never "unknown parameter".
JS_EXAMPLES: list[dict[str, Any]] = [
    {
        "action": "schedule.create",
        "every": "6h",
        "workflowScriptPath": "workflows/review.js",
        "timezone": "UTC",
    },
    {"action": "schedule.create", "on": "monday", "workflowScriptPath": "workflows/review.js"},
]
# The seed's JavaScript workflow examples (their scripts shortened) and the argv each becomes; an
# inline script goes to pisub on stdin (``--workflow-script=-``), never in the argv.
JS_MAPPED: list[tuple[dict[str, Any], list[str]]] = [
    (
        {"action": "schedule.create", "every": "6h", "workflowScriptPath": "workflows/review.js"},
        ["schedule", "create", "--json", "--workflow=workflows/review.js", "--every=6h"],
    ),
    ({"action": "mission.list"}, ["mission", "list", "--json"]),
    ({"workflowScript": JS_ONE}, ["run", "--json", "--workflow-script=-"]),
    (
        {"workflowScript": 'return runs.run("impl", { agent: "worker", task: "Implement the fix", ' + GATE},
        ["run", "--json", "--workflow-script=-"],
    ),
    (
        {"workflowScript": 'return runs.run("main", { agent: "scout", task: "..." })', "share": True},
        ["run", "--json", "--workflow-script=-"],
    ),
    (
        {"workflowScriptPath": "workflows/review.js", "cwd": "/path/to/project"},
        ["run", "--json", "--cwd=/path/to/project", "--workflow=/path/to/project/workflows/review.js"],
    ),
    (
        {"action": "validate", "workflowScriptPath": "workflows/review.js"},
        ["workflow", "validate", "--json", "--", "workflows/review.js"],
    ),
    (
        {"action": "validate", "workflowScript": JS_ONE},
        ["workflow", "validate", "--json", "--workflow-script=-"],
    ),
    (
        {"workflow": "review", "args": {"task": "Review the auth flow"}},
        ["run", "--json", "--resource=review", '--args={"task":"Review the auth flow"}'],
    ),
    (
        {"workflow": "run-ci", "args": {"command": "npm test"}},
        ["run", "--json", "--resource=run-ci", '--args={"command":"npm test"}'],
    ),
]
HERDR: list[dict[str, Any]] = [
    {"action": "project.open", "cwd": "/path/to/repo", "message": "Start in this project."},
    {"action": "project.status", "cwd": "/path/to/repo"},
    {"action": "project.close", "cwd": "/path/to/repo"},
    {"action": "inspector.open", "focus": True},
    {"agent": "scout", "task": "x", "machine": "gpu-box"},
]
MERGE = {
    "prNumber": 123,
    "reviewedHead": SHA,
    "mergeCommit": "b" * 40,
    "treeEquivalent": True,
    "postMergeChecks": "recorded",
    "attestedBy": "operator",
    "attestedAt": AT,
}
SUPERSESSION = {"supersededBy": NESTED, "attestedBy": "operator", "attestedAt": AT}
HANDOFF = "/path/to/handoff.json"

# (call, the argv it becomes after `pisub`).
MAPPED: list[tuple[dict[str, Any], list[str]]] = [
    ({"action": "guide", "topic": "tool-reference"}, ["guide", "--", "tool-reference"]),
    ({"action": "list"}, ["agents", "list", "--json"]),
    ({"action": "list", "agentScope": "project"}, ["agents", "list", "--json", "--scope=project"]),
    ({"action": "list", "capabilities": True}, ["agents", "list", "--json", "--capabilities"]),
    ({"action": "get", "agent": "scout"}, ["agents", "show", "--json", "--", "scout"]),
    ({"action": "models"}, ["models", "--json"]),
    ({"action": "models", "agent": "reviewer"}, ["models", "--json", "--agent=reviewer"]),
    (
        {"action": "get", "agent": "code-analysis.scout"},
        ["agents", "show", "--json", "--", "code-analysis.scout"],
    ),
    (
        {"action": "update", "agent": "code-analysis.scout", "config": {"model": "openai/gpt-4o"}},
        ["agents", "update", '--config={"model":"openai/gpt-4o"}', "--", "code-analysis.scout"],
    ),
    ({"action": "delete", "agent": "scout"}, ["agents", "delete", "--", "scout"]),
    ({"action": "eject", "agent": "reviewer"}, ["agents", "eject", "--", "reviewer"]),
    (
        {"action": "eject", "agent": "reviewer", "agentScope": "project"},
        ["agents", "eject", "--scope=project", "--", "reviewer"],
    ),
    ({"action": "disable", "agent": "reviewer"}, ["agents", "disable", "--", "reviewer"]),
    (
        {"action": "enable", "agent": "reviewer", "agentScope": "project"},
        ["agents", "enable", "--scope=project", "--", "reviewer"],
    ),
    ({"action": "reset", "agent": "reviewer"}, ["agents", "reset", "--", "reviewer"]),
    ({"action": "refine.show", "agent": "scout"}, ["agents", "refine", "--json", "--show", "--", "scout"]),
    (
        {"action": "refine.rollback", "agent": "scout"},
        ["agents", "refine", "--json", "--rollback", "--", "scout"],
    ),
    (
        {"action": "refine", "agent": "scout", "config": {"thinking": "high"}},
        ["agents", "refine", "--json", '--config={"thinking":"high"}', "--", "scout"],
    ),
    ({"action": "children.list"}, ["children", "list", "--json"]),
    ({"action": "status"}, ["list", "--json"]),
    ({"action": "status", "view": "fleet"}, ["fleet", "--json"]),
    ({"action": "status", "id": RUN}, ["status", "--json", "--", RUN]),
    (
        {"action": "status", "id": RUN, "view": "transcript", "index": 0, "lines": 80},
        ["status", "--json", "--child=0", "--view=transcript", "--lines=80", "--", RUN],
    ),
    ({"action": "status", "id": NESTED}, ["status", "--json", "--", NESTED]),
    ({"action": "interrupt", "id": RUN}, ["interrupt", "--json", "--wait=3", "--", RUN]),
    ({"action": "stop", "id": RUN}, ["stop", "--json", "--wait=3", "--", RUN]),
    ({"action": "stop", "id": RUN, "childId": "k1"}, ["stop", "--json", "--wait=3", "--child=k1", "--", RUN]),
    (
        {"action": "resume", "id": RUN, "message": "follow-up question after it pauses or finishes"},
        ["resume", "--json", "--", RUN, "follow-up question after it pauses or finishes"],
    ),
    (
        {"action": "resume", "id": RUN, "index": 1, "message": "follow-up for child 2"},
        ["resume", "--json", "--child=1", "--", RUN, "follow-up for child 2"],
    ),
    (
        {"action": "steer", "id": RUN, "message": "guidance for the running child"},
        ["steer", "--json", "--wait=3", "--", RUN, "guidance for the running child"],
    ),
    (
        {"action": "steer", "id": RUN, "mode": "follow_up", "message": "check this after the current turn"},
        ["steer", "--json", "--wait=3", "--mode=follow_up", "--", RUN, "check this after the current turn"],
    ),
    (
        {"action": "steer", "id": RUN, "index": 1, "mode": "auto", "message": "guidance for child 2"},
        ["steer", "--json", "--wait=3", "--child=1", "--mode=auto", "--", RUN, "guidance for child 2"],
    ),
    (
        {"action": "steer", "id": RUN, "message": "m", "steeringRecovery": False},
        ["steer", "--json", "--wait=3", "--no-recover", "--", RUN, "m"],
    ),
    ({"action": "doctor"}, ["doctor"]),
    (
        {"action": "lane.status", "laneId": RUN, "handoffPath": HANDOFF},
        ["lane", "status", "--json", f"--handoff={HANDOFF}", "--", RUN],
    ),
    (
        {"action": "lane.recordMerge", "laneId": RUN, "handoffPath": HANDOFF, "merge": MERGE},
        [
            "lane",
            "record-merge",
            "--json",
            f"--handoff={HANDOFF}",
            "--pr=123",
            f"--reviewed-head={SHA}",
            f"--merge-commit={'b' * 40}",
            "--tree-equivalent",
            "--post-merge-checks=recorded",
            "--by=operator",
            f"--at={AT}",
            "--",
            RUN,
        ],
    ),
    (
        {
            "action": "lane.recordSupersession",
            "laneId": RUN,
            "handoffPath": HANDOFF,
            "supersession": SUPERSESSION,
        },
        [
            "lane",
            "record-supersession",
            "--json",
            f"--handoff={HANDOFF}",
            f"--by-lane={NESTED}",
            "--by=operator",
            f"--at={AT}",
            "--",
            RUN,
        ],
    ),
    ({"action": "worktree.cleanup", "repo": "/r"}, ["worktree", "cleanup", "--json", "--plan", "--repo=/r"]),
    (
        {"action": "worktree.cleanup", "mode": "plan", "laneId": RUN},
        ["worktree", "cleanup", "--json", "--plan", f"--lane={RUN}"],
    ),
    ({"action": "worktree.discard", "id": RUN}, ["worktree", "discard", "--force", "--", RUN]),
    (
        {"agent": "worker", "task": "Implement the fix", "acceptance": {"level": "verified"}},
        ["run", "--json", "--agent=worker", '--acceptance={"level":"verified"}', "--", "Implement the fix"],
    ),
    # the parameter table, each parameter on a single agent's run
    (
        {"agent": "a", "task": "t", "maxRuntimeMs": 90000},
        ["run", "--json", "--timeout=90", "--agent=a", "--", "t"],
    ),
    (
        {"agent": "a", "task": "t", "timeoutMs": 90000, "maxRuntimeMs": 90000},
        ["run", "--json", "--timeout=90", "--agent=a", "--", "t"],
    ),
    (
        {"agent": "a", "task": "t", "isolation": "worktree", "baseRef": "refs/heads/release"},
        ["run", "--json", "--isolation=worktree", "--base-ref=refs/heads/release", "--agent=a", "--", "t"],
    ),
    (
        {"agent": "a", "task": "t", "worktree": True, "baseRef": "origin/main"},
        ["run", "--json", "--isolation=worktree", "--base-ref=origin/main", "--agent=a", "--", "t"],
    ),
    ({"agent": "a", "task": "t", "isolation": "none"}, ["run", "--json", "--agent=a", "--", "t"]),
    (
        {"agent": "a", "task": "t", "checkpointBeforeDeadlineMs": 30000},
        ["run", "--json", "--agent=a", "--checkpoint-before-deadline=30", "--", "t"],
    ),
    (
        {"agent": "a", "task": "t", "maxOutput": {"bytes": 200000, "lines": 5000}},
        ["run", "--json", "--max-output-bytes=200000", "--max-output-lines=5000", "--agent=a", "--", "t"],
    ),
    (
        {"agent": "a", "task": "t", "artifacts": False, "includeProgress": True, "sessionDir": "/s"},
        ["run", "--json", "--no-artifacts", "--include-progress", "--session-dir=/s", "--agent=a", "--", "t"],
    ),
    (
        {"agent": "a", "task": "t", "context": "fork"},
        ["run", "--json", "--context=fork", "--parent-session=/parent.jsonl", "--agent=a", "--", "t"],
    ),
    (
        {"agent": "a", "task": "t", "context": "fork", "forkFrom": RUN},
        ["run", "--json", "--context=fork", f"--fork-from={RUN}", "--agent=a", "--", "t"],
    ),
    (
        {"agent": "a", "task": "t", "context": "fresh"},
        ["run", "--json", "--context=fresh", "--agent=a", "--", "t"],
    ),
    (
        {
            "agent": "a",
            "task": "t",
            "share": True,
            "mission": False,
            "thinking": "high",
            "chatProgress": "off",
        },
        ["run", "--json", "--agent=a", "--", "t"],
    ),
    (
        {"agent": "a", "task": "t", "async": False, "chatProgress": "live-card"},
        ["run", "--json", "--agent=a", "--", "t"],
    ),
    (
        {"workflowScriptPath": "wf.py", "cwd": "/p", "args": {"n": 2}},
        ["run", "--json", "--cwd=/p", "--workflow=/p/wf.py", '--args={"n":2}'],
    ),
]

# Hostile or contradictory values: INVALID_INPUT naming the field (escaped, one line).
REFUSED: list[tuple[dict[str, Any], str]] = [
    (
        {"agent": "a", "task": "t", "timeoutMs": 1000, "maxRuntimeMs": 2000},
        "timeoutMs 1000 and maxRuntimeMs 2000",
    ),
    ({"agent": "a", "task": "t", "maxRuntimeMs": -5}, "maxRuntimeMs: expected a positive"),
    ({"agent": "a", "task": "t", "maxRuntimeMs": "60000"}, "maxRuntimeMs: expected a number"),
    ({"agent": "a", "task": "t", "isolation": "worktree", "baseRef": "HEAD~1"}, "revision expression"),
    ({"agent": "a", "task": "t", "isolation": "worktree", "baseRef": "main^"}, "revision expression"),
    ({"agent": "a", "task": "t", "isolation": "worktree", "baseRef": "a..b"}, "revision expression"),
    ({"agent": "a", "task": "t", "isolation": "worktree", "baseRef": "HEAD@{1}"}, "revision expression"),
    ({"agent": "a", "task": "t", "isolation": "worktree", "baseRef": SHA}, "a commit id"),
    ({"agent": "a", "task": "t", "isolation": "worktree", "baseRef": "c" * 64}, "a commit id"),
    ({"agent": "a", "task": "t", "isolation": "worktree", "baseRef": "--upload-pack=x"}, "not a valid ref"),
    ({"agent": "a", "task": "t", "isolation": "worktree", "baseRef": "x\x1b[2J"}, "revision expression"),
    ({"agent": "a", "task": "t", "baseRef": "main"}, 'give it with isolation: "worktree"'),
    ({"agent": "a", "task": "t", "isolation": "none", "worktree": True}, "contradicts isolation"),
    (
        {"agent": "a", "task": "t", "isolation": "sandbox"},
        'isolation: "sandbox" is not one of none, worktree',
    ),
    ({"agent": "a", "task": "t", "context": "forked"}, "context:"),
    ({"agent": "a", "task": "t", "context": "fork", "forkFrom": "--help"}, "forkFrom"),
    ({"agent": "a", "task": "t", "maxOutput": {"bytes": 0}}, "maxOutput.bytes"),
    ({"agent": "a", "task": "t", "maxOutput": {"bytes": 1.5}}, "maxOutput.bytes"),
    ({"agent": "a", "task": "t", "maxOutput": {"chars": 5}}, 'maxOutput."chars": unknown field'),
    ({"agent": "a", "task": "t", "maxOutput": {"lines": "5000"}}, "maxOutput.lines: expected a number"),
    ({"agent": "a", "task": "t", "maxOutput": [1]}, "maxOutput: expected a object, got array"),
    ({"agent": "a", "task": "t", "artifacts": "false"}, "artifacts: expected a boolean"),
    ({"agent": "a", "task": "t", "sessionDir": "/s\x00x"}, "sessionDir: contains a NUL"),
    ({"agent": "a", "task": "t", "gate": "true", "acceptance": {"level": "none"}}, "gate or acceptance"),
    ({"agent": "a", "task": "t", "chatProgress": "live-card"}, "needs async: false"),
    ({"workflowScriptPath": "wf.py", "checkpointBeforeDeadlineMs": 5}, "single agent's run"),
    ({"workflowScript": "x", "workflowScriptPath": "wf.py"}, "mutually exclusive"),
    ({"workflowScript": " \n "}, "a non-empty workflowScript or workflowScriptPath"),
    ({"workflowScriptPath": ""}, "a non-empty workflowScript or workflowScriptPath"),
    ({"workflowScriptPath": "workflows/review.ts"}, "is TypeScript"),
    ({"action": "validate", "path": "w.mts"}, "is TypeScript"),
    ({"action": "validate", "workflowScript": ""}, "validate requires a non-empty workflowScript"),
    ({"action": "validate", "workflowScript": "x", "agent": "a"}, "does not accept direct agent"),
    ({"action": "validate", "path": "a.js", "workflowScriptPath": "b.js"}, "different files"),
    ({"action": "status", "id": RUN, "workflowScript": "x"}, "Workflow execution must omit action"),
    ({"agent": "a", "task": "t", "workflowScript": "x"}, "cannot be combined with workflow"),
    ({"workflow": "run-ci", "task": "t"}, "cannot be combined with workflow"),
    ({"workflow": "review", "workflowScriptPath": "w.js"}, "workflow is mutually exclusive"),
    ({"workflow": "  "}, "workflow must be a non-empty named workflow resource"),
    ({"workflow": "--help"}, "workflow (a resource's name)"),
    ({"action": "validate", "workflow": "review"}, "must omit action"),
    ({"args": {"task": "x"}}, "args requires a named workflow resource"),
    ({"workflowScript": "return 1", "lanes": "l.json"}, "not both"),
    ({"workflow": "run-ci\x1b[2J"}, "workflow (a resource's name)"),
    ({"workflow": "run-ci", "args": ["npm test"]}, "args: expected a object, got array"),
    ({"workflowScript": "return 1\x00"}, "workflowScript: contains a NUL"),
    ({"workflowScript": 42}, "workflowScript: expected a string"),
    ({"action": "status", "id": RUN, "childId": "k", "index": 1}, "name different children"),
    ({"action": "status", "view": "transcript"}, "needs id"),
    ({"action": "status", "id": RUN, "index": -1}, "index: expected a whole number"),
    ({"action": "status", "id": RUN, "index": 0.5}, "index: expected a whole number"),
    ({"action": "steer", "id": RUN, "message": "m", "mode": "apply"}, "mode: steer takes"),
    ({"action": "worktree.cleanup", "mode": "auto"}, "mode: worktree.cleanup takes"),
    ({"action": "worktree.cleanup", "planId": "p1"}, "planId is reserved"),
    ({"action": "lane.status"}, "needs laneId"),
    ({"action": "lane.status", "laneId": "--help"}, "laneId"),
    ({"action": "lane.recordMerge", "laneId": RUN}, "needs merge"),
    ({"action": "lane.recordMerge", "laneId": RUN, "merge": {**MERGE, "prNumber": 0}}, "merge.prNumber"),
    (
        {"action": "lane.recordMerge", "laneId": RUN, "merge": {**MERGE, "reviewedHead": "abc1234"}},
        "merge.reviewedHead",
    ),
    (
        {"action": "lane.recordMerge", "laneId": RUN, "merge": {**MERGE, "treeEquivalent": "yes"}},
        "merge.treeEquivalent",
    ),
    (
        {"action": "lane.recordMerge", "laneId": RUN, "merge": {**MERGE, "attestedAt": "yesterday"}},
        "merge.attestedAt",
    ),
    ({"action": "lane.recordMerge", "laneId": RUN, "merge": {**MERGE, "\x1b[31m": 1}}, "unknown field"),
    (
        {
            "action": "lane.recordMerge",
            "laneId": RUN,
            "merge": {k: v for k, v in MERGE.items() if k != "attestedBy"},
        },
        "merge.attestedBy: missing",
    ),
    (
        {
            "action": "lane.recordSupersession",
            "laneId": RUN,
            "supersession": {**SUPERSESSION, "supersededBy": "; rm"},
        },
        "supersession.supersededBy",
    ),
    ({"action": "status", "laneId": RUN}, "laneId is for action"),
    ({"action": "list", "repo": "/r"}, "repo is for action worktree.cleanup"),
    ({"action": "status", "focus": True}, "focus is for"),
    ({"action": "list", "agentScope": "everywhere"}, "agentScope:"),
    ({"action": "status", "\u202eevil": 1}, "unknown parameter"),
    ({"action": "status", "__proto__x": 1}, "unknown parameter"),
]


def test_every_seed_example_maps_onto_pisub_in_node(tmp_path: Path) -> None:
    forks = [call.get("context") == "fork" and "forkFrom" not in call for call, _ in MAPPED]
    calls: list[list[object]] = [
        ["plan", call, {"sessionFile": "/parent.jsonl"} if fork else {}]
        for (call, _), fork in zip(MAPPED, forks, strict=True)
    ]
    calls += [["plan", call, {}] for call, _ in JS_MAPPED]
    calls += [["plan", call, {}] for call in JS_EXAMPLES + HERDR]
    answers = _extension(tmp_path, calls)
    for (call, argv), answer in zip(MAPPED + JS_MAPPED, answers, strict=False):
        assert answer == argv, (call, answer)
    for call, answer in zip(JS_EXAMPLES + HERDR, answers[len(MAPPED) + len(JS_MAPPED) :], strict=True):
        assert isinstance(answer, dict), (call, answer)
        text = answer["content"][0]["text"]
        code = "UNSUPPORTED_HERE" if call in HERDR else "NOT_AVAILABLE_YET"
        assert text.startswith(code + ": ") and "\n" not in text, (call, text)
        assert answer["isError"] is True and answer["details"]["error"]["code"] == code


SEED_PARAMETERS: dict[str, Any] = {
    "agent": "a",
    "task": "t",
    "action": "status",
    "topic": "overview",
    "config": {},
    "context": "fresh",
    "model": "p/m",
    "missionId": "m1",
    "mission": False,
    "handoffPath": HANDOFF,
    "repo": "/r",
    "planId": "p",
    "mode": "plan",
    "laneId": RUN,
    "merge": MERGE,
    "supersession": SUPERSESSION,
    "focus": True,
    "view": "fleet",
    "lines": 80,
    "agentScope": "both",
    "capabilities": True,
    "async": True,
    "chatProgress": "auto",
    "isolation": "none",
    "baseRef": "HEAD",
    "timeoutMs": 1000,
    "maxRuntimeMs": 1000,
    "toolTimeoutMs": 1000,
    "checkpointBeforeDeadlineMs": 1000,
    "toolBudget": {"hard": 1},
    "usageBudget": {"tokens": {"hard": 1}},
    "cwd": "/p",
    "machine": "m",
    "maxOutput": {"bytes": 1},
    "artifacts": True,
    "includeProgress": True,
    "share": True,
    "sessionDir": "/s",
    "acceptance": "auto",
    "gate": "true",
    "workflowScript": JS_ONE,
    "workflowScriptPath": "w.py",
    "workflow": "review",
    "args": {"task": "x"},
    "every": "6h",
    "at": "+10m",
    "sessionOnly": True,
    "quiet": True,
    "id": RUN,
    "message": "m",
    "index": 0,
    "childId": "k",
    "output": "o.md",
    "outputMode": "file-only",
    "thinking": "high",
    "worktree": True,
    "agentContract": {"version": 1},
    "outputSchema": {},
    "steeringRecovery": False,
}  # every parameter name the seed's tool reference uses, with a value of its shape


def test_every_seed_parameter_name_is_in_the_schema(tmp_path: Path) -> None:
    """Alone (with what it needs to make sense), no seed parameter is an unknown parameter or of
    the wrong type: each is an argv or a stable answer."""
    calls: list[list[object]] = [["checkParams", {name: value}] for name, value in SEED_PARAMETERS.items()]
    for answer, name in zip(_extension(tmp_path, calls), SEED_PARAMETERS, strict=True):
        assert answer is None, (name, answer)


def test_hostile_and_contradictory_seed_values_are_refused_in_one_line(tmp_path: Path) -> None:
    answers = _extension(tmp_path, [["plan", call, {}] for call, _ in REFUSED])
    for (call, expected), answer in zip(REFUSED, answers, strict=True):
        assert isinstance(answer, dict), (call, answer)
        text = answer["content"][0]["text"]
        assert text.startswith("INVALID_INPUT: ") and expected in text and "\n" not in text, (call, text)
        assert_clean(f"plan({call!r:.60})", text.encode())


def test_a_fork_without_a_session_file_and_the_global_off_switch(tmp_path: Path) -> None:
    fork = _extension(tmp_path, [["plan", {"agent": "a", "task": "t", "context": "fork"}, {}]])[0]
    assert isinstance(fork, dict) and "needs this session persisted" in fork["content"][0]["text"]
    module = tmp_path / "off.mts"
    module.write_text(Path(pisub.api.pi_integration.extension_path()).read_text())
    script = (
        f"const m = await import({json.dumps(str(module))});"
        "process.stdout.write(JSON.stringify([{agent: 'a', task: 't'}, {action: 'resume', id: 'abcd1234'},"
        " {action: 'status'}].map((p) => m.plan(p))));"
    )
    from tests.integration.test_terminal_output import _node_of_pi

    node = [_node_of_pi(), "--experimental-transform-types", "--no-warnings", "--input-type=module"]
    env = {"PISUB_SUBAGENTS_DISABLED": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([*node, "-e", script], capture_output=True, timeout=60, env=env, check=True)
    start, resume, status = json.loads(proc.stdout)
    for refused in (start, resume):
        assert refused["details"]["error"]["code"] == "SUBAGENTS_DISABLED", refused
    assert status == ["list", "--json"]  # looking at runs is still allowed


@pytest.mark.pi
@pytest.mark.pi_versions
def test_the_seed_status_and_control_examples_through_the_real_tool(
    pi_home: Path, pi_bin: str, tmp_path: Path, model_server: FakeModelServer
) -> None:
    parent = ParentPi(pi_bin, tmp_path / "parent.jsonl", tmp_path)
    try:
        _status_and_control(parent, tmp_path)
    finally:
        parent.close()


def _status_and_control(parent: ParentPi, tmp_path: Path) -> None:
    done = json.loads(pisub_cli("run", "--agent", "pi", "--json", "finished work").stdout)["runId"]
    pisub.Run(done).wait(timeout=60)
    running = _started(parent.call({"agent": "pi", "task": "SLOW:400 a long one", "maxRuntimeMs": 120000}))
    wait_for(lambda: pisub.Run(running).status().state == "running", timeout=30)
    assert done in parent.call({"action": "status"})
    assert running in parent.call({"action": "status", "view": "fleet"})
    assert "complete" in parent.call({"action": "status", "id": done})
    tail = parent.call({"action": "status", "id": done, "view": "transcript", "index": 0, "lines": 80})
    assert "finished work" in tail, tail
    steered = receipt_state(
        parent, {"action": "steer", "id": running, "message": "guidance for the running child"}
    )
    assert steered in ("delivered", "queued"), steered
    later = receipt_state(
        parent,
        {
            "action": "steer",
            "id": running,
            "mode": "follow_up",
            "message": "check this after the current turn",
        },
    )
    assert later in ("delivered", "queued"), later
    assert receipt_state(parent, {"action": "interrupt", "id": running}) == "delivered"
    wait_for(lambda: pisub.Run(running).status().state == "paused", timeout=30)
    resumed = _started(
        parent.call(
            {"action": "resume", "id": running, "message": "follow-up question after it pauses or finishes"}
        )
    )
    assert receipt_state(parent, {"action": "stop", "id": resumed}) in ("delivered", "failed")
    assert pisub.Run(resumed).wait(timeout=60).state in ("stopped", "complete")
    workflow = _two_kids(parent, tmp_path)
    kid = pisub.Run(workflow).wait(timeout=10).details.results[1].run_id
    assert kid and "complete" in parent.call({"action": "status", "id": kid})  # a nested run by its id
    again = _started(
        parent.call({"action": "resume", "id": workflow, "index": 1, "message": "follow-up for child 2"})
    )
    assert pisub.Run(again).wait(timeout=60).state == "complete"
    finished = parent.call(
        {"action": "steer", "id": workflow, "index": 1, "mode": "auto", "message": "guidance for child 2"}
    )
    assert finished.startswith("failed") and "finished" in finished, finished
    assert parent.call({"action": "interrupt", "id": kid}).startswith("failed")  # ended: a receipt, no error
    assert "pi" in parent.call({"action": "doctor"})
    assert {c["key"] for c in item(parent, {"action": "children.list"})} >= {"one", "two"}
    for call in JS_EXAMPLES:
        assert parent.call(call).startswith("NOT_AVAILABLE_YET: "), call
    for call in HERDR:
        assert parent.call(call).startswith("UNSUPPORTED_HERE: "), call
    assert parent.proc.poll() is None


def _two_kids(parent: ParentPi, tmp_path: Path) -> str:
    script = tmp_path / "two.py"
    script.write_text(
        textwrap.dedent(
            """\
            async def main(runs, state, args):
                return await runs.all([
                    {"key": "one", "agent": "pi", "task": "first kid"},
                    {"key": "two", "agent": "pi", "task": "second kid"},
                ])
            """
        )
    )
    ok = parent.call({"action": "validate", "workflowScriptPath": "two.py", "cwd": str(tmp_path)})
    assert details(parent)["ok"] is True, ok
    workflow = _started(parent.call({"workflowScriptPath": "two.py", "cwd": str(tmp_path)}))
    assert pisub.Run(workflow).wait(timeout=90).state == "complete"
    return workflow


@pytest.mark.pi
def test_a_failing_validate_is_a_failed_tool_call(parent_pi: ParentPi, tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("async def main(runs, state, args):\n    runs.run('k', agent='pi', task='x')\n")
    answer = parent_pi.call({"action": "validate", "path": str(bad)})
    assert details(parent_pi)["ok"] is False and details(parent_pi)["errors"], answer
    ends = [e for e in parent_pi.events if e.get("type") == "tool_execution_end"]
    assert ends[-1].get("isError") is True or ends[-1].get("result", {}).get("isError") is True


@pytest.fixture
def parent_pi(pi_home: Path, pi_bin: str, tmp_path: Path) -> Any:
    pi = ParentPi(pi_bin, tmp_path / "parent.jsonl", tmp_path)
    yield pi
    pi.close()


@pytest.mark.pi
def test_the_seed_agent_management_examples_through_the_real_tool(parent_pi: ParentPi, pi_home: Path) -> None:
    call = parent_pi.call
    assert "pi" in names(parent_pi, {"action": "list"})
    assert "pi" not in names(parent_pi, {"action": "list", "agentScope": "project"})  # pi is a user agent
    assert item(parent_pi, {"action": "get", "agent": "scout"})["spec"]["name"] == "scout"
    assert "fake/fake-model" in call({"action": "models"})
    assert not call({"action": "models", "agent": "reviewer"}).startswith("INVALID_INPUT")
    made = call({"action": "create", "config": SEED_CREATE_CONFIG})  # the seed's example, verbatim
    assert made.startswith("created"), made
    shown = item(parent_pi, {"action": "get", "agent": "code-analysis.code-scout"})
    assert shown["spec"]["name"] == "code-analysis.code-scout", shown
    assert call(
        {"action": "update", "agent": "code-analysis.code-scout", "config": {"model": "openai/gpt-4o"}}
    ).startswith("updated")
    assert call({"action": "eject", "agent": "reviewer"}).startswith("ejected")
    assert call({"action": "disable", "agent": "reviewer"}).startswith("disabled")
    assert call({"action": "enable", "agent": "reviewer"}).startswith("enabled")
    assert call({"action": "reset", "agent": "reviewer"}).startswith("reset")
    assert call({"action": "delete", "agent": "code-analysis.code-scout"}).startswith("deleted")


@pytest.mark.pi
def test_the_seed_lane_examples_through_the_real_tool(
    repo: Path,  # noqa: F811
    pi_home: Path,
    pi_bin: str,
    tmp_path: Path,
) -> None:
    lane, children = _two_writers(repo, "a", "b")
    other, _ = _two_writers(repo, "c", "d")
    (head, *_), commit, _ = plant_merge(repo)
    handoff = str(pi_home / "runs" / lane.id / "handoff.json")
    parent = ParentPi(pi_bin, tmp_path / "parent.jsonl", repo)
    try:
        call = parent.call
        status = item(parent, {"action": "lane.status", "laneId": lane.id, "handoffPath": handoff})
        assert status["state"] == "terminal-blocked", status
        wrong = call(
            {"action": "lane.status", "laneId": lane.id, "handoffPath": str(tmp_path / "handoff.json")}
        )
        assert wrong.startswith("INVALID_INPUT") and "pisub keeps it at" in wrong, wrong
        merge = {**MERGE, "reviewedHead": head, "mergeCommit": commit}
        merged = item(
            parent, {"action": "lane.recordMerge", "laneId": lane.id, "handoffPath": handoff, "merge": merge}
        )
        assert merged["state"] == "terminal-eligible" and merged["merge"]["attestedAt"] == AT, merged
        plan = item(parent, {"action": "worktree.cleanup", "repo": str(repo)})["plan"]
        assert {e["runId"] for e in plan} >= set(children), plan
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        git(elsewhere, "init", "-q")
        assert item(parent, {"action": "worktree.cleanup", "repo": str(elsewhere)})["plan"] == []
        by_lane = item(parent, {"action": "worktree.cleanup", "laneId": lane.id, "handoffPath": handoff})[
            "plan"
        ]
        assert {e["runId"] for e in by_lane if e["decision"] == "remove"} == set(children), by_lane
        superseded = item(
            parent,
            {
                "action": "lane.recordSupersession",
                "laneId": other.id,
                "handoffPath": str(pi_home / "runs" / other.id / "handoff.json"),
                "supersession": {**SUPERSESSION, "supersededBy": lane.id},
            },
        )
        assert superseded["state"] == "superseded-eligible", superseded
    finally:
        parent.close()
    _hostile_lane_options(pi_home, lane.id, other.id, tmp_path)


def _hostile_lane_options(home: Path, lane: str, other: str, tmp_path: Path) -> None:
    """The CLI options behind handoffPath, attestedAt and repo refuse what is not theirs."""
    mine = home / "runs" / lane / "handoff.json"
    link = tmp_path / "link.json"
    link.symlink_to(mine)
    assert (
        pisub_cli("lane", "status", lane, "--handoff", str(link), "--json").returncode == 0
    )  # the same file
    for handoff in (
        str(home / "runs" / other / "handoff.json"),  # another lane's
        str(home / "runs" / lane / "status.json"),
        "/etc/passwd",
        "--help",
        "x\x1b]0;pwned\x07",
    ):
        refused = pisub_cli("lane", "status", lane, "--handoff", handoff)
        assert refused.returncode == 1 and "INVALID_INPUT" in refused.stderr, (handoff, refused)
        assert "Traceback" not in refused.stderr and "\x1b]" not in refused.stderr
    for at in ("yesterday", "2026-08-27T16:23:00", "9" * 200, "2026-13-40T00:00:00Z"):
        refused = pisub_cli("lane", "record-supersession", other, "--by-lane", lane, "--by", "x", "--at", at)
        assert refused.returncode == 1 and "--at must be" in refused.stderr, (at, refused)
    for where in (str(tmp_path / "nowhere"), "/"):
        refused = pisub_cli("worktree", "cleanup", "--repo", where)
        assert refused.returncode == 1 and "INVALID_INPUT" in refused.stderr, (where, refused)


@pytest.mark.pi
def test_capabilities_lists_what_each_agent_can_do(parent_pi: ParentPi) -> None:
    listed = parent_pi.call({"action": "list", "capabilities": True})
    assert listed.startswith("pi") or "\npi" in listed or "pi [" in listed, listed
    ends = [e for e in parent_pi.events if e.get("type") == "tool_execution_end"]
    details = (ends[-1].get("result") or {}).get("details") or {}
    agents = details["agentCapabilities"]["agents"]
    pi = next(a for a in agents if a["name"] == "pi")
    assert "capabilities" in pi and "runner" in pi["capabilities"], pi
    assert details["agentCapabilities"]["restrictedCount"] == 0


@pytest.mark.pi
@pytest.mark.pi_versions
def test_the_seed_run_parameters_through_the_real_tool(
    parent_pi: ParentPi, tmp_path: Path, model_server: FakeModelServer
) -> None:
    call = parent_pi.call
    run_id = _started(
        call(
            {
                "agent": "pi",
                "task": "many options",
                "maxRuntimeMs": 90000,
                "checkpointBeforeDeadlineMs": 30000,
                "maxOutput": {"bytes": 200000, "lines": 5000},
                "artifacts": True,
                "includeProgress": True,
                "sessionDir": str(tmp_path / "sessions"),
                "context": "fresh",
            }
        )
    )
    result = pisub.Run(run_id).wait(timeout=60)
    assert result.state == "complete"
    manifest = pisub.Run(run_id).manifest()
    assert manifest.limits.timeout == 90
    assert list((tmp_path / "sessions").iterdir()), "no session file in sessionDir"
    forked = _started(call({"agent": "pi", "task": "a fork", "context": "fork"}))
    assert pisub.Run(forked).wait(timeout=60).state == "complete"
    shared = call({"agent": "pi", "task": "share me", "async": False, "share": True})
    assert "share: the session is exported to" in shared and "no gist upload" in shared, shared
    later = _started(call({"agent": "pi", "task": "share me later", "share": True}))
    assert pisub.Run(later).wait(timeout=60).state == "complete"
    notice = json.dumps(wait_for(lambda: _notices(model_server, later), timeout=30, what="the notice")[0])
    assert "share: the session is exported to" in notice and "share.html" in notice, notice


@pytest.mark.pi
def test_a_seed_call_never_reaches_pi_validation(parent_pi: ParentPi) -> None:
    """Every parameter name of the seed's reference is in the tool's schema: pi never answers
    `Validation failed` for one (a call with all of them at once is one pisub answer)."""
    everything = {
        "action": "status",
        "id": RUN,
        "view": "transcript",
        "lines": 5,
        "index": 0,
    }
    answer = parent_pi.call(everything)
    assert "Validation failed" not in answer and "unknown" not in answer.lower(), answer
    for name in (
        "every",
        "laneId",
        "handoffPath",
        "isolation",
        "maxOutput",
        "share",
        "workflowScript",
        "maxRuntimeMs",
    ):
        value: Any = {
            "maxOutput": {"bytes": 1},
            "share": True,
            "maxRuntimeMs": 1000,
            "isolation": "none",
        }.get(name, "x")
        answer = parent_pi.call(
            {"agent": "pi", "task": "x", name: value} if name != "every" else {"every": "6h"}
        )
        assert "Validation failed" not in answer and "unknown parameter" not in answer, (name, answer)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
