"""The committed schemas match the code; checked-in v1 files keep decoding."""

from __future__ import annotations

from pathlib import Path

import pytest

from pisub.protocol import Event, Manifest, Result, Status, decode
from pisub.protocol.schema import SCHEMAS, render

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_committed_schema_matches_code(name: str) -> None:
    committed = ROOT / "spec" / "schemas" / f"{name}.json"
    assert committed.exists(), f"run: python scripts/gen_schemas.py ({committed} missing)"
    assert committed.read_text() == render(name), f"{committed} drifted: run python scripts/gen_schemas.py"


def test_no_stale_schema_files() -> None:
    on_disk = {p.stem for p in (ROOT / "spec" / "schemas").glob("*.json")}
    assert on_disk == set(SCHEMAS)


@pytest.mark.parametrize(("name", "type_"), [("manifest", Manifest), ("status", Status), ("result", Result)])
def test_v1_fixtures_decode(name: str, type_: type) -> None:
    decode((ROOT / "fixtures" / "v1" / f"{name}.json").read_bytes(), type_, name)


def test_v1_events_decode() -> None:
    for line in (ROOT / "fixtures" / "v1" / "events.jsonl").read_bytes().splitlines():
        decode(line, Event, "event")
