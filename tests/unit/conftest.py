"""Fixtures of the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from pisub.core.fsio import private_mkdir
from pisub.store.paths import RunPaths

RUN_ID = "0" * 8 + "-0000-4000-8000-" + "0" * 12


@pytest.fixture
def bare_run(tmp_path: Path) -> RunPaths:
    """A run directory with its inbox and outbox and nothing else (no runner)."""
    paths = RunPaths(tmp_path / RUN_ID)
    private_mkdir(paths.root)
    for directory in paths.control_dirs():
        private_mkdir(directory)
    return paths
