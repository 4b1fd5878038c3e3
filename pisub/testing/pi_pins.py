"""The pinned pi versions of a pisub checkout (``scripts/pi-pins.sh``), for tests and benchmarks."""

from __future__ import annotations

import os
import re
from pathlib import Path


def pinned_versions(project: Path) -> list[str]:
    """The pinned versions, the default first."""
    text = (project / "scripts" / "pi-pins.sh").read_text()
    return re.findall(r'"@[^"]+@(\d+\.\d+\.\d+)"', text)


def pinned_pi_bins(project: Path) -> dict[str, Path]:
    """The launchers of the pinned versions that ``scripts/install_pi.sh`` installed, by version
    (in pin order: the default first)."""
    launchers = {v: project / ".pi-cli" / v / "bin" / "pi" for v in pinned_versions(project)}
    return {version: path for version, path in launchers.items() if os.access(path, os.X_OK)}
