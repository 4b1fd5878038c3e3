"""The child's acceptance report: the last fenced ```acceptance-report block of its final
output, read tolerantly (known synonyms, snake_case keys, a wrapper object, string booleans,
a single string where a list is expected) and strictly otherwise (an unknown or ambiguous key
is an error naming its field). The block is removed from the output the caller gets; the raw
transcript keeps it."""

from __future__ import annotations

import json
import re
from typing import Any

from pisub.errors import InvalidInput
from pisub.protocol.acceptance import AcceptanceSpec, EvidenceKind, Level

FENCE = "acceptance-report"
_BLOCK = re.compile(r"^```acceptance-report[ \t]*\n(.*?)\n```[ \t]*$", re.DOTALL | re.MULTILINE)
MAX_REPORT_CHARS = 64 * 1024

FIELDS: dict[str, tuple[str, ...]] = {
    "status": ("status", "result", "outcome"),
    "changedFiles": ("changedFiles", "changed_files", "filesChanged", "files_changed", "files"),
    "testsAdded": ("testsAdded", "tests_added", "tests", "newTests", "new_tests"),
    "commandsRun": ("commandsRun", "commands_run", "commands"),
    "validationOutput": ("validationOutput", "validation_output", "validation"),
    "residualRisks": ("residualRisks", "residual_risks", "risks"),
    "noStagedFiles": ("noStagedFiles", "no_staged_files"),
    "diffSummary": ("diffSummary", "diff_summary", "summary"),
    "reviewFindings": ("reviewFindings", "review_findings", "findings"),
    "manualNotes": ("manualNotes", "manual_notes", "notes"),
}
"""Each field of a report and the names a model may give it."""

LISTS = {"changedFiles", "testsAdded", "commandsRun", "residualRisks", "reviewFindings"}
TEXTS = {"status", "validationOutput", "diffSummary", "manualNotes"}
BOOLEANS = {"noStagedFiles"}

EVIDENCE_FIELD: dict[EvidenceKind, str] = {
    EvidenceKind.CHANGED_FILES: "changedFiles",
    EvidenceKind.TESTS_ADDED: "testsAdded",
    EvidenceKind.COMMANDS_RUN: "commandsRun",
    EvidenceKind.VALIDATION_OUTPUT: "validationOutput",
    EvidenceKind.RESIDUAL_RISKS: "residualRisks",
    EvidenceKind.NO_STAGED_FILES: "noStagedFiles",
    EvidenceKind.DIFF_SUMMARY: "diffSummary",
    EvidenceKind.REVIEW_FINDINGS: "reviewFindings",
    EvidenceKind.MANUAL_NOTES: "manualNotes",
}

_WRAPPERS = ("acceptanceReport", "acceptance_report", "report", "acceptance")


def prompt_section(spec: AcceptanceSpec) -> str:
    """What a child asked for ``attested`` or stricter is told to report, appended to its task."""
    lines = ["", "---", "Acceptance: when you are done, end your reply with exactly one block:", ""]
    lines += [
        f"```{FENCE}",
        '{"status": "done", "changedFiles": [], "testsAdded": [], "commandsRun": [], '
        '"validationOutput": "", "residualRisks": [], "noStagedFiles": true, "manualNotes": ""}',
        "```",
        "",
    ]
    if spec.criteria:
        lines.append("It must meet these criteria:")
        lines += [f"- {c}" for c in spec.criteria]
    if spec.evidence:
        lines.append("Give this evidence (non-empty): " + ", ".join(e.value for e in spec.evidence) + ".")
    return "\n".join(lines)


def wants_report(spec: AcceptanceSpec) -> bool:
    """Whether the child is asked for a report — and so whether the block is taken out of the
    output the caller gets, however the run ends: ``report`` when given, else ``attested`` and
    ``checked`` (the levels that are the report). The combinations that contradict the level
    (``report: off`` with attested/checked, ``on`` with none) are refused at launch."""
    if spec.report is not None:
        return spec.report == "on"
    return spec.level in (Level.ATTESTED, Level.CHECKED)


def without_report(output: str) -> str:
    """``output`` without its report block (the last closed one), as the caller gets it."""
    if unterminated(output):
        return output  # its last report line opens no block: an earlier block is not the report
    return extract(output)[1]


_OPENING = re.compile(r"^```acceptance-report[ \t]*$", re.MULTILINE)


