"""The on-disk protocol: one Struct per file, no I/O.

Every file carries ``v`` (:data:`SCHEMA_VERSION`) and uses camelCase keys. Files pisub writes
for readers (:class:`Record`) are forward-compatible: readers ignore fields they do not know.
Input from outside (requests, agent frontmatter: :class:`StrictRecord`) is strict: unknown
fields and wrong types are errors that name the field.

The names below load on first use (as :mod:`pisub`'s do): ``import pisub.protocol.codec``
pays for the codec alone, not for every Struct of the protocol.
"""

from __future__ import annotations

from pisub.protocol.lazy import TYPE_CHECKING, lazy_names

_HOMES = {
    "AgentFrontmatter": "pisub.protocol.agent",
    "SCHEMA_VERSION": "pisub.protocol.codec",
    "Record": "pisub.protocol.codec",
    "StrictRecord": "pisub.protocol.codec",
    "decode": "pisub.protocol.codec",
    "encode": "pisub.protocol.codec",
    "encode_pretty": "pisub.protocol.codec",
    "now_iso": "pisub.protocol.codec",
    "Event": "pisub.protocol.events",
    "AgentSpec": "pisub.protocol.manifest",
    "Limits": "pisub.protocol.manifest",
    "Manifest": "pisub.protocol.manifest",
    "Details": "pisub.protocol.result",
    "ErrorCode": "pisub.protocol.result",
    "ErrorInfo": "pisub.protocol.result",
    "Result": "pisub.protocol.result",
    "SingleResult": "pisub.protocol.result",
    "TextContent": "pisub.protocol.result",
    "Usage": "pisub.protocol.result",
    "RunState": "pisub.protocol.status",
    "Status": "pisub.protocol.status",
    "StepState": "pisub.protocol.status",
    "StepStatus": "pisub.protocol.status",
}

__all__ = [
    "SCHEMA_VERSION",
    "AgentFrontmatter",
    "AgentSpec",
    "Details",
    "ErrorCode",
    "ErrorInfo",
    "Event",
    "Limits",
    "Manifest",
    "Record",
    "Result",
    "RunState",
    "SingleResult",
    "Status",
    "StepState",
    "StepStatus",
    "StrictRecord",
    "TextContent",
    "Usage",
    "decode",
    "encode",
    "encode_pretty",
    "now_iso",
]

if TYPE_CHECKING:
    from pisub.protocol.agent import AgentFrontmatter
    from pisub.protocol.codec import (
        SCHEMA_VERSION,
        Record,
        StrictRecord,
        decode,
        encode,
        encode_pretty,
        now_iso,
    )
    from pisub.protocol.events import Event
    from pisub.protocol.manifest import AgentSpec, Limits, Manifest
    from pisub.protocol.result import (
        Details,
        ErrorCode,
        ErrorInfo,
        Result,
        SingleResult,
        TextContent,
        Usage,
    )
    from pisub.protocol.status import RunState, Status, StepState, StepStatus


__getattr__ = lazy_names(__name__, _HOMES, globals())
