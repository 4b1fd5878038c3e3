"""Files written by pisub stay readable across versions: today's v1 fixtures decode, and so do
the same files with fields a later version might add (readers ignore what they do not know).
Input from outside — control requests, agent frontmatter — stays strict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pisub.errors import ProtocolError
from pisub.protocol import Event, Manifest, Result, Status, decode
from pisub.protocol.control import Receipt, decode_request
from pisub.protocol.lease import Brief, LeaseOwner

ROOT = Path(__file__).resolve().parents[2]
V1 = ROOT / "fixtures" / "v1"

WRITTEN_BY_PISUB: list[tuple[str, type]] = [
    ("manifest", Manifest),
    ("status", Status),
    ("result", Result),
    ("receipt", Receipt),
    ("lease", LeaseOwner),
    ("brief", Brief),
]


def _with_extra_fields(value: Any, depth: int = 0) -> Any:
    """``value`` with an unknown field added to every object, at every level."""
    if isinstance(value, dict):
        out = {k: _with_extra_fields(v, depth + 1) for k, v in value.items()}
        out[f"addedInV2Level{depth}"] = {"nested": [1, "two", None]}
        return out
    if isinstance(value, list):
        return [_with_extra_fields(v, depth + 1) for v in value]
    return value


@pytest.mark.parametrize(("name", "type_"), WRITTEN_BY_PISUB)
def test_todays_fixture_decodes(name: str, type_: type) -> None:
    decode((V1 / f"{name}.json").read_bytes(), type_, name)


@pytest.mark.parametrize(("name", "type_"), WRITTEN_BY_PISUB)
def test_a_later_version_with_added_fields_still_decodes(name: str, type_: type) -> None:
    original = json.loads((V1 / f"{name}.json").read_bytes())
    newer = json.dumps(_with_extra_fields(original)).encode()
    assert decode(newer, type_, name) == decode(json.dumps(original).encode(), type_, name)


def test_events_with_added_fields_decode() -> None:
    for line in (V1 / "events.jsonl").read_bytes().splitlines():
        newer = json.dumps(_with_extra_fields(json.loads(line))).encode()
        decode(newer, Event, "event")


def test_wrong_types_are_still_errors_that_name_the_field() -> None:
    raw = (V1 / "status.json").read_bytes()
    with pytest.raises(ProtocolError, match=r"\$\.state"):
        decode(raw.replace(b'"state": "complete"', b'"state": "sleeping"'), Status, "status.json")
    with pytest.raises(ProtocolError, match=r"Expected `int`.*\$\.steps\[0\]\.index"):
        decode(raw.replace(b'"index": 0', b'"index": "0"'), Status, "status.json")
    with pytest.raises(ProtocolError, match="not valid JSON"):
        decode(raw[:20], Status, "status.json")


def test_requests_from_outside_stay_strict() -> None:
    request = json.loads((V1 / "request.json").read_bytes())
    decode_request(json.dumps(request).encode())
    with pytest.raises(ProtocolError, match=r"unknown field `bogus`"):
        decode_request(json.dumps({**request, "bogus": 1}).encode())
