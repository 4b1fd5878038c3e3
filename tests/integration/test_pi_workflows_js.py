"""JavaScript workflows through the `subagent` tool in a real pi (issue 27): the scripted model
calls the tool with the seed's examples verbatim — ``workflowScript`` (inline, on pisub's stdin),
``workflowScriptPath: "workflows/review.js"`` with ``cwd``, ``action: "validate"`` (ok, and not
ok: a failed tool call), and the named resources ``review`` and ``run-ci`` — and each has the
result the seed documents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pisub
from tests.conftest import wait_for
from tests.integration.test_pi_subagent_tool import ParentPi, _started
from tests.integration.test_seed_js_examples import (
    GATE,
    LANES,
    ONE_CHILD,
    PARALLEL,
    RESEARCH_RULES,
    RESUME_LOOP,
    REVIEW_JS_PATH,
    REVIEW_RESOURCE,
    ROLLING,
    RUN_CI_RESOURCE,
    SAID,
    SEQUENTIAL,
    SHARE,
    fake_npm,  # noqa: F401 (a fixture)
    seed_pi_agents,  # noqa: F401 (a fixture)
    text,
    value,
)

pytestmark = pytest.mark.pi


class ToolPi(ParentPi):
    """A parent pi whose tool results are read whole (text, details, isError)."""

    npm_calls: Path  # what the stand-in npm was asked to do

    def end(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The tool_execution_end event of one call of the tool."""
        before = self._count("tool_execution_end")
        self.call(arguments)
        return [e for e in list(self.events) if e.get("type") == "tool_execution_end"][before]


def _text(end: dict[str, Any]) -> str:
    return str(((end.get("result") or {}).get("content") or [{}])[0].get("text", ""))


