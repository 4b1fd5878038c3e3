"""The one function between run-produced text and a terminal: every class of hostile sequence
comes out as visible escapes, everything else as it was."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pisub.termsafe import PrintableStream, printable, printable_bytes

BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI}\u2028\u2029\ud800-\udfff]")

HOSTILE = {
    "OSC title, ST": "\x1b]0;pwned\x1b\\",
    "OSC title, BEL": "\x1b]2;pwned\x07",
    "OSC 52 clipboard": "\x1b]52;c;cm0gLXJmIH4=\x07",
    "OSC 8 hyperlink": "\x1b]8;;http://evil/\x1b\\click\x1b]8;;\x1b\\",
    "CSI clear": "\x1b[2J\x1b[H",
    "SGR conceal": "\x1b[8mhidden\x1b[0m",
    "DCS": "\x1bPq#0;2;0;0;0\x1b\\",
    "APC": "\x1b_Gpayload\x1b\\",
    "PM": "\x1b^privacy\x1b\\",
    "SOS": "\x1bXstring\x1b\\",
    "8-bit CSI": "\x9b2J",
    "8-bit OSC and ST": "\x9d0;pwned\x9c",
    "8-bit DCS": "\x90q\x9c",
    "carriage return": "safe\rEVIL",
    "backspace": "abc\x08\x08\x08",
    "bell": "\x07",
    "DEL": "\x7f",
    "NUL": "\x00",
    "bidi override": "\u202etxt.exe",
    "bidi isolates": "\u2066\u2067\u2068\u2069",
    "bidi marks": "\u200e\u200f\u061c",
    "line separators": "\u2028\u2029",
    "undecodable byte": "\udcff\udc9b",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_class_of_hostile_sequence_is_escaped(name: str) -> None:
    shown = printable(HOSTILE[name])
    assert not UNSAFE.search(shown), (name, shown)
    assert "\x1b" not in shown and "\x9b" not in shown
    assert shown.isascii() or name == "bidi isolates"  # every escape is ASCII


def test_the_escapes_are_visible_and_exact() -> None:
    assert printable("\x1b[2J") == "\\x1b[2J"
    assert printable("\x9b") == "\\x9b"
    assert printable("\u202e") == "\\u202e"
    assert printable("\udcff") == "\\udcff"
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("a\tb\nc", one_line=True) == "a\\x09b\\x0ac"
    assert printable("\r") == "\\x0d"
    assert printable("a\r\nb\rc") == "a\nb\\x0dc"  # a CRLF line end is a newline, a lone CR is not
    assert printable("a\r\nb", one_line=True) == "a\\x0d\\x0ab"


def test_printable_text_is_left_alone() -> None:
    text = "Grüße, 日本語, العربية, Ωμέγα, emoji 🧑‍💻👍🏽, ZWJ kept, ‘quotes’ — and ASCII ~!@#$%^&*()"  # noqa: RUF001
    assert printable(text) == text


def test_bytes_that_are_not_utf8_are_escaped() -> None:
    assert printable_bytes(b"ok \xff\xfe \xe2\x80\xae") == "ok \\udcff\\udcfe \\u202e"
    assert printable_bytes(b"\xc3") == "\\udcc3"


def test_a_character_split_between_chunks_is_decoded_whole() -> None:
    stream = PrintableStream()
    data = "é🧑\u202e\x1b".encode()
    shown = "".join(stream.feed(data[i : i + 1]) for i in range(len(data))) + stream.feed(b"", final=True)
    assert shown == "é🧑\\u202e\\x1b"
    crlf = PrintableStream()
    assert crlf.feed(b"a\r") + crlf.feed(b"\nb\r") + crlf.feed(b"", final=True) == "a\nb\\x0d"
    truncated = PrintableStream()
    assert truncated.feed(b"a\xe2\x80") + truncated.feed(b"", final=True) == "a\\udce2\\udc80"


@given(st.text())
def test_any_string_comes_out_without_a_control(text: str) -> None:
    shown = printable(text)
    assert not UNSAFE.search(shown)
    assert "\x1b" not in printable(text, one_line=True) and "\n" not in printable(text, one_line=True)
    shown.encode("utf-8")  # always encodable (no lone surrogate)


@given(st.binary())
def test_any_bytes_come_out_without_a_control(data: bytes) -> None:
    shown = printable_bytes(data)
    assert not UNSAFE.search(shown)
    shown.encode("utf-8")


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Cf"))))
def test_any_printable_text_is_unchanged(text: str) -> None:
    assert printable(text) == text


def test_invisible_char_and_shows_nothing_name_what_nobody_sees() -> None:
    """The one rule agent names and run labels share (attack 1, finding 13)."""
    from pisub.termsafe import invisible_char, shows_nothing

    found = {"re\u200bviewer": "\u200b", "\ufeff": "\ufeff", "a\tb": "\t", "a\u00a0b": "\u00a0"}
    for text, char in found.items():
        assert invisible_char(text) == char
    assert invisible_char("fix login é 修正 🙂") is None
    assert all(shows_nothing(text) for text in ("\u200b", "\u0301\u0301", "\ue000", " \u3000", "\u2028"))
    assert not any(shows_nothing(text) for text in ("e\u0301", "x", " x", "🙂"))
