"""Hostile request files: each is rejected with a receipt, the runner survives, the next request works."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pisub
from pisub.store.mailbox import parse_request_file
from tests.conftest import AgentMaker, wait_for

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
REQUEST_LIKE = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 2, "1", None]), "type": st.sampled_from(["steer", "follow_up", "dance", 3])},
    optional={
        "message": JSON_VALUES,
        "mode": JSON_VALUES,
        "child": JSON_VALUES,
        "id": JSON_VALUES,
        "extra": JSON_VALUES,
    },
)
HOSTILE = (
    st.binary(max_size=300)
    | JSON_VALUES.map(lambda v: json.dumps(v).encode())
    | REQUEST_LIKE.map(lambda v: json.dumps(v).encode())
    | st.integers(min_value=1, max_value=100_000).map(lambda depth: b"[" * depth + b"]" * depth)
    | st.text(max_size=50).map(lambda t: t.encode("utf-8", "surrogatepass"))
    | st.just(b'{"v":1,"type":"steer","message":"\\ud800"}')
    | st.just(b"\xff\xfe\x00\x00")
    | st.just(b"")
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # examples: the profile's
@given(data=HOSTILE)
def test_parser_never_raises(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(data)
    parsed = parse_request_file(path)
    assert (parsed.request is None) != (parsed.error is None)
    assert parsed.request_id


def test_runner_survives_a_barrage(home: Path, make_agent: AgentMaker) -> None:
    make_agent("sleepy", command="sleep", args=["600"])
    run = pisub.launch("sleepy", "x")
    samples: list[bytes] = []

    @settings(max_examples=60, database=None)
    @given(data=HOSTILE)
    def collect(data: bytes) -> None:
        samples.append(data)

    collect()
    tmp, new = run.dir / "inbox" / "tmp", run.dir / "inbox" / "new"
    for n, data in enumerate(samples):
        (tmp / f"h{n:04d}.json").write_bytes(data)
        os.rename(tmp / f"h{n:04d}.json", new / f"h{n:04d}.json")
    (tmp / "zzzz-stop.json").write_bytes(b'{"v":1,"type":"stop"}')
    os.rename(tmp / "zzzz-stop.json", new / "zzzz-stop.json")
    result = run.wait(timeout=60)
    assert result.state == "stopped", "the valid request after the barrage still works"
    stop = run.receipt("zzzz-stop")
    assert stop is not None and stop.state == "delivered"
    receipts = {p.stem for p in (run.dir / "outbox").glob("*.json")}
    for n, data in enumerate(samples):
        name = f"h{n:04d}"
        # A bad request that still names a valid `id` is answered under it (spec/protocol.md)
        (home / f"{name}.json").write_bytes(data)
        expected = parse_request_file(home / f"{name}.json").request_id
        (home / f"{name}.json").unlink()
        assert expected in receipts, f"hostile file {name} got no receipt (as {expected!r})"
    wait_for(lambda: not list(new.iterdir()))
