"""Real NFSv4.2 (opt-in: ``scripts/test.sh --nfs``, about 6 minutes): ``scripts/nfs-test.sh``
boots a QEMU guest with an NFS server and two clients (own network namespaces and host names),
puts the home on the export and checks, on the real thing, what ``test_split_brain.py`` checks
with doubles: a reader on client 2 never repairs a run whose runner lives on client 1 — also
while client 1 is cut off longer than the NFS lease (its lock silently lost)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.nfs, pytest.mark.root]


def test_a_run_on_one_nfs_client_is_never_repaired_from_another(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (packages, the guest's 9p root)")
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "nfs-test.sh"), str(ROOT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "ALL PASS" in proc.stdout