def unterminated(output: str) -> bool:
    """Whether the last ```acceptance-report line opens a block that is never closed (then an
    earlier, closed block is not taken for the report)."""
    openings = list(_OPENING.finditer(output))
    if not openings:
        return False
    blocks = list(_BLOCK.finditer(output))
    return not blocks or blocks[-1].start() < openings[-1].start()


def extract(output: str) -> tuple[str | None, str]:
    """The last report block's text (None when there is none) and the output without it."""
    blocks = list(_BLOCK.finditer(output))
    if not blocks:
        return None, output
    last = blocks[-1]
    stripped = (output[: last.start()] + output[last.end() :]).rstrip() + (
        "\n" if output.endswith("\n") else ""
    )
    return last.group(1)[:MAX_REPORT_CHARS], stripped


def parse(text: str) -> dict[str, Any]:
    """The report as ``{field: value}`` in the canonical names.

    Raises:
        InvalidInput: not a JSON object, or a key that is unknown or given twice (naming
            ``acceptance-report.<key>``), or a value of the wrong kind.
    """
    data = load_block(text, FENCE, _WRAPPERS)
    found: dict[str, Any] = {}
    for key, value in data.items():
        field = _field(str(key))
        if field in found:
            raise InvalidInput(f"{FENCE}.{key}: {field} is given twice (ambiguous)")
        found[field] = _value(field, value, f"{FENCE}.{key}")
    return found


def _field(key: str) -> str:
    for field, names in FIELDS.items():
        if key in names or key.lower() == field.lower():
            return field
    raise InvalidInput(f"{FENCE}.{key}: not a report field (known: {', '.join(FIELDS)})")


def clean_text(value: str, where: str) -> str:
    """``value`` when it is text a file can hold: no NUL, no lone surrogate (JSON's ``\\ud800``).

    Raises:
        InvalidInput: naming ``where``.
    """
    if "\0" in value:
        raise InvalidInput(f"{where}: holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{where}: holds a lone surrogate (not text)") from None
    return value


def clean_texts(value: Any, where: str) -> None:
    """Every string in ``value`` (keys too) passes :func:`clean_text`.

    Raises:
        InvalidInput: naming the field.
    """
    if isinstance(value, str):
        clean_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            clean_text(str(key), where)
            clean_texts(item, f"{where}.{str(key)[:64]}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            clean_texts(item, f"{where}[{i}]")


def _value(field: str, value: Any, where: str) -> Any:
    if field in LISTS:
        if isinstance(value, str):
            return [clean_text(value, where)] if value.strip() else []
        if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            return [clean_text(str(v), f"{where}[{i}]") for i, v in enumerate(value)]
        raise InvalidInput(f"{where}: expected a list of strings")
    if field in BOOLEANS:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "yes", "false", "no"):
            return value.strip().lower() in ("true", "yes")
        raise InvalidInput(f"{where}: expected true or false")
    if isinstance(value, str):
        return clean_text(value, where)
    raise InvalidInput(f"{where}: expected a string")


def load_block(text: str, fence: str, wrappers: tuple[str, ...]) -> dict[str, Any]:
    """A fenced block's JSON object, strictly: no key given twice, no ``NaN``/``Infinity``, one
    wrapper object (a key of ``wrappers``) taken off.

    Raises:
        InvalidInput: naming ``fence``.
    """

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                raise InvalidInput(f"{fence}.{str(key)[:64]}: given twice (ambiguous)")
            found[key] = value
        return found

    def no_constant(name: str) -> Any:
        raise InvalidInput(f"{fence}: {name} is not a JSON value")

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except InvalidInput:
        raise
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{fence}: not JSON ({exc})") from None
    if isinstance(data, dict) and len(data) == 1:
        (only,) = data
        if only in wrappers and isinstance(data[only], dict):
            data = data[only]
    if not isinstance(data, dict):
        raise InvalidInput(f"{fence}: expected a JSON object, not {type(data).__name__}")
    return data


def missing_evidence(spec: AcceptanceSpec, report: dict[str, Any]) -> list[str]:
    """The evidence ``spec`` asks for that the report does not give (empty counts as missing;
    ``no-staged-files`` must be true)."""
    missing = []
    for kind in spec.evidence or []:
        value = report.get(EVIDENCE_FIELD[kind])
        if value in (None, "", [], False):
            missing.append(kind.value)
    return missing
