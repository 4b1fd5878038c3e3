"""The shared base Struct and strict encode/decode helpers for every pisub file."""

from __future__ import annotations

import datetime as _dt
from typing import Any, TypeVar

import msgspec

from pisub.errors import ProtocolError
from pisub.termsafe import printable

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
        from pisub.protocol.json_words import problem

        raise ProtocolError(f"{printable(what)}: not valid JSON ({problem(data, exc)})") from exc
    except RecursionError:
        raise ProtocolError(f"{printable(what)}: nested too deeply") from None


def decode_input(data: bytes | str, type_: type[T], what: str) -> T:
    """:func:`decode` for input from outside (a tasks or lanes file): a key given twice in any
    object is refused too (msgspec would keep the last: which one was meant?).

    Raises:
        ProtocolError: as :func:`decode`; `` `KEY` is given twice - at `$.path.KEY` ``.
    """
    from pisub.protocol.json_words import duplicate_key

    value = decode(data, type_, what)
    twice = duplicate_key(data)
    if twice is not None:
        raise ProtocolError(f"{printable(what)}: {twice}")
    return value


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