def _details(end: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = (end.get("result") or {}).get("details") or {}
    return found


def _failed(end: dict[str, Any]) -> bool:
    return end.get("isError") is True or (end.get("result") or {}).get("isError") is True


@pytest.fixture
def tool_pi(
    seed_pi_agents: Path,  # noqa: F811
    fake_npm: Path,  # noqa: F811
    pi_bin: str,
    tmp_path: Path,
) -> Iterator[ToolPi]:
    """A parent pi with pisub's tool; the seed's agents are pi agents; ``npm`` is a stand-in."""
    pi = ToolPi(pi_bin, tmp_path / "parent.jsonl", tmp_path)
    pi.npm_calls = fake_npm
    yield pi
    pi.close()


def _result(end: dict[str, Any], timeout: float = 180) -> pisub.Result:
    run_id = _started(_text(end))
    return pisub.Run(run_id).wait(timeout=timeout)


@pytest.mark.pi_versions
def test_the_seeds_first_example_through_the_tool(tool_pi: ToolPi) -> None:
    """``{workflowScript: 'return runs.run("main", ...)'}``: a detached workflow whose result is
    the child's; with ``async: false`` the tool answers with that result itself."""
    end = tool_pi.end({"workflowScript": ONE_CHILD})
    assert not _failed(end), _text(end)
    result = _result(end)
    assert result.state == "complete", result.content[0].text
    child = value(result)
    assert child["key"] == "main" and child["output"] == SAID + "Analyze the auth flow", child
    waited = tool_pi.end({"workflowScript": ONE_CHILD, "async": False})
    assert not _failed(waited) and SAID + "Analyze the auth flow" in _text(waited), _text(waited)


def test_a_js_file_resolved_against_the_calls_cwd(tool_pi: ToolPi, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "workflows").mkdir(parents=True)
    (project / REVIEW_JS_PATH).write_text(PARALLEL)
    checked = tool_pi.end({"action": "validate", "workflowScriptPath": REVIEW_JS_PATH, "cwd": str(project)})
    assert not _failed(checked) and _details(checked)["ok"] is True, _text(checked)
    result = _result(tool_pi.end({"workflowScriptPath": REVIEW_JS_PATH, "cwd": str(project)}))
    assert result.state == "complete", result.content[0].text
    assert value(result) == [SAID + "Review backend", SAID + "Review frontend"]
    ts = tool_pi.end({"workflowScriptPath": "workflows/review.ts", "cwd": str(project)})
    assert _failed(ts) and "is TypeScript" in _text(ts), _text(ts)


def test_validate_ok_and_not_ok_a_failed_tool_call(tool_pi: ToolPi) -> None:
    ok = tool_pi.end({"action": "validate", "workflowScript": ONE_CHILD})
    assert not _failed(ok) and _details(ok)["ok"] is True and _details(ok)["errors"] == [], _text(ok)
    bad = tool_pi.end({"action": "validate", "workflowScript": "const f = async () => 1;\nreturn f()"})
    assert _failed(bad), _text(bad)
    assert _details(bad)["ok"] is False and _details(bad)["errors"], _details(bad)
    assert _text(bad).startswith("not valid:") and "line 1" in _text(bad), _text(bad)
    empty = tool_pi.end({"action": "validate", "workflowScript": "  "})
    assert _failed(empty) and "validate requires a non-empty workflowScript" in _text(empty), _text(empty)
    assert list(pisub.list_runs()) == []  # validate starts nothing


def test_named_resources_through_the_tool(tool_pi: ToolPi) -> None:
    """``{workflow: "run-ci", args: {command: "npm test"}}`` runs the command on the host (the
    stand-in npm records it); ``{workflow: "review", args: {task}}`` runs one reviewer."""
    ci = _result(tool_pi.end(RUN_CI_RESOURCE))
    assert ci.state == "complete", ci.content[0].text
    assert "npm test" in tool_pi.npm_calls.read_text()
    review = _result(tool_pi.end(REVIEW_RESOURCE))
    assert review.state == "complete", review.content[0].text
    assert SAID + "Review the auth flow" in review.content[0].text + json.dumps(
        [r.output for r in review.details.results]
    )
    mixed = tool_pi.end({**RUN_CI_RESOURCE, "agent": "scout", "task": "x"})
    assert _failed(mixed) and "cannot be combined with workflow" in _text(mixed), _text(mixed)


def test_every_other_seed_example_through_the_tool(tool_pi: ToolPi) -> None:
    """The parallel, sequential, lanes, rolling, resume-loop, gate and share examples, verbatim."""
    parallel = _result(tool_pi.end({"workflowScript": PARALLEL}))
    assert value(parallel) == [SAID + "Review backend", SAID + "Review frontend"], parallel.content[0].text
    sequential = _result(tool_pi.end({"workflowScript": SEQUENTIAL}))
    assert sequential.state == "complete", sequential.content[0].text
    assert text(sequential) == SAID + "Implement from: " + SAID + "Analyze auth"
    lanes = _result(tool_pi.end({"workflowScript": LANES}), timeout=300)
    assert lanes.state == "complete", lanes.content[0].text
    assert [lane["state"] for lane in value(lanes)] == ["complete", "complete"]
    rolling = value(_result(tool_pi.end({"workflowScript": ROLLING})))
    assert {rolling["first"], *rolling["rest"]} == {"writer", "reviewer"}, rolling
    assert rolling["receipt"]["key"] == rolling["rest"][0], rolling
    loop = value(_result(tool_pi.end({"workflowScript": RESUME_LOOP}), timeout=300))
    assert loop["key"] == "followup-2" and loop["output"].startswith(SAID + "Revisit pass 2: "), loop
    gate = _result(tool_pi.end({"workflowScript": GATE}))
    assert gate.state == "complete" and value(gate)["ok"] is True, gate.content[0].text
    assert "npm test" in tool_pi.npm_calls.read_text()
    shared = tool_pi.end({"workflowScript": SHARE, "share": True})
    assert not _failed(shared) and "share:" in _text(shared), _text(shared)
    assert _result(shared).state == "complete"
    wait_for(tool_pi.idle, timeout=90, what="the parent to be idle")


def test_an_inline_script_reaches_pisub_byte_for_byte(tool_pi: ToolPi, tmp_path: Path) -> None:
    """The script goes on pisub's stdin, never through a shell or the argv: quotes, `$(...)`,
    backticks, non-ASCII text and a 90 KB comment (past what one argv word may hold with the
    rest) arrive as written; a NUL or a script over the tool's 100 KB is refused in one line."""
    planted = tmp_path / "planted"
    task = f"héllo 日本 🧑 \"q\" 'q' $(touch {planted}) `touch {planted}` \\n end"
    call = 'return runs.run("main", { agent: "scout", task: ' + json.dumps(task) + " })"
    result = _result(tool_pi.end({"workflowScript": "// " + "x" * 90_000 + "\n" + call}))
    assert result.state == "complete", result.content[0].text
    assert value(result)["output"] == SAID + task and not planted.exists()
    given = {"branch": "123", "n": 2, "-x": [True]}  # a string stays one; any key
    typed = tool_pi.end({"workflowScript": "return args", "args": given, "async": False})
    assert json.loads(_text(typed)) == given, _text(typed)
    nul = tool_pi.end({"workflowScript": "return 1\u0000"})
    assert _failed(nul) and "contains a NUL" in _text(nul), _text(nul)
    huge = tool_pi.end({"workflowScript": "// " + "x" * 100_001})
    assert _failed(huge) and "at most 100000" in _text(huge), _text(huge)


def test_the_research_notes_rules_through_the_tool(tool_pi: ToolPi) -> None:
    """pi-subagents-orchestration.md §1's JavaScript through the tool: what validate finds is a
    failed tool call naming it (nothing starts); the rest start and end as documented."""
    for name, script, says in RESEARCH_RULES:
        end = tool_pi.end({"workflowScript": script})
        if name in ("nested-async", "keyed-access"):
            assert _failed(end) and says in _text(end), (name, _text(end))
            continue
        assert not _failed(end), (name, _text(end))
        result = _result(end, timeout=60)
        if name == "no-timers":
            assert (result.state, text(result)) == ("complete", "undefined"), result.content[0].text
        else:
            assert result.state == "failed" and says in result.content[0].text, (name, result.content[0].text)
