"""Lanes: each lane a sequence of stages, the lanes side by side. ``runs.lanes(lanes)`` in a
script and ``pisub run --lanes LANES.json`` both come here.

A lanes manifest is checked whole before anything starts (every problem one error naming the
lane, stage and field). Every lane's first stage starts in one batch; then each lane goes on
by itself: a stage starts when its predecessor ``completed``. A stage that fails, is stopped,
could not start, or returns the verdict ``blocked`` blocks its lane (later stages
``skipped``); the other lanes go on. Stages are ordinary children keyed ``<lane>.<stage>``,
so the workflow's journal answers settled stages on a resume.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from pisub.errors import InvalidInput, PisubError
from pisub.protocol.codec import convert, decode_input
from pisub.protocol.lanes import (
    MAX_BOARD_STRING,
    MAX_LANES,
    MAX_LANES_BYTES,
    MAX_STAGES,
    MAX_STAGES_PER_LANE,
    Lane,
    LaneBoard,
    LaneState,
    Stage,
    StageBoard,
    StageState,
)
from pisub.protocol.workflow import KEY_RE, ChildCall, ChildResult
from pisub.termsafe import printable
from pisub.workflow.calls import camel_name


class Runs(Protocol):
    """What lanes need of the script's ``runs`` (:class:`pisub.workflow.api.Runs`)."""

    def reserve(self, keys: list[str]) -> None: ...

    def start_batch(self, calls: list[ChildCall], where: str) -> Sequence[Awaitable[ChildResult]]: ...

    @property
    def run(self) -> Callable[..., Awaitable[Any]]: ...

    def skip(self, call: ChildCall, why: str) -> None: ...


MAX_ERRORS = 20
"""Problems named in one error (the rest are counted)."""

_FENCE = re.compile(r"^```json[ \t]*\n(.*?)\n```[ \t]*$", re.DOTALL | re.MULTILINE)


MAX_LANES_FILE = 1024 * 1024
"""A lanes file as written (indented JSON may be larger than its canonical form)."""


# == checking ======================================================================
def load_lanes(path: Path) -> Any:
    """The JSON of a lanes file (checked by :func:`check_lanes`).

    Raises:
        InvalidInput: it cannot be read, is too large, or is not JSON.
    """
    from pisub.core.fsio import read_bytes

    try:
        data = read_bytes(os.path.realpath(path), limit=MAX_LANES_FILE + 1)  # the user's own path
    except OSError as exc:
        raise InvalidInput(f"cannot read lanes file {printable(str(path))}: {exc.strerror or exc}") from exc
    if len(data) > MAX_LANES_FILE:
        raise InvalidInput(f"lanes file {printable(str(path))} is larger than {MAX_LANES_FILE} bytes")
    try:
        return decode_input(data, Any, str(path))
    except PisubError as exc:
        raise InvalidInput(exc.message) from None


def check_lanes(data: object, where: str = "lanes") -> list[Lane]:
    """The lanes of a manifest, every rule checked before anything starts.

    Raises:
        InvalidInput: every problem found, each naming ``lanes[i] (key).stages[j] (key).field``.
    """
    problems: list[str] = []
    try:
        size = len(json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError, RecursionError):
        raise InvalidInput(f"{where}: not plain JSON (objects, lists, strings, numbers)") from None
    if size > MAX_LANES_BYTES:
        problems.append(f"{where}: {size} bytes as canonical JSON; at most {MAX_LANES_BYTES}")
    if not isinstance(data, list):
        raise InvalidInput(f"{where}: expected a list of lanes, not {type(data).__name__}")
    if not 1 <= len(data) <= MAX_LANES:
        problems.append(f"{where}: {len(data)} lanes; 1 to {MAX_LANES}")
    lanes: list[Lane] = []
    for index, raw in enumerate(data[: MAX_LANES * 2]):
        lane = _check_lane(raw, f"{where}[{index}]", problems)
        if lane is not None:
            lanes.append(lane)
    total = sum(len(lane.stages) for lane in lanes)
    if total > MAX_STAGES:
        problems.append(f"{where}: {total} stages in all; at most {MAX_STAGES}")
    _check_keys(lanes, where, problems)
    if problems:
        more = f"; and {len(problems) - MAX_ERRORS} more" if len(problems) > MAX_ERRORS else ""
        raise InvalidInput("; ".join(problems[:MAX_ERRORS]) + more)
    return lanes


def _camel(raw: object) -> object:
    """A stage's or defaults' fields in their file spelling (Python's ``idle_timeout`` too)."""
    if not isinstance(raw, dict):
        return raw
    return {camel_name(k) if isinstance(k, str) else k: v for k, v in raw.items()}


