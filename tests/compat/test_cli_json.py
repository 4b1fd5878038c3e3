"""The ``--json`` output of the read commands keeps the fields spec/cli.md documents (new ones
may appear; none may go)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import AgentMaker, pisub_cli


def _lines(*args: str) -> list[Any]:
    proc = pisub_cli(*args, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _has(obj: Any, *fields: str) -> None:
    assert isinstance(obj, dict), obj
    missing = set(fields) - set(obj)
    assert not missing, f"documented fields missing: {sorted(missing)} in {sorted(obj)}"


STATUS = ("v", "runId", "state", "agent", "runner", "pid", "startedAt", "updatedAt", "endedAt", "steps")
RESULT = ("content", "details")


def test_read_commands_print_their_documented_fields(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", command="true")
    (launched,) = _lines("run", "--agent", "quick", "x")
    _has(launched, "runId", "runDir", "state", "pid", "label")
    run_id = launched["runId"]
    (waited,) = _lines("wait", run_id, "--timeout", "30")
    _has(waited, *RESULT)
    (status,) = _lines("status", run_id)
    _has(status, *STATUS)
    (listed,) = _lines("list")
    _has(listed, *STATUS, "label", "task", "cwd")
    (recent,) = _lines("status")  # without RUN: the recent runs
    _has(recent, *STATUS)
    (version,) = _lines("version")
    _has(version, "version", "python")
    (both,) = _lines("wait", run_id, run_id, "--all")
    _has(both, "runId", "state")
    (result,) = _lines("result", run_id)
    _has(result, *RESULT)
    assert _lines("fleet") == []
    agents = _lines("agents", "list")
    _has(agents[0], "name", "description", "runner", "scope", "path")
    (shown,) = _lines("agents", "show", "quick")
    _has(shown, "scope", "path", "sha256", "spec")
    (doctor,) = _lines("doctor")
    _has(doctor, "healthy", "checks")
    _has(doctor["checks"][0], "name", "ok", "detail", "fix")
    (gc,) = _lines("gc", "--dry-run")
    _has(gc, "dryRun", "removed", "swept", "keptLive", "keptRecent", "keptWithTree")
    (settings,) = _lines("config", "show")
    _has(settings[0], "name", "value", "source")
    assert _lines("lease", "list") == []
    assert _lines("children", "list") == [[]]
    assert _lines("worktree", "list") == [[]]
