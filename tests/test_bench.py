"""scripts/bench.py --quick keeps working (CI asserts no times)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.pi
def test_bench_quick_runs(tmp_path: Path, pi_bin: str) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PISUB_PI_BIN": pi_bin},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert {"launch", "control", "throughput", "footprint", "scale_20", "list", "pi"} <= set(data)
    assert "| section | measurement | pisub | baseline / ratio |" in proc.stdout
