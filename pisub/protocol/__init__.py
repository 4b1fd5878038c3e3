"""The on-disk protocol: one Struct per file, no I/O.

Every file carries ``v`` (:data:`SCHEMA_VERSION`) and uses camelCase keys. Files pisub writes
for readers (:class:`Record`) are forward-compatible: readers ignore fields they do not know.
Input from outside (requests, agent frontmatter: :class:`StrictRecord`) is strict: unknown
fields and wrong types are errors that name the field.
"""

from pisub.protocol.agent import AgentFrontmatter
from pisub.protocol.codec import SCHEMA_VERSION, Record, StrictRecord, decode, encode, encode_pretty, now_iso
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
