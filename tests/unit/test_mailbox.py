"""The inbox and outbox as files, without a runner: keys, claims, rejections, repair answers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pisub.errors import InboxClosed, InvalidInput
from pisub.protocol.control import ReceiptState, Steer, Stop
from pisub.store.mailbox import (
    FINISHED_REASON,
    answer_leftovers,
    claim,
    claimed_key,
    close_inbox,
    inbox_needs_answers,
    make_receipt,
    mark_answered,
    needs_answers,
    new_key,
    new_mtime,
    parse_request_file,
    read_receipt,
    reject_file,
    write_receipt,
    write_request,
)
from pisub.store.paths import RunPaths
from tests.helpers import drop_request

STOP = b'{"v":1,"type":"stop"}'

RUN_ID = "0" * 8 + "-0000-4000-8000-" + "0" * 12


@pytest.fixture
def paths(bare_run: RunPaths) -> RunPaths:
    return bare_run


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("a.json", True),
        ("1796031495426-16323-000000-fa23.json", True),
        ("has space.json", False),
        ("x" * 201 + ".json", False),
        (os.fsdecode(b"\xff\xfe.json"), False),
        ("invalid-0123456789abcdef.json", False),  # reserved for the keys of bad names
        ("~tilde.json", False),
    ],
)
def test_a_files_key_is_its_name_or_a_hash_of_it(name: str, valid: bool) -> None:
    key = new_key(name)
    assert (key == name[: -len(".json")]) is valid
    if not valid:
        assert key.startswith("invalid-") and len(key) == len("invalid-") + 16
    assert claimed_key(f"{key}.json") == key == claimed_key(f"{key}~abc123.json")


def test_a_claim_moves_the_file_and_a_second_publish_of_the_name_gets_its_own(paths: RunPaths) -> None:
    drop_request(paths, "a.json", STOP)
    first = claim(paths, "a.json")
    assert first == paths.box("cur") / "a.json" and not (paths.box("new") / "a.json").exists()
    drop_request(paths, "a.json", b'{"v":1,"type":"interrupt"}')
    second = claim(paths, "a.json")
    assert second is not None and second.name.startswith("a~") and second.read_bytes().endswith(b"}")
    assert claim(paths, "gone.json") is None


def test_a_directory_is_claimed_by_rename_and_rejected_as_not_a_file(paths: RunPaths) -> None:
    (paths.box("new") / "d.json").mkdir()
    claimed = claim(paths, "d.json")
    assert claimed is not None and claimed.is_dir() and claimed.parent == paths.box("cur")
    parsed = parse_request_file(claimed, claimed_key(claimed.name), "d.json")
    assert parsed.request is None and "not a regular file (directory" in (parsed.error or "")


def test_parsing_names_every_problem(paths: RunPaths, tmp_path: Path) -> None:
    cur = paths.box("cur")
    (tmp_path / "target").write_bytes(b'{"v":1,"type":"stop"}')
    (cur / "link.json").symlink_to(tmp_path / "target")
    (cur / "big.json").write_bytes(b" " * (300 * 1024))
    (cur / "blank.json").write_bytes(b'{"v":1,"type":"steer","message":"  "}')
    (cur / "reserved.json").write_bytes(b'{"v":1,"type":"stop","id":"invalid-0123456789abcdef"}')
    (cur / "ok.json").write_bytes(b'{"v":1,"type":"steer","message":"hi","id":"mine"}')
    (cur / "twice.json").write_bytes(b'{"v":1,"type":"steer","message":"a","message":"b"}')
    (cur / "tag.json").write_bytes(b'{"v":1,"type":"stop","type":"steer","message":"hi"}')
    (cur / "half.json").write_bytes(b'{"v":1,"type":"stop","reason":"\\ud800"}')
    (cur / "pair.json").write_bytes(b'{"v":1,"type":"stop","reason":"\\ud83d\\ude00 \\\\ud800"}')
    (cur / "ids.json").write_bytes(b'{"v":1,"id":"zz","id":"mine","type":"stop"}')
    names = ("link", "big", "blank", "reserved", "twice", "tag", "half", "ids")
    problems = {name: parse_request_file(cur / f"{name}.json") for name in names}
    assert "symlink" in (problems["link"].error or "")
    assert "larger than" in (problems["big"].error or "")
    assert problems["blank"].error == "`message` is blank - at `$.message`"
    assert problems["reserved"].request_id == "reserved", "a reserved id never keys another file's receipt"
    assert problems["twice"].error == "`message` is given twice - at `$.message`"
    assert problems["tag"].error == "`type` is given twice - at `$.type`"
    assert (
        problems["half"].error
        == "not valid JSON (a \\u escape of half a surrogate pair, which is no character - at `$.reason`)"
    )
    # an id given twice names neither: answered under the file's own key (not the last id's)
    assert (problems["ids"].request_id, problems["ids"].error) == ("ids", "`id` is given twice - at `$.id`")
    pair = parse_request_file(cur / "pair.json")  # a pair is one character; an escaped backslash, text
    assert (
        pair.error is None and pair.request is not None and pair.request.reason == "\N{GRINNING FACE} \\ud800"
    )
    ok = parse_request_file(cur / "ok.json")
    assert ok.error is None and isinstance(ok.request, Steer) and ok.request_id == "mine"


def test_a_rejected_file_keeps_its_reason_beside_it(paths: RunPaths) -> None:
    for _ in range(2):
        path = paths.box("cur") / "bad.json"
        path.write_bytes(b"not json")
        assert reject_file(paths, path, "not valid JSON", "bad")
    names = sorted(p.name for p in paths.box("rejected").iterdir())
    assert names[:2] == ["bad.json", "bad.reason"] and len(names) == 4
    assert names[2].startswith("bad~") and names[3] == names[2].replace(".json", ".reason")


def test_writing_a_request_refuses_a_closed_inbox_and_a_waiting_id(paths: RunPaths) -> None:
    rid = write_request(paths, Stop(v=1, id="s1"))
    assert rid == "s1" and json.loads((paths.box("new") / "s1.json").read_bytes())["type"] == "stop"
    with pytest.raises(InvalidInput, match="already waiting"):
        write_request(paths, Stop(v=1, id="s1"))
    assert not list(paths.box("tmp").iterdir()), "no temp file left"
    close_inbox(paths, "complete")
    with pytest.raises(InboxClosed):
        write_request(paths, Stop(v=1, id="s2"))
    assert not (paths.box("new") / "s2.json").exists()


def test_the_repair_answers_everything_once(paths: RunPaths) -> None:
    drop_request(paths, "fresh.json", b'{"v":1,"type":"steer","message":"hi"}')
    drop_request(paths, "garbage.json", b"\x00")
    (paths.box("cur") / "open.json").write_bytes(b'{"v":1,"type":"steer","message":"x"}')
    write_receipt(paths, make_receipt(RUN_ID, "open", "steer", ReceiptState.QUEUED))
    (paths.box("rejected") / "lost.json").write_bytes(b"?")
    (paths.box("rejected") / "lost.reason").write_text("not valid JSON\n")
    (paths.outbox / "squatter.json").symlink_to("/etc/hostname")
    counts = answer_leftovers(paths, RUN_ID, FINISHED_REASON)
    receipts = {rid: read_receipt(paths, rid) for rid in ("fresh", "garbage", "open", "lost")}
    assert {rid: r.state for rid, r in receipts.items() if r} == {
        "fresh": ReceiptState.FAILED,
        "garbage": ReceiptState.REJECTED,
        "open": ReceiptState.FAILED,
        "lost": ReceiptState.REJECTED,
    }
    assert receipts["lost"] is not None and receipts["lost"].reason == "not valid JSON"
    assert not (paths.outbox / "squatter.json").exists() and list(paths.quarantine.iterdir())
    assert counts["claimed"] == 2
    again = answer_leftovers(paths, RUN_ID, FINISHED_REASON)
    assert (again["failed"], again["rejected"], again["claimed"]) == (0, 0, 0), "nothing is answered twice"


def test_the_answered_marker_is_compared_for_equality_never_order(paths: RunPaths) -> None:
    assert needs_answers(paths)
    mark_answered(paths, new_mtime(paths))
    assert not needs_answers(paths) and not inbox_needs_answers(str(paths.inbox))
    marker = paths.inbox_answered
    later = new_mtime(paths) or 0
    os.utime(marker, ns=(later + 10**12, later + 10**12))  # as after a backward clock step
    assert inbox_needs_answers(str(paths.inbox)) is False, "a differing mtime only costs a listing"
    drop_request(paths, "late.json", STOP)
    assert needs_answers(paths) and inbox_needs_answers(str(paths.inbox))