def _check_lane(raw: object, where: str, problems: list[str]) -> Lane | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected an object {{key, stages, defaults?}}, not {type(raw).__name__}")
        return None
    raw = dict(raw)
    if isinstance(raw.get("stages"), list):
        raw["stages"] = [_camel(stage) for stage in raw["stages"]]
    if "defaults" in raw:
        raw["defaults"] = _camel(raw["defaults"])
    key = raw.get("key")
    if isinstance(key, str) and KEY_RE.fullmatch(key):
        where = f"{where} ({key})"
    stages = raw.get("stages")
    if isinstance(stages, list):
        if not 1 <= len(stages) <= MAX_STAGES_PER_LANE:
            problems.append(f"{where}.stages: {len(stages)} stages; 1 to {MAX_STAGES_PER_LANE}")
        found = len(problems)
        for index, stage in enumerate(stages[: MAX_STAGES_PER_LANE * 2]):
            _check_stage(stage, index, f"{where}.stages[{index}]", problems)
        if len(problems) > found:
            return None
    try:
        lane = convert(raw, Lane, where)
    except PisubError as exc:
        problems.append(exc.message)
        return None
    return lane


def _check_stage(raw: object, index: int, where: str, problems: list[str]) -> None:
    if isinstance(raw, dict):
        key = raw.get("key")
        if isinstance(key, str) and KEY_RE.fullmatch(key):
            where = f"{where} ({key})"
        resume = raw.get("resume")
        if index == 0 and resume is not None:
            hint = (
                f" (to continue run {printable(resume[:80], one_line=True)}, "
                "call runs.run(key, resume=RUN_ID, ...))"
                if isinstance(resume, str) and resume != "previous"
                else ""
            )
            problems.append(f"{where}.resume: a lane's first stage has no previous stage{hint}")
            return
    try:
        convert(raw, Stage, where)
    except PisubError as exc:
        problems.append(exc.message)


def _check_keys(lanes: list[Lane], where: str, problems: list[str]) -> None:
    lane_keys: set[str] = set()
    children: set[str] = set()
    for index, lane in enumerate(lanes):
        at = f"{where}[{index}] ({lane.key})"
        if lane.key in lane_keys:
            problems.append(f"{at}.key (the lane key {lane.key!r} is used twice)")
        lane_keys.add(lane.key)
        stage_keys: set[str] = set()
        for number, stage in enumerate(lane.stages):
            here = f"{at}.stages[{number}] ({stage.key})"
            if stage.key in stage_keys:
                problems.append(f"{here}.key (the stage key {stage.key!r} is used twice in the lane)")
                continue
            stage_keys.add(stage.key)
            child = child_key(lane, stage)
            if not KEY_RE.fullmatch(child):
                problems.append(
                    f"{here}.key (the child key {child!r} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}})"
                )
            elif child in children:
                problems.append(f"{here}.key (the child key {child!r} is another lane's stage)")
            children.add(child)
            if _agent(lane, number) is None:
                problems.append(f"{here}.agent: no agent (give one, or the lane's defaults.agent)")


def child_key(lane: Lane, stage: Stage) -> str:
    return f"{lane.key}.{stage.key}"


def _agent(lane: Lane, number: int) -> str | None:
    stage = lane.stages[number]
    if stage.agent is not None:
        return stage.agent
    if lane.defaults is not None and lane.defaults.agent is not None:
        return lane.defaults.agent
    if stage.resume == "previous" and number > 0:
        return _agent(lane, number - 1)
    return None


def stage_call(lane: Lane, number: int, resume: str | None = None) -> ChildCall:
    """The child call of stage ``number`` (its lane's defaults filled in)."""
    stage = lane.stages[number]
    defaults = lane.defaults
    agent = _agent(lane, number)
    assert agent is not None, "checked by check_lanes"

    def pick(name: str) -> Any:
        value = getattr(stage, name)
        if value is None and defaults is not None and hasattr(defaults, name):
            value = getattr(defaults, name)
        return value

    fields: dict[str, Any] = {
        "key": child_key(lane, stage),
        "agent": agent,
        "task": stage.task,
        "resume": resume,
        "output": stage.output,
    }
    for name in (
        "output_mode",
        "timeout",
        "idle_timeout",
        "model",
        "context",
        "cwd",
        "isolation",
        "base_ref",
    ):
        fields[name] = pick(name)
    return ChildCall(**{k: v for k, v in fields.items() if v is not None})


