"""A workflow's usage budget with the real pi against the scripted model: reservations keep
concurrent children within the documented bound, and a spent budget refuses later starts."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest

import pisub
from pisub.api.client import launch_parallel, launch_workflow
from pisub.errors import InvalidInput
from pisub.store.usage_budget import tokens_of
from tests.conftest import pisub_cli

pytestmark = pytest.mark.pi


@pytest.mark.pi_versions
def test_three_concurrent_children_stay_within_the_bound_and_a_fourth_is_refused(
    pi_home: Path, tmp_path: Path
) -> None:
    (pi_home / "config.toml").write_text("[budgets]\nusage_estimate_tokens = 120\n")
    tag = uuid.uuid4().hex[:8]
    script = tmp_path / "wf.py"
    script.write_text(
        textwrap.dedent(
            f"""
            async def main(runs, state, args):
                first = await runs.all([
                    {{"key": f"c{{i}}", "agent": "pi", "task": f"hello {tag} {{i}}"}} for i in range(3)
                ])
                try:
                    await runs.run("late", agent="pi", task="too late {tag}")
                except Exception as exc:
                    return {{"late": getattr(exc, "code", type(exc).__name__), "ok": [r.ok for r in first]}}
                return {{"late": "started", "ok": [r.ok for r in first]}}
            """
        )
    )
    run = launch_workflow(script, concurrency=3, usage_budget={"tokens": {"hard": 300, "soft": 150}})
    result = run.wait(timeout=120)
    assert result.state == "complete", result.content[0].text
    answer = json.loads(result.content[0].text)
    assert answer == {"late": "USAGE_BUDGET_EXCEEDED", "ok": [True, True, True]}
    used = [tokens_of(r.usage) for r in result.details.results]
    reserved = [120, 120, 60]  # min(remaining, estimate) in start order
    assert sum(used) <= 300 + sum(max(0.0, u - r) for u, r in zip(used, reserved, strict=True))
    usage = run.status().usage
    assert usage is not None and usage.tokens == sum(used) and usage.reserved_tokens == 0
    assert usage.soft_reached and usage.hard_reached
    events = (run.dir / "events.jsonl").read_text()
    assert "budget.usage_soft_reached" in events and "budget.usage_spent" in events


def test_bad_budgets_are_refused_before_anything_starts(pi_home: Path) -> None:
    for bad, needle in (
        ({"tokens": {"hard": -1}}, "hard"),
        ({"tokens": {"hard": 10, "soft": 20}}, "soft must not be above hard"),
        ({"bananas": 1}, "bananas"),
        ({}, "give tokens"),
    ):
        with pytest.raises(InvalidInput, match=needle):
            launch_parallel([{"agent": "pi", "task": "x"}], usage_budget=bad)
    done = pisub_cli("run", "--agent", "pi", "x", "--usage-budget", '{"tokens": {"hard": 5}}')
    assert done.returncode == 1 and "for workflows" in done.stderr
    assert not list(pisub.list_runs(children=True))
