from __future__ import annotations

import os
from pathlib import Path

import pytest

from pisub.core.fsio import JsonlAppender, atomic_write, iter_jsonl_lines, read_bytes, temp_name

RECORDS = [b'{"a":1}', b'{"b":"two"}', b'{"c":[3,3,3]}']


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["status.json"]
    assert oct(target.stat().st_mode & 0o777) == "0o600"


def test_temp_names_never_end_in_json(tmp_path: Path) -> None:
    name = temp_name(tmp_path / "status.json").name
    assert name.startswith(".status.json.") and not name.endswith(".json")


def test_read_bytes_does_not_follow_symlinks(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    link = tmp_path / "status.json"
    link.symlink_to(secret)
    with pytest.raises(OSError):
        read_bytes(link)


def test_torn_tail_at_every_offset(tmp_path: Path) -> None:
    """Cut the last record at every byte: earlier records survive, the next append is clean."""
    whole = b"".join(r + b"\n" for r in RECORDS)
    last_start = whole.rindex(b"\n", 0, len(whole) - 1) + 1
    for cut in range(last_start, len(whole)):
        path = tmp_path / f"events-{cut}.jsonl"
        path.write_bytes(whole[:cut])
        assert [line for _, line in iter_jsonl_lines(path.read_bytes())] == RECORDS[:-1]
        appender = JsonlAppender(path)
        appender.append(b'{"d":4}')
        appender.close()
        assert [line for _, line in iter_jsonl_lines(path.read_bytes())] == [*RECORDS[:-1], b'{"d":4}']


def test_torn_only_line(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"half')
    appender = JsonlAppender(path)
    appender.append(b"{}")
    appender.close()
    assert path.read_bytes() == b"{}\n"


def test_a_decode_error_names_an_undecodable_file_in_printable_form(tmp_path: Path) -> None:
    """An error about a file whose name is not UTF-8 can still be printed and written out."""
    from pisub.core.fsio import load_json
    from pisub.errors import ProtocolError
    from pisub.protocol.control import Receipt

    bad = Path(os.fsdecode(bytes(tmp_path) + b"/hostile-\xff\xfe.json"))
    bad.write_bytes(b"{}")
    with pytest.raises(ProtocolError) as caught:
        load_json(bad, Receipt, limit=4096)
    message = str(caught.value)
    assert "hostile-\\udcff\\udcfe.json" in message
    message.encode("utf-8")  # no lone surrogates left
