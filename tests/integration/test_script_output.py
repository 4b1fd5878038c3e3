"""A workflow script's stdout and stderr are capped like a child's output, in ``script.log``:
whatever way it prints (print, sys.stderr, a raw descriptor write, a process it starts), the
first ``outputCap`` bytes are kept, the rest counted and dropped with an event, and
``runner.log`` keeps only the runner's own lines, the tail a crash repair reads."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pisub.api.client import launch_workflow
from pisub.defaults import DEFAULT_OUTPUT_CAP
from tests.helpers import run_events, write_script

LINE = 1001  # "x" * 1000 and its newline

FLOOD = f"""
import os, subprocess, sys

async def main(runs, state, args):
    for _ in range(100_000):
        print("x" * 1000)
    for _ in range(50_000):
        print("e" * 1000, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    for _ in range(20_000):
        os.write(1, b"y" * 1000 + b"\\n")
    flood = "import os\\nfor _ in range(30_000): os.write(2, b'z' * 1000 + b'\\\\n')"
    subprocess.run([{sys.executable!r}, "-c", flood], check=True)
    return "done"
"""
FLOOD_BYTES = (100_000 + 50_000 + 20_000 + 30_000) * LINE

CRASH = """
async def main(runs, state, args):
    for _ in range(20_000):
        print("x" * 1000)
    runs._admission.table.host.post(lambda: 1 / 0)  # the coordinator itself fails, on its loop
    while True:
        print("x" * 1000)  # ...while the script floods on until the process is gone
"""


def test_a_flood_of_prints_is_kept_to_the_cap_counted_and_the_workflow_completes(
    home: Path, tmp_path: Path
) -> None:
    run = launch_workflow(write_script(tmp_path, FLOOD))
    result = run.wait(timeout=120)
    assert result.state == "complete", result.content[0].text
    assert result.content[0].text == "done"
    assert os.path.getsize(run.paths.script_log) == DEFAULT_OUTPUT_CAP
    assert os.path.getsize(run.paths.runner_log) < 4096  # the runner's own lines only
    events = run_events(run)
    capped = [e for e in events if e["type"] == "workflow.script_output_capped"]
    assert len(capped) == 1 and capped[0]["data"]["cap"] == DEFAULT_OUTPUT_CAP
    dropped = [e["data"] for e in events if e["type"] == "workflow.script_output_dropped"]
    assert dropped == [
        {
            "cap": DEFAULT_OUTPUT_CAP,
            "kept": DEFAULT_OUTPUT_CAP,
            "dropped": FLOOD_BYTES - DEFAULT_OUTPUT_CAP,
            "path": str(run.paths.script_log),
        }
    ]


def test_a_flooding_script_never_crowds_the_runners_last_lines_out_of_crash_repair(
    home: Path, tmp_path: Path
) -> None:
    run = launch_workflow(write_script(tmp_path, CRASH))
    result = run.wait(timeout=120)
    assert result.state == "failed"
    message = result.content[0].text
    assert "runner.log ends with:" in message, message
    assert "the coordinator is failing" in message and "ZeroDivisionError" in message, message
    assert "xxxx" not in message
    assert os.path.getsize(run.paths.runner_log) < 16 * 1024
    assert 0 < os.path.getsize(run.paths.script_log) <= DEFAULT_OUTPUT_CAP
