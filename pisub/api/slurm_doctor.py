"""``pisub cluster doctor``: whether runs can be placed on this Slurm cluster safely.

Checks, each ``ok`` or a problem with its fix: Slurm answers; the partition runs will use exists
and is up; ``KillWait`` leaves a stopped runner time to end its child and write its final
files; ``proctrack/cgroup`` contains a job's whole process tree; the home is on a filesystem a
job's node shares (a probe job writes a file there that this process then reads back); the
mount's lookup cache (NFS: ``lookupcache=positive`` or ``none``); clock skew between this host,
the probe's node and the file server.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from pathlib import Path

from pisub.api.doctor import Report
from pisub.backends.slurm import JOB_SCRIPT, SlurmError, server_now, slurm_command
from pisub.core.fsio import private_mkdir
from pisub.defaults import DEFAULT_GRACE_S
from pisub.store.paths import Home

FINISH_MARGIN_S = 10.0
"""What a stopped runner needs beyond the grace to end its child and write its final files."""
MAX_SKEW_S = 5.0
NFS_TYPES = ("nfs", "nfs4")
PROBE = (
    "import json, os, socket, sys, time\n"
    "path, nonce = sys.argv[1], sys.argv[2]\n"
    "fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
    "os.write(fd, json.dumps({'nonce': nonce, 'node': socket.gethostname(), 'time': time.time()}).encode())\n"
    "os.fsync(fd)\n"
    "os.close(fd)\n"
)


def slurm_config() -> dict[str, str]:
    """``scontrol show config`` as a dict.

    Raises:
        SlurmError.
    """
    config = {}
    for line in slurm_command(["scontrol", "show", "config"]).splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    return config


def diagnose_cluster(home: Home, partition: str | None, timeout: float = 120.0) -> Report:
    """Every check (see the module); the probe job waits at most ``timeout`` seconds."""
    report = Report()
    try:
        config = slurm_config()
    except SlurmError as exc:
        report.add(
            "slurm", False, str(exc), "install the Slurm client and set SLURM_CONF, or run on a submit host"
        )
        return report
    report.add(
        "slurm", True, f"cluster {config.get('ClusterName', '?')}, Slurm {config.get('SLURM_VERSION', '?')}"
    )
    _partition(report, partition)
    _kill_wait(report, config)
    _proctrack(report, config)
    _lookup_cache(report, home.root)
    _probe(report, home, partition, timeout)
    return report


def _partition(report: Report, wanted: str | None) -> None:
    try:
        rows = slurm_command(["sinfo", "--noheader", "--format=%P|%a"]).split()
    except SlurmError as exc:
        report.add("partition", False, str(exc), "check that slurmctld answers (sinfo)")
        return
    parts = {
        name.rstrip("*"): (state, name.endswith("*")) for name, _, state in (r.partition("|") for r in rows)
    }
    name = wanted or next((p for p, (_, default) in parts.items() if default), None)
    if name is None or name not in parts:
        known = ", ".join(sorted(parts)) or "none"
        report.add(
            "partition",
            False,
            f"no partition {name or '(default)'} (known: {known})",
            "set [slurm] partition in config.toml to one of them",
        )
    elif parts[name][0] != "up":
        report.add(
            "partition",
            False,
            f"partition {name} is {parts[name][0]}",
            f"scontrol update PartitionName={name} State=UP",
        )
    else:
        report.add("partition", True, f"{name} is up" + (" (the default)" if wanted is None else ""))


def _seconds(text: str) -> float | None:
    word = text.split()[0] if text.split() else ""
    return float(word) if word.replace(".", "", 1).isdigit() else None


def _kill_wait(report: Report, config: dict[str, str]) -> None:
    need = DEFAULT_GRACE_S + FINISH_MARGIN_S
    kill_wait = _seconds(config.get("KillWait", ""))
    if kill_wait is None:
        report.add(
            "killwait", False, f"KillWait is {config.get('KillWait')!r}", f"set KillWait={need:g} or more"
        )
    elif kill_wait < need:
        report.add(
            "killwait",
            False,
            f"KillWait {kill_wait:g} s < grace {DEFAULT_GRACE_S:g} s + {FINISH_MARGIN_S:g} s to finish: "
            "a scancelled runner is killed before it writes its result",
            f"set KillWait={need:g} or more in slurm.conf",
        )
    else:
        report.add("killwait", True, f"KillWait {kill_wait:g} s ≥ {need:g} s")


def _proctrack(report: Report, config: dict[str, str]) -> None:
    kind = config.get("ProctrackType", "?")
    if kind == "proctrack/cgroup":
        report.add("proctrack", True, "proctrack/cgroup: a job's whole process tree ends with it")
    else:
        report.add(
            "proctrack",
            False,
            f"{kind}: a child that double-forks outlives its job",
            "set ProctrackType=proctrack/cgroup",
        )


def _mount_of(path: Path) -> tuple[str, str, str]:
    """(mount point, filesystem type, options) of the mount holding ``path``."""
    best = ("/", "?", "")
    target = os.path.realpath(path)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 6 or len(rfields) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, rfields[0], fields[5] + "," + rfields[2])
    return best


def _lookup_cache(report: Report, root: Path) -> None:
    point, fstype, options = _mount_of(root)
    if fstype not in NFS_TYPES:
        report.add("lookupcache", True, f"the home is on {fstype} ({point}): no negative lookup cache")
        return
    opts = dict(o.partition("=")[::2] for o in options.split(","))
    if opts.get("lookupcache") in ("positive", "pos", "none"):
        report.add("lookupcache", True, f"{fstype} {point}: lookupcache={opts['lookupcache']}")
    else:
        report.add(
            "lookupcache",
            False,
            f"{fstype} {point} caches failed lookups: "
            "a receipt or a closed inbox can stay invisible for a minute",
            f"mount {point} with lookupcache=positive",
        )


def _probe(report: Report, home: Home, partition: str | None, timeout: float) -> None:
    nonce = uuid.uuid4().hex
    private_mkdir(home.cache)
    path = home.cache / f"probe-{nonce}.json"
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name=pisub-probe-{nonce[:8]}",
        "--output=/dev/null",
        f"--chdir={home.cache}",
    ]
    argv += [f"--partition={partition}"] if partition else []
    argv += [str(JOB_SCRIPT), sys.executable, "-c", PROBE, str(path), nonce]
    try:
        job = slurm_command(argv).strip().partition(";")[0]
    except SlurmError as exc:
        report.add(
            "shared", False, f"the probe job was refused: {exc}", "check the partition and your Slurm account"
        )
        return
    deadline = time.monotonic() + timeout
    while path.name not in os.listdir(home.cache):  # a fresh listing: no negative cache
        if time.monotonic() > deadline:
            with contextlib.suppress(SlurmError):
                slurm_command(["scancel", job])
            report.add(
                "shared",
                False,
                f"probe job {job} wrote nothing into {home.cache} within {timeout:g} s "
                "(queued, or the home is not on the node)",
                "put the home on storage every node mounts (PISUB_HOME), or raise --timeout",
            )
            return
        time.sleep(0.2)
    _read_probe(report, home, path, nonce, job)


def _read_probe(report: Report, home: Home, path: Path, nonce: str, job: str) -> None:
    import json

    try:
        data = json.loads(path.read_text())
        written = os.stat(path).st_mtime
        path.unlink()
    except (OSError, ValueError) as exc:
        report.add(
            "shared",
            False,
            f"the probe's file cannot be read back: {exc}",
            "check the home's permissions on the nodes",
        )
        return
    if data.get("nonce") != nonce:
        report.add(
            "shared",
            False,
            "the probe's file holds another nonce",
            "check that nothing else writes into the home's cache",
        )
        return
    report.add(
        "shared", True, f"probe job {job} on node {data.get('node')} wrote into the home; read back here"
    )
    server = server_now(home)
    node_skew = float(data.get("time", written)) - written
    here_skew = time.time() - server if server is not None else 0.0
    worst = max(abs(node_skew), abs(here_skew))
    detail = f"node {node_skew:+.2f} s, this host {here_skew:+.2f} s against the file server"
    if worst > MAX_SKEW_S:
        report.add(
            "clock",
            False,
            detail + " (pisub never compares them, but timestamps in runs disagree)",
            "run NTP (chrony) on every node",
        )
    else:
        report.add("clock", True, detail)