# == running =======================================================================
async def run_lanes(runs: Runs, lanes: list[Lane]) -> list[LaneBoard]:
    """Run every lane; the board, in lane order."""
    # Every stage's start claimed at once: a manifest that does not fit the budget starts nothing.
    runs.reserve([child_key(lane, stage) for lane in lanes for stage in lane.stages])
    batch = runs.start_batch([stage_call(lane, 0) for lane in lanes], "runs.lanes")
    boards = await asyncio.gather(
        *(_lane(runs, lane, first) for lane, first in zip(lanes, batch, strict=True))
    )
    return list(boards)


async def _lane(runs: Runs, lane: Lane, started: Awaitable[ChildResult]) -> LaneBoard:
    first = await started
    stages = [_stage_board(lane.stages[0].key, first)]
    previous = first
    for number in range(1, len(lane.stages)):
        if stages[-1].state is not StageState.COMPLETED:
            break
        stage = lane.stages[number]
        try:
            resume = _previous_session(previous) if stage.resume == "previous" else None
            call = stage_call(lane, number, resume)
            outcome: ChildResult = await runs.run(call.key or "", **_as_params(call, key=False))
        except PisubError as exc:  # it could not start: the lane is blocked with the reason
            stages.append(_blocked(stage.key, exc.message))
            break
        stages.append(_stage_board(stage.key, outcome))
        previous = outcome
    for stage in lane.stages[len(stages) :]:
        call = stage_call(lane, lane.stages.index(stage))
        runs.skip(call, f"skipped: an earlier stage of lane {lane.key!r} did not complete")
        stages.append(StageBoard(key=stage.key, state=StageState.SKIPPED, ok=False))
    failed = next((s.key for s in stages if s.state is not StageState.COMPLETED), None)
    state = LaneState.COMPLETE if failed is None else LaneState.BLOCKED
    return LaneBoard(key=lane.key, state=state, stages=stages, failed_stage=failed)


def _previous_session(previous: ChildResult) -> str:
    if previous.run_id is None:
        raise InvalidInput("the previous stage did not return a run id to resume")
    if not previous.session_file:
        raise InvalidInput(f"the previous stage's run {previous.run_id} left no pi session to resume")
    return previous.run_id


def _as_params(call: ChildCall, *, key: bool = True) -> dict[str, Any]:
    params: dict[str, Any] = msgspec.structs.asdict(call)
    if not key:
        params.pop("key")
    return {k: (v.value if hasattr(v, "value") else v) for k, v in params.items() if v is not None}


def _final_output(result: ChildResult) -> str:
    """The stage's final output: for ``file-only``, what the saved file holds (its tail)."""
    if result.output_reference is None or not result.output.startswith("Output saved to: "):
        return result.output
    from pisub.core.fsio import read_tail

    try:
        return read_tail(Path(result.output_reference), 256 * 1024).decode("utf-8", "replace")
    except OSError:
        return result.output


def _stage_board(key: str, result: ChildResult) -> StageBoard:
    verdict = verdict_of(_final_output(result)) if result.ok else None
    if result.state == "stopped":
        state = StageState.STOPPED
    elif result.ok and verdict == "blocked":
        state = StageState.BLOCKED
    elif result.ok:
        state = StageState.COMPLETED
    else:
        state = StageState.FAILED
    error = result.error.message if result.error is not None and not result.ok else None
    reference = result.output_reference
    return StageBoard(
        key=key,
        state=state,
        ok=result.ok,
        run_id=result.run_id,
        output_reference=reference
        if reference is not None and len(reference.encode()) <= MAX_BOARD_STRING
        else None,
        verdict=_cap(verdict),
        error=_cap(error),
    )


def _blocked(key: str, why: str) -> StageBoard:
    return StageBoard(key=key, state=StageState.BLOCKED, ok=False, error=_cap(why))


def _cap(text: str | None) -> str | None:
    if text is None:
        return None
    return text.encode("utf-8")[:MAX_BOARD_STRING].decode("utf-8", "ignore")


def verdict_of(output: str) -> str | None:
    """The ``verdict`` of the last fenced ```json block of ``output`` when that block is an
    object with a string ``verdict`` (else none); prose is never read."""
    blocks = _FENCE.findall(output[-256 * 1024 :])
    if not blocks:
        return None
    try:
        value = json.loads(blocks[-1])
    except (ValueError, RecursionError):
        return None
    if isinstance(value, dict) and isinstance(value.get("verdict"), str):
        verdict: str = value["verdict"]
        return verdict
    return None


def board_json(boards: list[LaneBoard]) -> Any:
    """The board as plain JSON data."""
    return msgspec.to_builtins(boards)
