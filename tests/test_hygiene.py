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


RETURNS_NONE_ON_TIMEOUT = {"wait_for_receipt", "stop", "steer"}
"""Client waits that answer None (or a receipt of None) when the time ran out."""


def test_no_wait_in_the_tests_passes_when_it_times_out() -> None:
    """A wait whose time runs out must fail the test, saying what it waited for. Forbidden: a
    loop whose condition is the clock (``while time.monotonic() < deadline``: it falls through
    when time is up; write ``while True: assert time.monotonic() < deadline, "<what>"`` or use
    ``wait_for``); a polling loop (``for``, with a sleep and a ``break``) without an ``else`` that
    fails; ``TimeoutExpired`` swallowed (``except …: pass``, ``contextlib.suppress``); the result of
    a client wait that answers None on timeout thrown away; ``join(timeout=…)`` not followed by
    an ``is_alive()`` check."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {why}"
        for path in _sources(".py")
        if path.is_relative_to(ROOT / "tests")
        for line, why in _silent_waits(ast.parse(path.read_text()))
    ]
    assert not found, "waits that pass when they time out:\n" + "\n".join(found)


def _silent_waits(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.While) and _reads_the_clock(node.test):
            found.append((node.lineno, "a loop on the clock falls through when time is up"))
        elif isinstance(node, ast.For) and not node.orelse and _polls(node):
            found.append((node.lineno, "a polling loop without an else that fails"))
        elif isinstance(node, ast.ExceptHandler | ast.With) and _swallows_a_timeout(node):
            found.append((node.lineno, "TimeoutExpired swallowed"))
        for body in _bodies(node):
            found += _thrown_away(body)
    return found


def _reads_the_clock(test: ast.expr) -> bool:
    return any(
        (isinstance(n, ast.Attribute) and n.attr in ("monotonic", "time", "perf_counter"))
        or (isinstance(n, ast.Name) and "deadline" in n.id)
        for n in ast.walk(test)
    )


def _polls(loop: ast.For) -> bool:
    nodes = list(ast.walk(loop))
    return any(_is_call_to(n, "sleep") for n in nodes) and any(isinstance(n, ast.Break) for n in nodes)


def _swallows_a_timeout(node: ast.ExceptHandler | ast.With) -> bool:
    """``except TimeoutExpired: pass`` or ``with contextlib.suppress(TimeoutExpired)``."""
    if isinstance(node, ast.ExceptHandler):
        return _names_timeout(node.type) and all(isinstance(s, ast.Pass) for s in node.body)
    calls = [item.context_expr for item in node.items]
    return any(
        isinstance(c, ast.Call) and _is_call_to(c, "suppress") and any(map(_names_timeout, c.args))
        for c in calls
    )


def _names_timeout(node: ast.AST | None) -> bool:
    return node is not None and "TimeoutExpired" in ast.unparse(node)


def _is_call_to(node: ast.AST, name: str) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == name) or (
        isinstance(func, ast.Name) and func.id == name
    )


def _bodies(node: ast.AST) -> list[list[ast.stmt]]:
    return [
        value
        for field in ("body", "orelse", "finalbody")
        if isinstance(value := getattr(node, field, None), list) and value and isinstance(value[0], ast.stmt)
    ]


def _thrown_away(body: list[ast.stmt]) -> list[tuple[int, str]]:
    """Waits in ``body`` whose answer is dropped: a client wait that answers None on timeout,
    or a ``join(timeout=…)`` whose next statement does not ask ``is_alive()``."""
    found = []
    for i, statement in enumerate(body):
        call = statement.value if isinstance(statement, ast.Expr) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
            continue
        keywords = {k.arg for k in call.keywords}
        if call.func.attr == "wait_for_receipt" or (
            call.func.attr in RETURNS_NONE_ON_TIMEOUT and "wait" in keywords
        ):
            found.append((statement.lineno, f"the answer of {call.func.attr}(…) thrown away"))
        elif call.func.attr == "join" and "timeout" in keywords:
            after = ast.unparse(body[i + 1]) if i + 1 < len(body) else ""
            if "is_alive" not in after:
                found.append((statement.lineno, "join(timeout=…) without an is_alive() check"))
    return found


def test_every_file_pisub_reads_beside_its_modules_is_installed() -> None:
    """A plain `pip install .` shipped without `pisub/workflow/js/prelude.js` (package-data did
    not list it): every JavaScript workflow failed, FileNotFoundError (attack 33, F1). Every
    tracked file under pisub/ other than a module must match a package-data pattern."""
    import fnmatch
    import subprocess
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "pisub"
    ]
    tracked = subprocess.run(
        ["git", "ls-files", "pisub"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    if not tracked:  # not a git checkout (a copy): every file on disk, caches aside
        tracked = [
            str(p.relative_to(ROOT))
            for p in (ROOT / "pisub").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
    data = [name.removeprefix("pisub/") for name in tracked if not name.endswith(".py")]
    assert data, "no data file found"
    missing = [name for name in data if not any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
