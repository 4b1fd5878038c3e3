"""A launch whose manifest would be larger than a run's files may be is refused up front (F6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pisub.errors import InvalidInput
from pisub.protocol.codec import decode, encode_pretty
from pisub.protocol.manifest import Manifest
from pisub.runs.manifest_size import LATE_FIELDS, check_manifest_size
from pisub.store.runs import MAX_FILE

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "v1" / "manifest.json"


def _manifest() -> Manifest:
    return decode(FIXTURE.read_bytes(), Manifest, "manifest.json")


def test_a_manifest_a_run_can_read_back_passes() -> None:
    manifest = _manifest()
    rest = len(encode_pretty(manifest)) - len(manifest.task)
    manifest.task = "x" * (MAX_FILE - LATE_FIELDS - rest)
    check_manifest_size(manifest)


def test_a_manifest_over_the_limit_is_refused_naming_its_size_and_the_limit() -> None:
    manifest = _manifest()
    rest = len(encode_pretty(manifest)) - len(manifest.task)
    manifest.task = "x" * (MAX_FILE - LATE_FIELDS - rest + 1)
    with pytest.raises(InvalidInput) as raised:
        check_manifest_size(manifest)
    message = raised.value.message
    assert "\n" not in message and "16 MiB (16777216 bytes)" in message
    assert f"would be {MAX_FILE + 1} bytes" in message
