"""The ``slurm`` backend: the runner is a Slurm batch job's main process.

``start`` submits ``python -m pisub.runner RUN --foreground`` with ``sbatch`` (through the fixed
script ``slurm_job.sh``, ``exec "$@"``: argv is never a shell string) and returns once Slurm
accepted the job; the run stays ``starting`` until the runner, on its node, commits. A control
request is followed by a doorbell (``scancel -b --signal=USR1``: the batch process, which is the
runner, rescans its inbox at once). The engine is asked about many runs in one ``squeue`` call.

Liveness across hosts comes from the engine plus the runner's heartbeat lease, never from a pid
or a free lock (a lock proves nothing about another host): a run is ``dead`` only when Slurm says
its job is terminal (or forgot it) **and** ``heartbeat.json`` has not been renewed for its
``ttl`` by the file server's clock.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pisub.backends.base import EngineState, Liveness
from pisub.errors import LaunchFailed, ProtocolError, storage_error
from pisub.fsio import private_mkdir
from pisub.locks import is_held
from pisub.paths import ENV_RUNNER, Home, RunPaths, without_markers
from pisub.procs import boot_id, host_name
from pisub.protocol.codec import now_iso
from pisub.protocol.placement import BackendName, Placement, PlacementRequest, SlurmOptions
from pisub.protocol.status import Status
from pisub.store import load_heartbeat, load_placement, write_placement

JOB_SCRIPT = Path(__file__).with_name("slurm_job.sh")
COMMAND_TIMEOUT_S = 30.0
"""The longest one Slurm command may take (slurmctld busy or unreachable)."""
FRESH_S = 5.0
"""How long an engine answer is reused within one process (one query per command: ``list``
primes it for every live run). A stale "alive" only delays a repair; "dead" needs the lease
to have expired as well."""

_STATES: dict[str, EngineState] = {
    **dict.fromkeys(
        ["PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"],
        EngineState.QUEUED,
    ),
    **dict.fromkeys(["RUNNING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"], EngineState.RUNNING),
    **dict.fromkeys(["COMPLETING", "STAGE_OUT"], EngineState.ENDING),
    **dict.fromkeys(
        [
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "BOOT_FAIL",
            "DEADLINE",
            "PREEMPTED",
            "SPECIAL_EXIT",
            "REVOKED",
        ],
        EngineState.ENDED,
    ),
}
_SQUEUE = ["squeue", "--noheader", "--states=all", "--format=%i|%T"]


def _slurm_state(text: str) -> EngineState:
    words = text.split()
    return _STATES.get(words[0], EngineState.UNKNOWN) if words else EngineState.UNKNOWN


_seen: dict[str, tuple[EngineState, float]] = {}
"""Engine answers by job id, with when they came (monotonic): :meth:`SlurmBackend.observe`
fills it for many runs at once, :meth:`SlurmBackend.liveness` reuses a fresh one."""


class SlurmError(Exception):
    """A Slurm command failed (its message is one line)."""


def slurm_command(argv: list[str], *, env: dict[str, str] | None = None) -> str:
    """Run a Slurm client command; its stdout.

    Raises:
        SlurmError: it is missing, timed out or failed (with its last line of stderr).
    """
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed (is this a Slurm submit host?)") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmError(f"{argv[0]} failed: {exc}") from None
    out = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise SlurmError(f"{argv[0]} exited {done.returncode}: {err[-1] if err else out.strip()[:200]}")
    return out


def _pattern_safe(path: Path) -> str:
    """``path`` for an sbatch file-name option, where ``%`` starts a pattern."""
    return str(path).replace("%", "%%")


def sbatch_argv(paths: RunPaths, job_name: str, options: SlurmOptions) -> list[str]:
    """The whole ``sbatch`` command of a run (one argv word per option; no shell)."""
    argv = ["sbatch", "--parsable", f"--job-name={job_name}"]
    argv += [f"--output={_pattern_safe(paths.runner_log)}", "--open-mode=append"]
    argv += [f"--chdir={paths.root}", "--export=ALL"]
    if options.partition:
        argv.append(f"--partition={options.partition}")
    if options.time:
        argv.append(f"--time={options.time}")
    if options.cpus:
        argv.append(f"--cpus-per-task={options.cpus}")
    if options.mem:
        argv.append(f"--mem={options.mem}")
    argv += options.sbatch or []
    argv += [str(JOB_SCRIPT), sys.executable, "-m", "pisub.runner", str(paths.root), "--foreground"]
    return argv


class SlurmBackend:
    """Runs placed as Slurm batch jobs (see the module's documentation)."""

    name = BackendName.SLURM

    def start(self, paths: RunPaths, lock_fd: int, request: PlacementRequest) -> None:
        placement = load_placement(paths)
        job_name = placement.job_name or f"pisub-{paths.run_id}"
        env = without_markers(os.environ)
        env[ENV_RUNNER] = paths.run_id
        argv = sbatch_argv(paths, job_name, request.slurm or SlurmOptions())
        try:
            out = slurm_command(argv, env=env)
        except SlurmError as exc:
            raise LaunchFailed(f"Slurm did not accept the run: {exc}") from None
        job_id, _, cluster = out.strip().partition(";")
        if not job_id.isdigit():
            raise LaunchFailed(f"sbatch answered {out.strip()[:200]!r}, not a job id")
        placement.job_id = job_id
        placement.cluster = cluster or placement.cluster
        placement.submitted_at = now_iso()
        try:
            write_placement(paths, placement)
        except OSError as exc:
            self.cancel(placement)
            raise storage_error(exc, "write", paths.placement) from exc

    def ring(self, placement: Placement) -> None:
        if placement.job_id is None:
            return
        with contextlib.suppress(SlurmError):
            slurm_command(["scancel", "--batch", "--signal=USR1", placement.job_id])

    def cancel(self, placement: Placement) -> bool:
        if placement.job_id is None:
            return False
        try:
            slurm_command(["scancel", placement.job_id])
        except SlurmError:
            return False
        return True

    def observe(self, placements: Sequence[Placement]) -> dict[str, EngineState]:
        ids = sorted({p.job_id for p in placements if p.job_id is not None}, key=int)
        if not ids:
            return {}
        states = dict.fromkeys(ids, EngineState.UNKNOWN)
        try:
            out = slurm_command(
                ["squeue", "--noheader", "--states=all", "--format=%i|%T", f"--jobs={','.join(ids)}"]
            )
        except SlurmError as exc:
            if "Invalid job id" not in str(exc):
                return states  # no answer: nothing is proven
            out = ""  # (one id Slurm has forgotten: it says so for a single id only)
        seen = {}
        for line in out.splitlines():
            job, _, state = line.strip().partition("|")
            seen[job] = _slurm_state(state)
        now = time.monotonic()
        for job in ids:
            states[job] = seen.get(job, EngineState.GONE)
            _seen[job] = (states[job], now)
        return states

    def _state(self, placement: Placement) -> EngineState:
        assert placement.job_id is not None
        known = _seen.get(placement.job_id)
        if known is not None and time.monotonic() - known[1] < FRESH_S:
            return known[0]
        return self.observe([placement]).get(placement.job_id, EngineState.UNKNOWN)

    def _state_by_name(self, placement: Placement) -> EngineState:
        """The state of the job a launcher submitted but never recorded (it died meanwhile)."""
        try:
            out = slurm_command([*_SQUEUE, f"--name={placement.job_name}"])
        except SlurmError:
            return EngineState.UNKNOWN
        states = [
            _STATES.get(line.partition("|")[2].strip(), EngineState.UNKNOWN) for line in out.splitlines()
        ]
        live = [s for s in states if not s.is_terminal]
        return live[0] if live else (EngineState.ENDED if states else EngineState.GONE)

    def liveness(self, paths: RunPaths, status: Status, placement: Placement) -> Liveness:
        if placement.job_id is None:
            if is_held(paths.runner_lock):
                return Liveness.ALIVE  # the launcher is submitting
            here = placement.launcher_host == host_name() and placement.launcher_boot_id == boot_id()
            if not here:
                return Liveness.UNKNOWN  # only the launcher's host can see it died
            state = self._state_by_name(placement)
        else:
            state = self._state(placement)
        if state == EngineState.UNKNOWN:
            return Liveness.UNKNOWN
        if not state.is_terminal:
            return Liveness.ALIVE
        return Liveness.DEAD if lease_expired(paths) else Liveness.UNKNOWN


def server_now(home: Home) -> float | None:
    """Now by the clock of the file server that holds ``home`` (the mtime of a file just
    touched there); None when it cannot be touched (a read-only home)."""
    probe = home.clock_probe
    try:
        private_mkdir(probe.parent)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.utime(fd)
            return os.fstat(fd).st_mtime
        finally:
            os.close(fd)
    except OSError:
        return None


def lease_expired(paths: RunPaths) -> bool:
    """Whether the runner's heartbeat lease has expired by the file server's clock (True when it
    never wrote one: a job that ended without one can have no runner left)."""
    try:
        found = load_heartbeat(paths)
    except (ProtocolError, OSError):
        return False  # unreadable: nothing is proven
    if found is None:
        return True
    beat, renewed = found
    now = server_now(paths.home)
    return now is not None and now - renewed > beat.ttl
