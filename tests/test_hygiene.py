"""Our own scripts and tests: they end only processes they started, and a wait that times out
fails (issue 23)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

KILL_BY_PATTERN = re.compile(r"\b(pkill|killall)\b|\bpgrep\b.*\bkill\b")
"""Commands that end processes by name or pattern: whatever matches on the machine, ours or not."""


def _sources(*suffixes: str) -> list[Path]:
    return [
        path
        for folder in ("scripts", "tests")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in suffixes and path != Path(__file__)
    ]


def test_no_script_or_test_ends_processes_by_pattern() -> None:
    """By pid, or by the run's own process tree (pisub stop, the pids a run records) — never
    ``pkill -f``, which on a shared machine ends another benchmark's runs and anyone's sleep."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _sources(".py", ".sh")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if KILL_BY_PATTERN.search(line)
    ]
    assert not found, "\n".join(found)


def test_tests_wait_with_the_helper_that_fails_on_timeout() -> None:
    """``pisub.core.polling.poll`` returns None on timeout, so a test that waits with it and forgets
    to assert passes when the wait times out: tests wait with ``tests.conftest.wait_for``."""
    found = []
    for path in _sources(".py"):
        if not path.is_relative_to(ROOT / "tests"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _imports_polling(node):
                found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}")
    assert not found, f"tests importing pisub.core.polling (use wait_for): {found}"


def _imports_polling(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.module == "pisub.core.polling"
    return isinstance(node, ast.Import) and any(alias.name == "pisub.core.polling" for alias in node.names)
