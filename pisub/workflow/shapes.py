"""The common shapes as built-in workflow mains: ``parallel`` (every task at once, results in
task order), ``chain`` (one after the other, ``{previous}`` replaced by the previous step's
output; a failed step ends the chain and the later ones are ``skipped``) and ``lanes`` (the
board as the result; a blocked lane fails the workflow, the others still run). All run on the
same coordinator and journal as a script."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from pisub.errors import WorkflowFailed
from pisub.protocol.lanes import Lane, LaneState
from pisub.protocol.workflow import ChildCall, ChildResult, Shape, WorkflowSpec
from pisub.workflow.api import Runs
from pisub.workflow.lanes import board_json, run_lanes
from pisub.workflow.script import MainFn

PREVIOUS = "{previous}"


def shape_main(spec: WorkflowSpec) -> MainFn:
    """The built-in main of ``spec``'s shape."""
    if spec.shape == Shape.PARALLEL:
        return _parallel(spec.tasks)
    if spec.shape == Shape.CHAIN:
        return _chain(spec.tasks)
    if spec.shape == Shape.LANES:
        return _lanes(spec.lanes)
    raise ValueError(spec.shape)


def _params(call: ChildCall, **changes: Any) -> dict[str, Any]:
    params: dict[str, Any] = msgspec.structs.asdict(call)
    params.update(changes)
    return {k: (v.value if hasattr(v, "value") else v) for k, v in params.items() if v is not None}


def _parallel(tasks: list[ChildCall]) -> MainFn:
    async def main(runs: Runs, _state: Any, _args: Any) -> str:
        results: list[ChildResult] = await runs.all([_params(t) for t in tasks])
        text = _sections(results)
        failed = [r.key for r in results if not r.ok]
        if failed:
            raise WorkflowFailed(f"{len(failed)} of {len(results)} tasks failed: {', '.join(failed)}", text)
        return text

    return main


def _chain(tasks: list[ChildCall]) -> MainFn:
    async def main(runs: Runs, _state: Any, _args: Any) -> str:
        previous = ""
        for number, call in enumerate(tasks):
            task = call.task.replace(PREVIOUS, previous)
            assert call.key is not None
            result: ChildResult = await runs.run(call.key, **_params(call, key=None, task=task))
            if not result.ok:
                for later in tasks[number + 1 :]:
                    runs.skip(later, f"skipped: step {call.key!r} failed")
                why = result.error.message if result.error is not None else result.state
                raise WorkflowFailed(f"step {call.key!r} {result.state}: {why}", result.output)
            previous = result.output
        return previous

    return main


def _lanes(lanes: list[Lane]) -> MainFn:
    async def main(runs: Runs, _state: Any, _args: Any) -> str:
        boards = await run_lanes(runs, lanes)
        text = json.dumps(board_json(boards), indent=2, ensure_ascii=False)
        blocked = [b for b in boards if b.state is LaneState.BLOCKED]
        if blocked:
            where = ", ".join(f"{b.key} at {b.failed_stage}" for b in blocked)
            raise WorkflowFailed(f"{len(blocked)} of {len(boards)} lanes blocked: {where}", text)
        return text

    return main


def _sections(results: list[ChildResult]) -> str:
    parts = []
    for result in results:
        head = f"## {result.key} ({result.agent}): {result.state}"
        body = (
            result.output if result.ok or not result.error else f"{result.error.code}: {result.error.message}"
        )
        parts.append(f"{head}\n\n{body}".rstrip())
    return "\n\n".join(parts)
