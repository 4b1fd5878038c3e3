"""Files under ``<home>/cache/`` that pisub writes for itself: ``pi-versions.json`` and the
verify cache's ``verify/<key>.json``."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from pisub.protocol.acceptance import Outcome
from pisub.protocol.codec import Record

PI_VERSION = r"^[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}$"
"""What ``pi --version`` must have printed: ``X.Y.Z``, ASCII digits."""


class PiVersions(Record, kw_only=True):
    """``<home>/cache/pi-versions.json``: what ``pi --version`` answered, by binary. A file of an
    older pisub (a bare ``{key: version}`` object, no ``v``) still loads; one of another ``v``,
    or one that does not decode, is a cache miss (the versions are asked again)."""

    v: Literal[1]
    versions: dict[str, Annotated[str, msgspec.Meta(pattern=PI_VERSION)]]
    """``<real path>\\0<dev>:<inode>\\0<size>\\0<mtime ns>\\0<ctime ns>`` of a pi binary → its
    version, at most 64 entries (the latest written last)."""


class VerifyCacheEntry(Record, kw_only=True):
    """``<home>/cache/verify/<key>.json``: a verify command's result on one tree state (see
    spec/protocol.md, Acceptance). An entry of an older pisub (no ``v``) loads as v1; one of
    another ``v``, or one that does not decode, is a cache miss (the command runs)."""

    v: Literal[1] = 1
    exit_code: int
    outcome: Outcome
    reason: str | None = None
    at: str
