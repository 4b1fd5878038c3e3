"""Review gates, the parts that need no process: what the reviewer is asked (the task, the
criteria, the diff of the child's work) and how its answer is read — the one fenced
```review-verdict block of its final output (several: none is read, the gate fails), read
tolerantly (synonyms of the verdict and the severities, snake_case, a wrapper object) and
strictly otherwise (the field named). The work is ``reviewed`` only when the verdict approves
it and no finding is blocking."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pisub.acceptance.report import clean_texts, load_block
from pisub.errors import InvalidInput, PisubError
from pisub.protocol.acceptance import AcceptanceSpec, Check, ReviewVerdict, Severity, VerdictWord
from pisub.protocol.codec import convert

FENCE = "review-verdict"
_BLOCK = re.compile(r"^```review-verdict[ \t]*\n(.*?)\n```[ \t]*$", re.DOTALL | re.MULTILINE)
MAX_VERDICT_CHARS = 64 * 1024
MAX_DIFF_BYTES = 48 * 1024
MAX_TASK_CHARS = 8 * 1024

_VERDICTS: dict[str, VerdictWord] = {
    **dict.fromkeys(
        ("approve", "approved", "accept", "accepted", "pass", "passed", "lgtm"), VerdictWord.APPROVE
    ),
    **dict.fromkeys(
        ("reject", "rejected", "fail", "failed", "changes-requested", "request-changes"), VerdictWord.REJECT
    ),
}
_SEVERITIES: dict[str, Severity] = {
    **dict.fromkeys(("blocking", "blocker", "critical"), Severity.BLOCKING),
    **dict.fromkeys(("major", "high"), Severity.MAJOR),
    **dict.fromkeys(("minor", "medium", "low"), Severity.MINOR),
    **dict.fromkeys(("note", "nit", "info"), Severity.NOTE),
}
_WRAPPERS = ("review", "reviewVerdict", "review_verdict", "verdict")


@dataclass
class ReviewOutcome:
    """What a review gate found (:func:`pisub.runner.review.run_review` runs the reviewer)."""

    check: Check
    finished: bool
    """Whether the reviewer gave a verdict (else the work still needs a review)."""


def review_task(spec: AcceptanceSpec, task: str, diff: str | None) -> str:
    """What the reviewer is asked: the child's task, the criteria, the diff, and the answer's
    form (described in words, so that only the reviewer's own block is fenced)."""
    review = spec.review
    lines = [
        "Review another agent's finished work. Do not change any file.",
        "",
        "The task it was given:",
        _quoted(task[:MAX_TASK_CHARS]),
    ]
    if spec.criteria:
        lines += ["", "It must meet these criteria:", *(f"- {c}" for c in spec.criteria)]
    if review is not None and review.focus:
        lines += ["", f"Look most at: {review.focus}"]
    if diff is None:
        lines += ["", "No diff is available (not a git tree): read the files in the working directory."]
    else:
        lines += ["", "Its changes (git diff against HEAD, untracked files listed):", _quoted(diff)]
    lines += [
        "",
        f"End your reply with exactly one fenced block whose info string is {FENCE} (a reply with",
        "two decides nothing) holding one JSON object:",
        '"verdict" ("approve" or "reject") and "findings", a list of objects with "severity"',
        '("blocking", "major", "minor" or "note"), "message" and optionally "file". Any blocking',
        "finding rejects the work.",
    ]
    return "\n".join(lines)


def _quoted(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines()) or "> (empty)"


def extract(output: str) -> str | None:
    """The one verdict block's text, None when there is none.

    Raises:
        InvalidInput: there are several: none is read (never the favourable one), the gate
            fails closed.
    """
    blocks = list(_BLOCK.finditer(output))
    if len(blocks) > 1:
        raise InvalidInput(
            f"the reviewer gave {len(blocks)} review-verdict blocks; exactly one is read, so none "
            "is (a review that says two things decides nothing)"
        )
    return blocks[0].group(1)[:MAX_VERDICT_CHARS] if blocks else None


def parse(text: str) -> ReviewVerdict:
    """The reviewer's verdict.

    Raises:
        InvalidInput: not JSON, an unknown key, a bad verdict or severity — naming the field.
    """
    data = dict(load_block(text, FENCE, _WRAPPERS))
    clean_texts(data, FENCE)
    _known(data, ("verdict", "findings"), FENCE)
    if isinstance(data.get("verdict"), str):
        word = data["verdict"].strip().lower().replace("_", "-").replace(" ", "-")
        data["verdict"] = _VERDICTS.get(word, data["verdict"])
    findings = data.get("findings")
    if isinstance(findings, list):
        data["findings"] = [_finding(f, f"{FENCE}.findings[{i}]") for i, f in enumerate(findings)]
    try:
        return convert(data, ReviewVerdict, FENCE)
    except PisubError as exc:
        raise InvalidInput(exc.message.replace("`$.", f"`{FENCE}.")) from None


def _known(data: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in fields:
            raise InvalidInput(f"{where}.{str(key)[:64]}: not a field here (known: {', '.join(fields)})")


def _finding(item: Any, where: str) -> Any:
    if not isinstance(item, dict):
        return item
    item = dict(item)
    _known(item, ("severity", "message", "file"), where)
    severity = item.get("severity")
    if isinstance(severity, str):
        item["severity"] = _SEVERITIES.get(severity.strip().lower(), severity)
    return item


def rejection(verdict: ReviewVerdict) -> str | None:
    """Why the review rejects the work; None when it is reviewed."""
    blocking = [f for f in verdict.findings if f.severity is Severity.BLOCKING]
    if blocking:
        return f"{len(blocking)} blocking finding(s), the first: {blocking[0].message[:300]}"
    if verdict.verdict is VerdictWord.REJECT:
        return "the reviewer rejected the work"
    return None


def diff_of(cwd: Path, patch: Path | None) -> str | None:
    """The child's changes as the reviewer sees them (at most :data:`MAX_DIFF_BYTES`): its
    worktree's captured patch, else ``git diff HEAD`` of ``cwd`` plus the untracked files' names;
    None when ``cwd`` is not in a git repository."""
    from pisub.errors import WorktreeError
    from pisub.worktrees.git import run_git

    if patch is not None:
        try:
            with open(patch, "rb") as f:
                return _cut(f.read(MAX_DIFF_BYTES + 1))
        except OSError:
            pass
    try:
        if run_git(cwd, ["rev-parse", "--is-inside-work-tree"], what="find the tree", check=False).returncode:
            return None
        diff = run_git(
            cwd, ["diff", "HEAD", "--no-color", "--no-ext-diff"], what="diff the tree", check=False
        )
        untracked = run_git(
            cwd, ["ls-files", "--others", "--exclude-standard", "-z"], what="list new files", check=False
        )
    except WorktreeError:
        return None
    names = [n.decode("utf-8", "replace") for n in untracked.stdout.split(b"\0") if n][:200]
    text = diff.stdout[: MAX_DIFF_BYTES + 1]
    listed = "".join(f"\nnew file (untracked): {n}" for n in names)
    return _cut(text) + listed


def _cut(data: bytes) -> str:
    text = data[:MAX_DIFF_BYTES].decode("utf-8", "replace")
    return text + ("\n[... the diff is longer; read the files]" if len(data) > MAX_DIFF_BYTES else "")
