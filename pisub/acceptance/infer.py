"""What ``acceptance: "auto"`` (the default) resolves to: a small table from two facts — what
the agent is (:class:`Role`) and where the run sits (:class:`Setting`) — never from the
task's wording.

=========== ============================= =====================================
role        setting                       acceptance
=========== ============================= =====================================
read-only   any                           none
unknown     any                           none (pisub cannot tell what it does)
writer      a run of its own              checked
writer      a declared workflow child     checked
writer      a child a script started      checked + review required
=========== ============================= =====================================

A required review — inferred, or asked for by a call, an agent file or a script's child —
starts a reviewer run (real tokens) only when the person launching opted in to review runs
(``pisub run --review``, ``review=True``, config ``[acceptance] review = true``; ``--no-review``
wins over the config); then every
writer row is reviewed, and a reviewer agent must be known (when none is, the row is
``checked`` and its reason says why). Without the opt-in the review row is recorded and not
run: the result's evidence status is ``review-required`` (the seed's meaning: the evidence
passed, no reviewer's result yet). An inferred acceptance is reported and never fails the run.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import msgspec

from pisub.protocol.acceptance import Acceptance, AcceptanceRole, AcceptanceSpec, Level, Review

READ_ONLY_TOOLS = frozenset({"read", "grep", "find", "ls"})
"""pi's tools that change nothing."""

PI_DEFAULT_TOOLS = frozenset({"read", "bash", "edit", "write"})
"""The tools a pi agent without a ``tools`` list has."""


class Role(enum.StrEnum):
    READ_ONLY = "read-only"
    WRITER = "writer"
    UNKNOWN = "unknown"


class Setting(enum.StrEnum):
    """Where a run sits (every pisub run is detached, so "async" tells nothing apart)."""

    DIRECT = "direct"
    """A run of its own (``pisub run``, ``pisub.launch``)."""
    DECLARED = "declared"
    """A child declared before the workflow started: ``--parallel``, ``--chain``, ``--lanes``."""
    DYNAMIC = "dynamic"
    """A child a workflow script decided to start while it ran."""


class Row(msgspec.Struct, frozen=True):
    level: Level
    review: bool
    why: str


TABLE: dict[tuple[Role, Setting], Row] = {
    **{(Role.READ_ONLY, s): Row(Level.NONE, False, "a read-only agent") for s in Setting},
    **{
        (Role.UNKNOWN, s): Row(Level.NONE, False, "an external agent without acceptanceRole") for s in Setting
    },
    (Role.WRITER, Setting.DIRECT): Row(Level.CHECKED, False, "a writer run on its own"),
    (Role.WRITER, Setting.DECLARED): Row(Level.CHECKED, False, "a writer in a declared workflow"),
    (Role.WRITER, Setting.DYNAMIC): Row(Level.CHECKED, True, "a writer a workflow script started"),
}


def role_of(declared: AcceptanceRole | None, runner: str, tools: Iterable[str] | None) -> Role:
    """The agent's role: its ``acceptanceRole`` when it says; else a pi agent is read-only when
    every tool it has changes nothing, a writer otherwise; an external agent is unknown."""
    if declared is not None:
        return Role(declared.value)
    if runner != "pi":
        return Role.UNKNOWN
    have = PI_DEFAULT_TOOLS if tools is None else frozenset(tools)
    return Role.READ_ONLY if have <= READ_ONLY_TOOLS else Role.WRITER


REVIEW_RUNS_OFF = "review runs are off: pisub run --review, or [acceptance] review = true, turns them on"


def infer(
    role: Role,
    setting: Setting,
    reviewer: str | None,
    *,
    review_runs: bool = False,
    no_reviewer: str = "no reviewer agent",
) -> Acceptance:
    """The inferred acceptance (``explicit`` false) of a run; ``reviewer``: the reviewer agent,
    None when there is none (then no review is run, ``no_reviewer`` says why); ``review_runs``:
    the person opted in to review runs (every writer is then reviewed; else a review row is
    recorded, not run)."""
    row = TABLE[(role, setting)]
    review = None
    why = f"inferred: {row.why}"
    wanted = row.review or (review_runs and role is Role.WRITER)
    if wanted and review_runs and reviewer is not None:
        review = Review(required=True, agent=reviewer)
        why += " (review runs on)"
    elif wanted and review_runs:
        why += f" ({no_reviewer}, so no review)"
    elif wanted:
        review = Review(required=True)
        why += f" (review required, not run: {REVIEW_RUNS_OFF})"
    return Acceptance(spec=AcceptanceSpec(level=row.level, review=review, reason=why), explicit=False)


def asks_review(acceptance: Acceptance | None) -> bool:
    """Whether the acceptance requires a review (run or only recorded)."""
    return acceptance is not None and acceptance.spec.review is not None and acceptance.spec.review.required


def runs_review(acceptance: Acceptance | None) -> bool:
    """Whether the runner starts a reviewer run for this acceptance: a required review whose
    reviewer was taken at launch — only a launch that opted in to review runs takes one (a
    review asked for without the opt-in, by a call, an agent file or the inference, is
    recorded as ``review-required``, not run)."""
    return asks_review(acceptance) and acceptance is not None and acceptance.reviewer is not None
