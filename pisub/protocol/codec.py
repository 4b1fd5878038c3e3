"""The shared base Struct and strict encode/decode helpers for every pisub file."""

from __future__ import annotations

import datetime as _dt
from typing import Any, TypeVar

import msgspec

from pisub.errors import ProtocolError
from pisub.termsafe import is_utf8, printable

SCHEMA_VERSION = 1
"""The ``v`` of every file this version of pisub writes."""

T = TypeVar("T")


class Record(msgspec.Struct, rename="camel", kw_only=True):
    """Base of every file pisub writes for readers: camelCase on disk; a reader ignores fields
    it does not know, so a newer pisub may add fields without breaking older readers."""


class StrictRecord(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    """Base of input from outside (control requests, agent files): unknown fields are errors
    that name the field."""


_encoder = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    """Encode ``obj`` as compact JSON."""
    return _encoder.encode(obj)


def encode_pretty(obj: Any) -> bytes:
    """Encode ``obj`` as indented JSON with a trailing newline (for files people read)."""
    return msgspec.json.format(_encoder.encode(obj), indent=2) + b"\n"


def decode(data: bytes | str, type_: type[T], what: str) -> T:
    """Decode ``data`` strictly as ``type_``.

    Raises:
        ProtocolError: naming ``what`` (escaped: it may be an undecodable file name) and,
            where msgspec can tell, the bad field.
    """
    try:
        return msgspec.json.decode(data, type=type_, strict=True)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"{printable(what)}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"{printable(what)}: not valid JSON ({json_problem(data, exc)})") from exc
    except RecursionError:
        raise ProtocolError(f"{printable(what)}: nested too deeply") from None


def json_problem(data: bytes | str, exc: msgspec.DecodeError) -> str:
    """What is wrong with JSON text msgspec refused: its own words, except where they mislead
    — it calls a ``\\uD800``-``\\uDFFF`` escape that is not half of a surrogate pair "truncated"
    (such an escape names no character, so the text is not Unicode)."""
    if "truncated" in str(exc) and _lone_surrogate(data):
        return "a \\u escape of half a surrogate pair, which is no character"
    return str(exc)


def _lone_surrogate(data: bytes | str) -> bool:
    """Whether ``data`` parses as JSON (as Python's parser, which lets them by, reads it) with a
    lone surrogate in a string."""
    import json

    found = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        found = found or any(_has_surrogate(key) or _has_surrogate(value) for key, value in items)
        return dict(items)

    try:
        top = json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return False
    return found or _has_surrogate(top) or (isinstance(top, list) and any(map(_has_surrogate, top)))


def _has_surrogate(value: Any) -> bool:
    return isinstance(value, str) and not is_utf8(value)


def duplicate_key(data: bytes | str) -> str | None:
    """``KEY` is given twice - at `$...``` for JSON text one of whose objects gives a key twice
    (msgspec keeps the last silently: strict input refuses it); None when no object does or the
    text is not JSON."""
    import json

    calls: list[list[str]] = []  # each object's duplicates, innermost first: the top's last

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        twice = []
        for key, _value in items:
            if key in seen:
                twice.append(key)
            seen.add(key)
        calls.append(twice)
        return dict(items)

    try:
        json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    if calls and calls[-1]:
        key = calls[-1][0]
        return f"`{printable(key, one_line=True)}` is given twice - at `$.{printable(key, one_line=True)}`"
    nested = next((twice[0] for twice in calls if twice), None)
    if nested is None:
        return None
    return f"`{printable(nested, one_line=True)}` is given twice in one object - inside `$`"


def convert(obj: Any, type_: type[T], what: str) -> T:
    """Convert already-parsed data (e.g. YAML) strictly into ``type_``."""
    try:
        return msgspec.convert(obj, type=type_, strict=True)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"{what}: {exc}") from exc
    except RecursionError:
        raise ProtocolError(f"{what}: nested too deeply") from None


def now_iso() -> str:
    """The current UTC time as ISO 8601 with milliseconds and a ``Z``."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(value: str) -> float:
    """Seconds since the epoch of a timestamp written by :func:`now_iso`."""
    return _dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
