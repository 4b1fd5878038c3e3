"""scripts/bench.py --quick keeps working (CI asserts no times)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.pi
def test_bench_quick_runs(tmp_path: Path, pi_bin: str) -> None:
    """Beside other tests (no time is asserted; its figures are then meaningless, its working is
    not): the longest test of the suite, it runs first on an xdist worker (tests/durations.txt),
    where it overlaps the others instead of adding its minute alone to the serial pass. Every
    process it starts is its own (its baselines carry its own PISUB_BENCH_TAG)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard: on a loaded machine the quick run took 257 s alone
        env={**os.environ, "PISUB_PI_BIN": pi_bin},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    expected = {"launch", "control", "throughput", "footprint", "scale_20", "commands", "list_running"}
    assert expected | {"top", "fanout", "pi"} <= set(data)
    assert {"external_8"} <= set(data["fanout"])
    assert "| section | measurement | pisub | baseline / ratio |" in proc.stdout


@pytest.mark.serial  # a scan of every sleep on the machine (another bench's would count)
def test_the_launch_section_spares_a_bystanders_sleep(tmp_path: Path) -> None:
    """Another user's ``sleep 3600`` (here, one of this test's) outlives the benchmark's launch
    section, whose own ``sleep 3600`` baselines are all ended."""
    bystander = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "bench.py"),
                "--quick",
                "--only",
                "launch",
                "--out",
                str(tmp_path / "bench.json"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert bystander.poll() is None, "the benchmark killed a process it did not start"
        assert not [pid for pid in _sleeps() if _bench_tagged(pid)], "a baseline's sleep 3600 was left"
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


def _sleeps() -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{name}/cmdline").read_bytes() == b"sleep\x003600\x00":
                    found.append(int(name))
    return found


def _bench_tagged(pid: int) -> bool:
    try:
        return b"PISUB_BENCH_TAG=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
