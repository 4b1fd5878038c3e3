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
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pisub.backends.base import EngineState, Liveness
from pisub.core.fsio import open_append, open_regular, private_mkdir
from pisub.core.locks import is_held
from pisub.core.procs import boot_id, host_name
from pisub.errors import LaunchFailed, PisubError, storage_error
from pisub.protocol.codec import now_iso
from pisub.protocol.env import ENV_RUNNER
from pisub.protocol.placement import BackendName, Placement, PlacementRequest, SlurmOptions
from pisub.protocol.status import Status
from pisub.store.paths import Home, RunPaths, without_markers
from pisub.store.runs import load_placement, write_placement
from pisub.termsafe import printable

JOB_SCRIPT = Path(__file__).with_name("slurm_job.sh")
COMMAND_TIMEOUT_S = 30.0
"""The longest one Slurm command may take (slurmctld busy or unreachable)."""
RING_TIMEOUT_S = 5.0
"""The doorbell is best effort: the runner's own scan finds the request within a second."""
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


def slurm_command(argv: list[str], *, env: dict[str, str] | None = None, timeout: float | None = None) -> str:
    """Run a Slurm client command (at most ``timeout`` s, default :data:`COMMAND_TIMEOUT_S`); its
    stdout.

    Raises:
        SlurmError: it is missing, timed out or failed (with its last line of stderr).
    """
    timeout = COMMAND_TIMEOUT_S if timeout is None else timeout
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed (is this a Slurm submit host?)") from None
    except subprocess.TimeoutExpired as exc:
        # What it said before it hung is the diagnosis (a slurm.conf it cannot read: Slurm's
        # clients retry for 60 s, saying why once, at the start).
        said = _last_line(exc.stderr)
        raise SlurmError(
            f"{argv[0]} did not answer within {timeout:g} s" + (f"; it said: {said}" if said else "")
        ) from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmError(f"{argv[0]} failed: {exc}") from None
    out = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise SlurmError(f"{argv[0]} exited {done.returncode}: {err[-1] if err else out.strip()[:200]}")
    return out


def _last_line(data: bytes | None) -> str:
    """The last non-empty line of a command's output, printable, at most 300 characters."""
    lines = (data or b"").decode("utf-8", "replace").strip().splitlines()
    return printable(lines[-1].strip())[:300] if lines else ""


def _by_name(job_name: str | None) -> list[str]:
    """``squeue`` of the jobs called ``job_name`` — of this user only: any user can submit a job
    of any name (and see the names of everyone's jobs), and a job of another user taken for a
    run's own would be followed, recorded and even cancelled as the run's."""
    return [*_SQUEUE, f"--user={os.getuid()}", f"--name={job_name}"]


def _job_by_name(job_name: str) -> str | None:
    """The id of the live job called ``job_name`` (an sbatch that failed after Slurm accepted it)."""
    try:
        out = slurm_command(_by_name(job_name))
    except SlurmError:
        return None
    ids = [line.partition("|")[0].strip() for line in out.splitlines()]
    ids = [i for i in ids if i.isdigit()]
    return ids[0] if ids else None


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


def _log(paths: RunPaths, line: str) -> None:
    """Append ``line`` to the run's ``runner.log`` (best effort)."""
    with contextlib.suppress(OSError):
        fd = open_append(paths.runner_log)
        try:
            os.write(fd, line.encode("utf-8", "replace") + b"\n")
        finally:
            os.close(fd)


class SlurmBackend:
    """Runs placed as Slurm batch jobs (see the module's documentation)."""

    name = BackendName.SLURM

    def start(self, paths: RunPaths, lock_fd: int, request: PlacementRequest) -> None:
        placement = load_placement(paths)
        job_name = placement.job_name or f"pisub-{paths.run_id}"
        try:  # created here, 0600: Slurm would create it with the job's umask
            os.close(open_append(paths.runner_log))
        except OSError as exc:
            raise storage_error(exc, "create", paths.runner_log) from exc
        env = without_markers(os.environ)
        env[ENV_RUNNER] = paths.run_id
        argv = sbatch_argv(paths, job_name, request.slurm or SlurmOptions())
        try:
            out = slurm_command(argv, env=env)
        except SlurmError as exc:
            # sbatch may have been accepted before it failed (a timeout): find the job by name.
            found = _job_by_name(job_name)
            if found is None:
                failure = f"Slurm did not accept the run: {exc}"
                _log(paths, f"pisub: {failure}")  # what the repair of this run will say
                raise LaunchFailed(failure) from None
            out = found
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
        """Only a running job has a runner to ring (a queued one scans its inbox when it starts;
        Slurm makes ``scancel`` retry for minutes on a job it cannot signal yet)."""
        if placement.job_id is None or self._state(placement) != EngineState.RUNNING:
            return
        with contextlib.suppress(SlurmError):
            slurm_command(["scancel", "--batch", "--signal=USR1", placement.job_id], timeout=RING_TIMEOUT_S)

    def cancel(self, placement: Placement) -> bool:
        if placement.job_id is None:
            return False
        try:
            slurm_command(["scancel", placement.job_id])
        except SlurmError:
            return False
        return True

    def observe(self, placements: Sequence[Placement]) -> dict[str, EngineState]:
        ids = sorted({p.job_id for p in placements if p.job_id is not None}, key=lambda j: (len(j), j))
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
            out = slurm_command(_by_name(placement.job_name))
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
    touched there); None when it cannot be touched (a read-only home). Something planted in
    the probe's place (a FIFO, a symlink, a directory) is moved aside once, never opened."""
    probe = home.clock_probe
    try:
        private_mkdir(probe.parent)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(probe).st_mode):  # a FIFO would not even open (ENXIO)
                os.rename(probe, probe.with_name(f".{probe.name}.bad-{os.urandom(3).hex()}"))
        fd = open_regular(probe, os.O_WRONLY | os.O_CREAT)
        try:
            os.utime(fd)
            return os.fstat(fd).st_mtime
        finally:
            os.close(fd)
    except OSError:
        return None


def lease_expired(paths: RunPaths) -> bool:
    """Whether the runner's heartbeat lease has expired by the file server's clock — asked only
    once the engine says the job ended. The lease is the **mtime** of whatever stands at
    ``heartbeat.json`` (looked up in a fresh listing; never followed) against the ``ttl`` the
    manifest gave the runner; the file's content (which a runner checks for its generation) does
    not count, so nothing planted there can keep a dead run from being repaired. No entry: the
    runner never started, so none is left. An mtime in the future (a clock anomaly) counts as
    expired: the engine already says every process of the job is gone."""
    try:
        if paths.heartbeat.name not in os.listdir(paths.root):
            return True
        renewed = os.stat(paths.heartbeat, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return True
    except OSError:
        return False  # the run directory cannot be read: nothing is proven
    now = server_now(paths.home)
    if now is None:
        return False
    ttl = _manifest_ttl(paths)
    return now - renewed > ttl or renewed - now > ttl


def _manifest_ttl(paths: RunPaths) -> float:
    from pisub.defaults import HEARTBEAT_TTL_S
    from pisub.store.runs import load_manifest

    try:
        placement = load_manifest(paths).placement
    except PisubError:
        return HEARTBEAT_TTL_S
    return placement.heartbeat_ttl if placement is not None else HEARTBEAT_TTL_S
