"""pisub: a file-based control plane for detached background runs of coding sub-agents."""

from pisub.client import Run, agents, launch, list_runs
from pisub.errors import PisubError
from pisub.protocol.result import Result
from pisub.protocol.status import RunState, Status

__version__ = "0.1.0"

__all__ = [
    "PisubError",
    "Result",
    "Run",
    "RunState",
    "Status",
    "__version__",
    "agents",
    "launch",
    "list_runs",
]
