"""Where a run's runner lives: the backend that placed it (``placement.json``) and the options a
launch asks for; the runner's heartbeat lease on shared storage (``heartbeat.json``)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

import msgspec

from pisub.protocol.codec import Record, StrictRecord


class BackendName(StrEnum):
    """Where a runner lives."""

    LOCAL = "local"
    """A detached process on the launcher's machine."""
    SLURM = "slurm"
    """A Slurm batch job whose main process is the runner (``--foreground``)."""


SLURM_TIME = r"^(?:\d{1,9}(?::\d{1,2}){0,2}|\d{1,4}-\d{1,2}(?::\d{1,2}){0,2}|UNLIMITED|INFINITE)$"
"""What ``sbatch --time`` takes: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], UNLIMITED."""
SLURM_MEM = r"^[1-9]\d{0,11}[KMGT]?$"
"""Not ``0``: to Slurm that is "all of the node's memory"."""
SLURM_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
SBATCH_ARG = r"^--[a-z][a-z0-9-]{0,63}(?:=[^\x00\n]{0,4096})?$"
"""An extra ``sbatch`` option, one argv word: ``--name`` or ``--name=value`` (never a shell string)."""


RESERVED_SBATCH = (
    "--output",
    "--error",
    "--input",
    "--open-mode",
    "--chdir",
    "--job-name",
    "--parsable",
    "--wrap",
    "--export",
    "--export-file",
    "--array",
    "--test-only",
    "--wait",
    "--batch",
)
"""``sbatch`` options pisub sets itself or that break a run's protocol (one runner per run, its
output in ``runner.log``, its environment): refused in ``slurm.sbatch``."""


def reserved_sbatch(words: list[str]) -> str | None:
    """The first of ``words`` that names a reserved option (``--name`` or ``--name=...``) — or
    any abbreviation of one: ``sbatch`` takes a unique prefix (``--job-n``) for the option."""
    for word in words:
        name = word.partition("=")[0]
        if any(reserved.startswith(name) for reserved in RESERVED_SBATCH):
            return word
    return None


class SlurmOptions(StrictRecord, kw_only=True, omit_defaults=True):
    """What a Slurm run asks of the engine (agent frontmatter ``slurm:``, ``[slurm]`` in
    ``config.toml``); each key given replaces the one below it, key by key."""

    partition: Annotated[str, msgspec.Meta(pattern=SLURM_NAME)] | None = None
    time: Annotated[str, msgspec.Meta(pattern=SLURM_TIME)] | None = None
    """``sbatch --time``."""
    cpus: Annotated[int, msgspec.Meta(ge=1, le=4096)] | None = None
    """``sbatch --cpus-per-task``."""
    mem: Annotated[str, msgspec.Meta(pattern=SLURM_MEM)] | None = None
    """``sbatch --mem`` (``512M``, ``4G``)."""
    sbatch: list[Annotated[str, msgspec.Meta(pattern=SBATCH_ARG)]] | None = None
    """Further ``sbatch`` options, each one argv word (``--account=ml``)."""

    def over(self, below: SlurmOptions | None) -> SlurmOptions:
        """These options, with what ``below`` sets where these set nothing."""
        if below is None:
            return self
        fields = ("partition", "time", "cpus", "mem", "sbatch")
        merged = {f: getattr(self, f) if getattr(self, f) is not None else getattr(below, f) for f in fields}
        return SlurmOptions(**merged)


class PlacementRequest(Record, kw_only=True):
    """In the manifest: where the launch asked its runner to live (resolved from the call, the
    agent file and ``config.toml``)."""

    backend: BackendName = BackendName.LOCAL
    slurm: SlurmOptions | None = None
    heartbeat_ttl: float = 30.0
    """Seconds a runner on shared storage may go without renewing its heartbeat lease before a
    reader may treat it as gone (``[slurm] heartbeat_ttl``)."""


class Placement(Record, kw_only=True):
    """``placement.json``: where the run's runner was placed, written by the launcher (before the
        run is visible, and again once the engine accepted the job). A reader on any host asks this
        backend whether the runner lives. Absent in runs made before it existed: ``local``. The node
    the runner runs on is ``host`` in ``status.json`` (one writer per file: the runner writes that)."""

    v: Literal[1]
    backend: BackendName
    launcher_host: str
    """The host the launcher ran on."""
    launcher_boot_id: str | None = None
    cluster: str | None = None
    """The Slurm cluster (``ClusterName``), when known."""
    job_id: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,20}$")] | None = None
    """The engine's job id; None until the engine accepted it (or for ``local``). A file with
    anything else is malformed: its run's liveness is ``unknown``."""
    job_name: str | None = None
    """The engine's job name (``pisub-<run id>``): finds a job whose id was never recorded."""
    submitted_at: str | None = None
    """When the engine accepted the job (ISO 8601)."""


class Heartbeat(Record, kw_only=True):
    """``heartbeat.json``: a runner's lease on its run directory (Slurm runs). The runner rewrites
    it every ``ttl / 4`` seconds; its **mtime** (set by the file server) is the renewal time. A
    reader may treat the runner as gone only when the job ended and the entry's mtime is older
    than the manifest's ``heartbeatTtl`` by the file server's clock. A repairer writes a higher
    ``generation`` with ``owner: "repair"`` before it repairs: a runner that meets a generation
    not its own stops writing at once."""

    v: Literal[1]
    generation: int
    """The runner's check: a generation not its own fences it (readers only compare mtimes)."""
    owner: Literal["runner", "repair"]
    ttl: float
    """The runner's lease time, for people: readers judge expiry by the entry's mtime against
    the manifest's ``placement.heartbeatTtl``, never by this field."""
    pid: int | None = None
    host: str | None = None
