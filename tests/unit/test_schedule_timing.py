"""The timing of schedules (``spec/schedules.md``): pure functions of "now", no clock."""

from __future__ import annotations

import pytest

from pisub.errors import InvalidInput
from pisub.protocol.schedule import (
    MIN_EVERY_S,
    ON_TIME_S,
    Trigger,
    TriggerKind,
    check_id,
    due,
    epoch,
    first_slot,
    iso,
    next_after,
    parse_at,
    parse_every,
)

NOW = 1_800_000_000.0


def test_at_relative_and_iso() -> None:
    assert parse_at("+10m", NOW) == NOW + 600
    assert parse_at("+30s", NOW) == NOW + 30
    assert parse_at("+2h", NOW) == NOW + 7200
    assert parse_at("+1d", NOW) == NOW + 86400
    later = iso(NOW + 3600)
    assert parse_at(later, NOW) == pytest.approx(NOW + 3600)
    assert parse_at("2030-01-01T10:00:00+01:00", NOW) == epoch("2030-01-01T09:00:00Z")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("+0m", "not in the future"),
        ("+10x", "neither"),
        ("10m", "neither"),
        ("2030-01-01T10:00:00", "no zone"),
        ("2020-01-01T10:00:00Z", "not in the future"),
        ("", "give"),
        ("tomorrow", "neither"),
    ],
)
def test_at_refused(text: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        parse_at(text, NOW)


def test_every() -> None:
    assert parse_every("1m") == MIN_EVERY_S
    assert parse_every("6h") == 6 * 3600
    assert parse_every("2w") == 14 * 86400
    for bad in ("30s", "0m", "day", "1", "1 h", "-1h", "1.5h"):
        with pytest.raises(InvalidInput, match="every"):
            parse_every(bad)


def test_ids() -> None:
    assert check_id("nightly-review.v2") == "nightly-review.v2"
    for bad in ("", "-x", ".x", "a" * 65, "a/b", "a b", "é"):
        with pytest.raises(InvalidInput):
            check_id(bad)


def test_interval_anchored_at_creation_no_drift() -> None:
    trigger = Trigger(kind=TriggerKind.EVERY, every="1h", every_s=3600, anchor_at=iso(NOW))
    first = first_slot(trigger, NOW)
    assert first == NOW + 3600
    assert due(first, 3600, NOW + 3599) is None
    on_time = due(first, 3600, first + 40)
    assert on_time is not None
    assert (on_time.planned, on_time.older, on_time.next_at) == (first, 0, first + 3600)
    assert on_time.on_time()
    # three and a half hours late: the newest slot is due, two older ones passed, no drift
    late = due(first, 3600, first + 3.5 * 3600)
    assert late is not None
    assert late.planned == first + 3 * 3600
    assert late.older == 3
    assert late.first_older == first
    assert late.next_at == first + 4 * 3600
    assert late.late == 1800
    assert not late.on_time()


def test_one_shot() -> None:
    at = NOW + 60
    assert due(at, None, NOW) is None
    slot = due(at, None, at + ON_TIME_S - 1)
    assert slot is not None and slot.next_at is None and slot.older == 0 and slot.on_time()
    late = due(at, None, at + ON_TIME_S + 1)
    assert late is not None and not late.on_time()
    assert due(None, None, NOW) is None


def test_next_after_keeps_the_grid() -> None:
    assert next_after(NOW, 60, NOW - 5) == NOW
    assert next_after(NOW, 60, NOW) == NOW + 60
    assert next_after(NOW, 60, NOW + 61) == NOW + 120


def test_iso_round_trip() -> None:
    assert epoch(iso(NOW + 0.123)) == pytest.approx(NOW + 0.123)
    assert iso(NOW).endswith("Z")
