"""The one-node Slurm cluster of ``scripts/slurm-up.sh``, for the tests that place runs on it.

Under CI (``PISUB_REQUIRE_SLURM=1``, set by ``scripts/test.sh`` once the cluster is up) a missing
cluster fails the test; elsewhere the test is skipped with the command that starts one.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def slurm_ready() -> str | None:
    """Why Slurm cannot be used here, or None when it can."""
    if shutil.which("sbatch") is None:
        return "sbatch is not installed: run scripts/slurm-up.sh"
    try:
        out = subprocess.run(
            ["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo failed ({exc}): run scripts/slurm-up.sh"
    if out.returncode != 0 or not out.stdout.strip():
        last = (out.stderr.strip().splitlines() or [""])[-1]
        return f"no Slurm cluster answers ({last}): run scripts/slurm-up.sh and export SLURM_CONF"
    return None


def need_slurm() -> None:
    why = slurm_ready()
    if why is None:
        return
    if os.environ.get("PISUB_REQUIRE_SLURM") == "1":
        pytest.fail(why)
    pytest.skip(why)


def squeue_ids() -> set[str]:
    out = subprocess.run(
        ["squeue", "--noheader", "--format=%i"], capture_output=True, text=True, timeout=10, check=False
    )
    return set(out.stdout.split())
