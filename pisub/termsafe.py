"""The one function text passes through before it reaches a terminal.

Whatever a child, a model, a task file, an agent file or a workflow script produced may hold
bytes a terminal obeys: an escape sequence (CSI ``ESC [``, OSC ``ESC ]`` ending in BEL or ST,
DCS, APC, PM, SOS, their 8-bit C1 forms such as ``\\x9b``), a lone control character (a
carriage return that overwrites a line, a backspace), a bidi control that reorders what is
shown (U+202E), or bytes that are not UTF-8. :func:`printable` shows every one of them as a
visible escape (``\\x1b``, ``\\x9b``, ``\\u202e``, ``\\udcff`` for an undecodable byte) and
leaves every other character — letters of any script, emoji — as it is. An escape sequence
loses its introducer, so nothing after it is obeyed either.

The pi extension (``api/pi_extension/subagent.ts``, ``termSafe``) escapes the same set.
"""

from __future__ import annotations

import codecs
import re

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Arabic letter mark, LRM, RLM, the embeddings and overrides, the isolates."""
_LINES = "\u2028\u2029"
"""Line and paragraph separators (some terminals and viewers break lines at them)."""
_SURROGATES = "\ud800-\udfff"
"""Lone surrogates: an undecodable byte (``surrogateescape``) or a broken UTF-16 pair."""

_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}{_LINES}{_SURROGATES}]")
_UNSAFE_AND_LINES = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}{_LINES}{_SURROGATES}]")


def is_utf8(text: str) -> bool:
    """Whether ``text`` is Unicode a UTF-8 file can hold: no lone surrogate (an undecodable byte
    of a path or argument read with ``surrogateescape``, or half a UTF-16 pair)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` safe to print to a terminal (and to encode as JSON): C0 controls, DEL, C1
    controls (0x80 to 0x9F), the bidi controls and lone surrogates (the undecodable bytes of a
    file name or log read with ``surrogateescape``) become visible escapes, ``\\xNN`` or
    ``\\uNNNN``. Newlines and tabs stay, unless ``one_line`` (and a CRLF line end is a newline:
    only a carriage return that could overwrite a line is shown). Every other character stays."""
    if one_line:
        return _UNSAFE_AND_LINES.sub(_escape, text)
    return _UNSAFE.sub(_escape, text.replace("\r\n", "\n"))


def has_controls(text: str) -> bool:
    """Whether ``text`` holds a C0 control character (newline and tab included) or DEL: what a
    path or a one-line name given from outside may not hold."""
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


_INVISIBLE = frozenset({"Cf", "Cc", "Zl", "Zp", "Cs"})
"""Unicode categories nobody sees: format characters (zero-width space and joiner, bidi
controls, the BOM), controls (tab included), line and paragraph separators, lone surrogates."""
_SHOWS_NOTHING_ALONE = frozenset({"Zs", "Mn", "Me", "Co", "Cn"})
"""Categories that show nothing on their own: spaces, combining marks, private-use and
unassigned code points."""


def invisible_char(text: str) -> str | None:
    """The first character of ``text`` a reader cannot see — a format (Cf), control (Cc),
    line or paragraph separator, lone surrogate, or a space other than U+0020 — or None.

    A name given from outside (an agent's name, a run's label) holding one is refused, never
    normalised: ``re\u200bviewer`` would otherwise pass for ``reviewer``."""
    import unicodedata

    for char in text:
        category = unicodedata.category(char)
        if category in _INVISIBLE or (category == "Zs" and char != " "):
            return char
    return None


def shows_nothing(text: str) -> bool:
    """Whether ``text`` holds no character a reader can see on its own (only invisible ones,
    spaces, combining marks, private-use or unassigned code points)."""
    import unicodedata

    return all(invisible_char(c) is not None or unicodedata.category(c) in _SHOWS_NOTHING_ALONE for c in text)


def printable_bytes(data: bytes, *, one_line: bool = False) -> str:
    """Bytes (a log) as :func:`printable` text; a byte that is not UTF-8 shows as ``\\udcNN``."""
    return printable(data.decode("utf-8", "surrogateescape"), one_line=one_line)


class PrintableStream:
    """:func:`printable_bytes` over a stream read in chunks (``logs -f``): a UTF-8 character
    (or a CRLF) split between two chunks is taken whole, never shown as two undecodable bytes."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self._cr = ""  # a carriage return at a chunk's end: a CRLF's first half?

    def feed(self, data: bytes, *, final: bool = False) -> str:
        text = self._cr + self._decoder.decode(data, final)
        self._cr = ""
        if text.endswith("\r") and not final:
            text, self._cr = text[:-1], "\r"
        return printable(text)
