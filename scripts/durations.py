"""Every test's duration from the JUnit XML reports of one ``scripts/test.sh`` run, slowest first.

``scripts/test.sh`` runs it at the end of every run (the slowest are printed); with
``PISUB_DURATIONS=tests/durations.txt`` the whole list is kept: that is how the committed record
``tests/durations.txt`` is regenerated (as root, as CI runs)::

    PISUB_DURATIONS=tests/durations.txt bash scripts/test.sh

``tests/conftest.py`` reads that record to order the xdist passes slowest first (a test not in it
counts as its module's mean).

Usage: ``python scripts/durations.py junit-PASS.xml ...`` (PASS is taken from the file name).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def node_id(classname: str, name: str) -> str:
    """pytest's node id for a JUnit test case (a module path when the module exists)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        module = Path(*parts[:cut]).with_suffix(".py")
        if (ROOT / module).is_file():
            return "::".join([module.as_posix(), *parts[cut:], name])
    return f"{classname}::{name}"


def rows(report: Path) -> list[tuple[float, str, str, str]]:
    """(seconds, pass, outcome, node id) of every test case in ``report``."""
    name = report.stem.removeprefix("junit-")
    found = []
    for case in ET.parse(report).iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
        nodeid = node_id(case.get("classname", ""), case.get("name", ""))
        found.append((float(case.get("time", "0")), name, outcome, nodeid))
    return found


def main(argv: list[str]) -> int:
    everything = []
    passes: dict[str, list[float]] = {}
    for arg in argv:
        for seconds, name, outcome, nodeid in rows(Path(arg)):
            everything.append((seconds, name, outcome, nodeid))
            passes.setdefault(name, []).append(seconds)
    everything.sort(key=lambda row: (-row[0], row[3]))
    print("# Test durations of one scripts/test.sh run: seconds, pass, outcome, test; slowest first.")
    print("# Regenerate (as root, as CI runs): PISUB_DURATIONS=tests/durations.txt bash scripts/test.sh")
    for name, times in sorted(passes.items()):
        print(f"# pass {name}: {len(times)} tests, {sum(times):.0f} s of test time")
    for seconds, name, outcome, nodeid in everything:
        print(f"{seconds:8.2f}  {name:<12} {outcome:<8} {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
