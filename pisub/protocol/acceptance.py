"""Acceptance gates: what a caller asks of a child's work (input: strict) and what the runner
found (in the result: forward-compatible)."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

import msgspec

from pisub.protocol.codec import Record, StrictRecord


class Level(enum.StrEnum):
    NONE = "none"
    ATTESTED = "attested"
    CHECKED = "checked"
    VERIFIED = "verified"
    """Every ``verify`` command, run by the runner on the child's tree, passed."""


class AcceptanceRole(enum.StrEnum):
    """An agent file's ``acceptanceRole``: what the inference of ``"auto"`` takes it for (it
    changes no tool access)."""

    READ_ONLY = "read-only"
    WRITER = "writer"


class EvidenceKind(enum.StrEnum):
    CHANGED_FILES = "changed-files"
    TESTS_ADDED = "tests-added"
    COMMANDS_RUN = "commands-run"
    VALIDATION_OUTPUT = "validation-output"
    RESIDUAL_RISKS = "residual-risks"
    NO_STAGED_FILES = "no-staged-files"
    DIFF_SUMMARY = "diff-summary"
    REVIEW_FINDINGS = "review-findings"
    MANUAL_NOTES = "manual-notes"


CheckId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class VerifyCommand(StrictRecord, kw_only=True, omit_defaults=True):
    id: CheckId
    command: Annotated[str, msgspec.Meta(min_length=1, max_length=16 * 1024)]
    """Split like a shell line (``shlex``) and run without a shell, in the child's tree."""
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=24 * 3600 * 1000)] | None = None


class Review(StrictRecord, kw_only=True, omit_defaults=True):
    required: bool
    agent: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")] | None = None
    """The reviewer agent (default: config ``acceptance.reviewer``, else ``reviewer``)."""
    focus: Annotated[str, msgspec.Meta(min_length=1, max_length=4000)] | None = None
    """What the reviewer should look at most."""


class AcceptanceSpec(StrictRecord, kw_only=True, omit_defaults=True):
    """``acceptance``: the level and what the child's work must show."""

    level: Level
    criteria: list[Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]] | None = None
    evidence: list[EvidenceKind] | None = None
    verify: list[VerifyCommand] | None = None
    review: Review | None = None
    report: Literal["on", "off"] | None = None
    reason: Annotated[str, msgspec.Meta(max_length=4000)] | None = None


class ReviewerAgent(Record, kw_only=True):
    """The reviewer's agent file as it was at launch: the review runs this definition, whatever
    the scopes hold by then (the reviewed child could write a project agent of that name)."""

    path: str
    scope: str
    text: str


class Acceptance(Record, kw_only=True, omit_defaults=True):
    """``manifest.acceptance``: what the runner checks when the child has ended."""

    spec: AcceptanceSpec
    explicit: bool
    """Asked for by the call or the agent (a failure fails the run); else inferred (reported)."""
    reviewer: ReviewerAgent | None = None
    """A review gate's reviewer, taken at launch."""


class AcceptancePlan(Record, kw_only=True):
    """``manifest.acceptance_plan``: what acceptance adds to a launch, recorded (and printed by
    ``pisub run``) before anything runs."""

    tasks: int | None = None
    """The tasks launched (None: a workflow script, whose children are decided as it runs)."""
    report_blocks: int | None = None
    """Tasks given the acceptance-report block (None: each writer child a script starts)."""
    review_runs: bool = False
    """The person opted in to review runs (``--review``, config ``[acceptance] review``)."""
    reviews: int | None = None
    """Reviewer runs that will start (None: one per writer child a script starts, when on)."""
    reviewer: str | None = None
    """The agent a review run starts."""
    reviewer_path: str | None = None
    reviewer_overrides_builtin: bool = False
    """The reviewer is a user's or project's agent that takes the name of the one pisub ships."""


class Outcome(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


class Severity(enum.StrEnum):
    BLOCKING = "blocking"
    """Must be fixed: the review rejects the work."""
    MAJOR = "major"
    MINOR = "minor"
    NOTE = "note"


class Finding(Record, kw_only=True, omit_defaults=True):
    """One item of a reviewer's verdict."""

    severity: Severity
    message: str
    file: str | None = None


class Check(Record, kw_only=True, omit_defaults=True):
    id: str
    kind: Literal["verify", "report", "review"]
    outcome: Outcome
    reason: str | None = None
    exit_code: int | None = None
    output: str | None = None
    """The file holding the command's output (its first and last 32 KiB)."""
    cache: Literal["hit", "miss", "off"] | None = None
    key: str | None = None
    """The verify cache's key: SHA-256 of the command, the tree and the allowed environment."""
    run_id: str | None = None
    """A review check: the reviewer's run."""
    findings: list[Finding] | None = None
    """A review check: what the reviewer found."""


class EvidenceStatus(enum.StrEnum):
    CLAIMED = "claimed"
    ATTESTED = "attested"
    CHECKED = "checked"
    VERIFIED = "verified"
    REVIEW_REQUIRED = "review-required"
    REVIEWED = "reviewed"
    REJECTED = "rejected"


class AcceptanceRecord(Record, kw_only=True, omit_defaults=True):
    """``details.results[i].acceptance``."""

    level: Level
    explicit: bool
    evidence_status: EvidenceStatus
    checks: list[Check] = []
    reason: str | None = None


class VerdictWord(enum.StrEnum):
    APPROVE = "approve"
    REJECT = "reject"


class FindingInput(StrictRecord, kw_only=True, omit_defaults=True):
    severity: Severity
    message: Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
    file: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] | None = None


class ReviewVerdict(StrictRecord, kw_only=True, omit_defaults=True):
    """A reviewer's fenced ``review-verdict`` block (input from a model: strict, after the
    synonyms are normalised)."""

    verdict: VerdictWord
    findings: Annotated[list[FindingInput], msgspec.Meta(max_length=200)] = []
