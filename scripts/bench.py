"""Benchmarks of pisub against baselines run on the same machine, in the same run.

    python scripts/bench.py            # the full set (several minutes)
    python scripts/bench.py --quick    # under a minute; what CI runs to keep it working

Prints a table and writes the figures to ``bench-results.json`` (``--out`` to change). Every
figure has its baseline beside it so that the ratio holds on a noisy machine. Nothing is
asserted: the aims are in the README's Performance section. A section whose tool is missing
is skipped with a note. Runs in a temporary PISUB_HOME that is removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

Row = tuple[str, str, str, str]
"""(section, measurement, pisub, baseline / ratio)."""

TAG = "PISUB_BENCH_TAG"
"""Set to a fresh value in this process's environment: every process the benchmark starts (its
runs, its baselines) inherits it, and the benchmark ends only processes carrying it — never by
name or pattern, so that it never touches anyone else's ``sleep 3600``."""


class BenchFailure(Exception):
    """A benchmark that cannot finish (a run ended under it, a wait past its deadline)."""


def until(done: Callable[[], bool], timeout: float, what: str, interval: float = 0.01) -> None:
    """Wait until ``done()`` holds; :class:`BenchFailure` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            raise BenchFailure(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def ours(pid: int) -> bool:
    """True when ``pid`` is a live process that this benchmark started (it carries the tag)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{TAG}={os.environ[TAG]}".encode() in env


def end_sessions(pids: list[int]) -> None:
    """SIGKILL the sessions that ``pids`` lead (each a baseline's ``setsid`` / ``nq`` job), after
    checking that each is still ours: a pid reused since by someone else's process is left be."""
    for pid in pids:
        if not ours(pid):
            continue
        with suppress(ProcessLookupError):
            if os.getsid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


class Bench:
    def __init__(self, quick: bool, home: Path, baseline: Path | None = None) -> None:
        self.quick = quick
        self.home = home
        self.rows: list[Row] = []
        self.data: dict[str, Any] = {}
        self.notes: list[str] = []
        self.checkouts: list[tuple[str, list[str]]] = [("this", this_pisub())]
        """The ``pisub`` commands that every CLI-driven figure is measured with, alternating round
        by round: this checkout's, then (``--baseline-checkout DIR``) ``DIR/.venv/bin/pisub``."""
        if baseline is not None:
            self.checkouts.append(("before", [str(baseline / ".venv" / "bin" / "pisub")]))

    @property
    def pisub(self) -> list[str]:
        """This checkout's ``pisub`` command."""
        return self.checkouts[0][1]

    def alternate(self, rounds: int, measure: Callable[[list[str]], Any]) -> dict[str, list[Any]]:
        """``measure(pisub command)`` ``rounds`` times per checkout, alternating (this one first in
        even rounds, the baseline first in odd ones): figures by checkout label."""
        figures: dict[str, list[Any]] = {label: [] for label, _ in self.checkouts}
        for i in range(rounds):
            for label, argv in self.checkouts if i % 2 == 0 else self.checkouts[::-1]:
                figures[label].append(measure(argv))
        return figures

    def versus(self, figures: dict[str, list[float]], show: Callable[[float], str]) -> str:
        """``before X (xratio)`` when a baseline checkout was measured beside this one, else ``""``."""
        if "before" not in figures or not figures["before"]:
            return ""
        now, before = statistics.median(figures["this"]), statistics.median(figures["before"])
        return f"before {show(before)} (x{now / before:.2f})" if before else f"before {show(before)}"

    def row(self, section: str, what: str, value: str, baseline: str = "") -> None:
        self.rows.append((section, what, value, baseline))
        print(f"  {section:<10} {what:<44} {value:<22} {baseline}", flush=True)

    def agent(self, name: str, command: str, args: list[str], runner: str = "external-cli") -> None:
        agents = self.home / "agents"
        agents.mkdir(parents=True, exist_ok=True, mode=0o700)
        lines = ["---", f"name: {name}", f"runner: {runner}"]
        if runner == "external-cli":
            lines += [f"command: {json.dumps(command)}", f"args: {json.dumps(args)}"]
        (agents / f"{name}.md").write_text("\n".join([*lines, "timeout: 3600", "---", ""]))


def cli(
    *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "pisub", *args], capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise RuntimeError(f"pisub {' '.join(args)}: {proc.stderr}")
    return proc


def this_pisub() -> list[str]:
    """This checkout's ``pisub`` command: the entry script beside the interpreter running the
    benchmark (as ``DIR/.venv/bin/pisub`` is the baseline's), else ``python -m pisub``."""
    script = Path(sys.executable).with_name("pisub")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pisub"]


def joined(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def run(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end, its output captured; :class:`BenchFailure` when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    if proc.returncode != 0:
        raise BenchFailure(f"{' '.join(argv[-6:])} failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    return proc


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- 1. launch ---------------------------------------------------------------------------------


def bench_launch(b: Bench) -> None:
    """Warm runners (the default) beside cold starts (``PISUB_WARM=0``, the previous way), the
    bare ``setsid`` floor, and what the remaining time is made of."""
    import pisub
    from pisub.backends import warm

    n = 3 if b.quick else 20
    b.agent("sleeper", "sleep", ["3600"])
    cold_env = {**os.environ, "PISUB_WARM": "0"}
    cli_warm_by = b.alternate(n, lambda pisub: timed(lambda: run([*pisub, "run", "--agent", "sleeper", "x"])))
    cli_cold_by = b.alternate(
        n, lambda pisub: timed(lambda: run([*pisub, "run", "--agent", "sleeper", "x"], env=cold_env))
    )
    cli_warm, cli_cold = cli_warm_by["this"], cli_cold_by["this"]
    back_to_back = [timed(lambda: pisub.launch("sleeper", "x")) for _ in range(n)]
    spare_ready = []
    for _ in range(n):
        warm.refill()
        time.sleep(0.4)  # (not timed) the spare has started and imported
        spare_ready.append(timed(lambda: pisub.launch("sleeper", "x")))
    with _env("PISUB_WARM", "0"):
        api_cold = [timed(lambda: pisub.launch("sleeper", "x")) for _ in range(n)]
    first = [_first_launch_in_a_process() for _ in range(n)]
    first_cold = [_first_launch_in_a_process(cold_env) for _ in range(n)]
    sessions: list[int] = []
    bare = [timed(lambda: sessions.append(_bare_setsid())) for _ in range(n)]
    python_pass = [timed(lambda: subprocess.run([sys.executable, "-c", "pass"])) for _ in range(n)]
    cli_imports = [  # what `pisub run --agent NAME TASK` imports (pisub.__main__'s plain launch)
        timed(lambda: subprocess.run([sys.executable, "-c", LAUNCH_IMPORTS])) for _ in range(n)
    ]
    stop_all(b)
    b.data["launch"] = {
        "cli_s": cli_warm,
        "cli_cold_s": cli_cold,
        "cli_before_s": cli_warm_by.get("before", []),
        "cli_cold_before_s": cli_cold_by.get("before", []),
        "api_s": back_to_back,
        "api_spare_ready_s": spare_ready,
        "api_cold_s": api_cold,
        "api_first_in_process_s": first,
        "api_first_in_process_cold_s": first_cold,
        "bare_setsid_s": bare,
        "python_pass_s": python_pass,
        "import_cli_s": cli_imports,
    }
    base = statistics.median(bare)
    for label, times, before in (
        ("pisub run (CLI), warm runner, p50 / p95 (aim +120 ms)", cli_warm, b.versus(cli_warm_by, ms)),
        ("pisub run (CLI), cold (PISUB_WARM=0)", cli_cold, b.versus(cli_cold_by, ms)),
        ("pisub.launch(), a spare ready", spare_ready, ""),
        ("pisub.launch(), back to back", back_to_back, ""),
        ("pisub.launch(), first in a process", first, ""),
        ("pisub.launch(), first in a process, cold (PISUB_WARM=0)", first_cold, ""),
        ("pisub.launch(), cold (PISUB_WARM=0), in this process", api_cold, ""),
    ):
        b.row(
            "launch",
            label,
            f"{ms(statistics.median(times))} / {ms(pct(times, 95))}",
            joined(f"bare setsid {ms(base)}; +{ms(statistics.median(times) - base)}", before),
        )
    start, imports = statistics.median(python_pass), statistics.median(cli_imports)
    b.row(
        "launch",
        "CLI parts: interpreter / CLI imports / the rest",
        f"{ms(start)} / {ms(imports - start)} / {ms(statistics.median(cli_warm) - imports)}",
        "the rest: the agent, the manifest, the runner's commit",
    )
    nq = shutil.which("nq")
    if nq is None:
        b.notes.append("launch: nq is not installed (apt install nq): its baseline was skipped")
    else:
        qdir = Path(tempfile.mkdtemp())
        env = {**os.environ, "NQDIR": str(qdir)}
        nq_times = [
            timed(lambda: subprocess.run([nq, "sleep", "3600"], env=env, capture_output=True))
            for _ in range(n)
        ]
        # nq names each job's file ",<time>.<pid>", the pid of the job (a session leader)
        sessions += [int(name.rsplit(".", 1)[1]) for name in os.listdir(qdir) if name.startswith(",")]
        shutil.rmtree(qdir, ignore_errors=True)
        b.data["launch"]["nq_s"] = nq_times
        b.row("launch", "nq p50", ms(statistics.median(nq_times)))
    end_sessions(sessions)  # the baselines' sleep 3600, by the pids they started with


def _bare_setsid() -> int:
    """The floor of a detached launch: ``setsid sh -c 'sleep 3600' &``; the session's pid."""
    proc = subprocess.run(
        ["sh", "-c", "setsid sh -c 'sleep 3600' >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    )
    return int(proc.stdout)


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


FIRST_LAUNCH = """
import sys, time
import pisub, pisub.api.client, pisub.runs.launch, pisub.agents.catalog, pisub.store.config
import pisub.runs.reconcile
import pisub.backends.local, pisub.backends.warm, yaml
start = time.perf_counter()
pisub.launch("sleeper", "x")
print(time.perf_counter() - start)
"""


LAUNCH_IMPORTS = (
    "import pisub.__main__, pisub.api.warm, pisub.api.launch, pisub.api.agents, pisub.api.acceptance,"
    " pisub.termsafe"
)
"""What the CLI's plain launch imports (``pisub/__main__.py``)."""


def _first_launch_in_a_process(env: dict[str, str] | None = None) -> float:
    """``pisub.launch()`` timed inside a fresh process, its imports done before (``env``:
    e.g. ``PISUB_WARM=0``, the same launch cold)."""
    proc = subprocess.run(
        [sys.executable, "-c", FIRST_LAUNCH], capture_output=True, text=True, check=True, cwd=ROOT, env=env
    )
    return float(proc.stdout.strip())


def stop_all(b: Bench) -> None:
    import pisub
    from pisub.errors import InboxClosed

    live = [pisub.Run(s.run_id) for s in pisub.list_runs(home=b.home) if not s.state.is_terminal]
    for run in live:
        with contextlib.suppress(InboxClosed):
            run.send_stop()
    for run in live:
        with contextlib.suppress(Exception):
            run.wait_until_terminal(30)


# -- 2/3. control latency and throughput ---------------------------------------------------------


class OutboxWatch:
    """Notes when each receipt file appears, through raw inotify (no batching or delays)."""

    IN_MOVED_TO = 0x80
    IN_CREATE = 0x100

    def __init__(self, directory: Path) -> None:
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if (
            self.libc.inotify_add_watch(self.fd, str(directory).encode(), self.IN_MOVED_TO | self.IN_CREATE)
            < 0
        ):
            raise OSError(ctypes.get_errno(), "inotify_add_watch")
        self.seen: dict[str, float] = {}

    def wait(self, name: str, timeout: float = 30.0) -> float:
        import select
        import struct

        deadline = time.monotonic() + timeout
        while name not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise BenchFailure(f"no receipt {name} within {timeout:g} s")
            data = os.read(self.fd, 1 << 16)
            now = time.perf_counter()
            pos = 0
            while pos < len(data):
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, pos)
                entry = data[pos + 16 : pos + 16 + size].rstrip(b"\0").decode()
                self.seen.setdefault(entry, now)
                pos += 16 + size
        return self.seen[name]

    def wait_until(self, name: str, done: Callable[[], bool], timeout: float = 30.0) -> float:
        """The time of the first event for ``name`` after which ``done()`` holds (a receipt that
        is replaced as it advances)."""
        import select
        import struct

        deadline = time.monotonic() + timeout
        while True:
            if name in self.seen and done():
                return self.seen[name]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise BenchFailure(f"no receipt {name} within {timeout:g} s")
            data = os.read(self.fd, 1 << 16)
            now = time.perf_counter()
            pos = 0
            while pos < len(data):
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, pos)
                entry = data[pos + 16 : pos + 16 + size].rstrip(b"\0").decode()
                self.seen[entry] = now
                pos += 16 + size

    def stop(self) -> None:
        os.close(self.fd)


def drop(inbox: Path, name: str, body: bytes) -> None:
    """What ``printf > tmp/x && mv tmp/x new/`` does, as spec/protocol.md (Closing) asks of a
    writer: nothing is written into a closed inbox (``inbox/closed``, the run has finished), and
    a request that lands just as it closes is withdrawn unless the runner already claimed it —
    either way the benchmark stops, as its run is gone."""
    if (inbox / "closed").exists():
        raise BenchFailure(f"{inbox.parent.name}: the run finished (inbox/closed); {name} not sent")
    tmp = inbox / "tmp" / name
    with open(tmp, "wb") as fh:
        fh.write(body)
    os.rename(tmp, inbox / "new" / name)
    if (inbox / "closed").exists():
        with suppress(FileNotFoundError):
            os.unlink(inbox / "new" / name)  # withdrawn (or claimed: the runner answers it)
        raise BenchFailure(f"{inbox.parent.name}: the run finished while {name} was sent")


BASELINE_RESPONDER = r"""
import os, sys, time
from watchdog.events import FileCreatedEvent, FileMovedEvent, FileSystemEventHandler
from watchdog.observers.inotify import InotifyObserver
inbox, outbox = sys.argv[1], sys.argv[2]
def answer(name):
    src = os.path.join(inbox, "new", name)
    try:
        os.unlink(src)  # consume (an unlink makes no event under this filter)
    except FileNotFoundError:
        return
    tmp = os.path.join(outbox, "." + name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, b'{"state": "delivered"}\n')
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, os.path.join(outbox, name))
class H(FileSystemEventHandler):
    def on_any_event(self, event):
        name = os.path.basename(getattr(event, "dest_path", "") or event.src_path)
        if name.endswith(".json"):
            answer(name)
o = InotifyObserver()
o.schedule(H(), os.path.join(inbox, "new"), event_filter=[FileCreatedEvent, FileMovedEvent])
o.start()
print("ready", flush=True)
sys.stdin.read()
o.stop()
"""


@contextmanager
def baseline_responder() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp())
    for d in ("inbox/tmp", "inbox/new", "inbox/cur", "outbox"):
        (root / d).mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", BASELINE_RESPONDER, str(root / "inbox"), str(root / "outbox")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    try:
        yield root
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
        shutil.rmtree(root, ignore_errors=True)


def round_trips(inbox: Path, outbox: Path, n: int, body: bytes) -> list[float]:
    watch = OutboxWatch(outbox)
    times = []
    try:
        for i in range(n):
            name = f"rt-{uuid.uuid4().hex[:12]}-{i:05d}.json"
            start = time.perf_counter()
            drop(inbox, name, body)
            times.append(watch.wait(name) - start)
    finally:
        watch.stop()
    return times


STEER = b'{"v":1,"type":"steer","message":"benchmark"}'


BURST_S = 300.0
"""The longest the burst's receipts may take (the quick burst takes about a second)."""


def _receipted(run: Any, outbox: Path, count: int) -> bool:
    """True once ``outbox`` holds ``count`` receipts; :class:`BenchFailure` when the run ended
    first (its runner answers what it had left, so the count would never come)."""
    if len(os.listdir(outbox)) >= count:
        return True
    if (run.dir / "inbox" / "closed").exists():
        state = run.status().state  # (a reader: repairs a crashed run)
        raise BenchFailure(f"run {run.id} ended ({state}) with {len(os.listdir(outbox))} of {count} receipts")
    return False


def bench_control(b: Bench) -> None:
    import pisub

    n = 200 if b.quick else 1000
    b.agent("sleeper", "sleep", ["3600"])
    run = pisub.launch("sleeper", "x")
    pisub_rt = round_trips(run.dir / "inbox", run.dir / "outbox", n, STEER)
    with baseline_responder() as root:
        base_rt = round_trips(root / "inbox", root / "outbox", n, STEER)
    b.data["control"] = {"pisub_s": pisub_rt, "baseline_s": base_rt}
    for q in (50, 99):
        b.row(
            "control",
            f"round trip p{q} (printf+mv → receipt)",
            ms(pct(pisub_rt, q)),
            f"watchdog+rename floor {ms(pct(base_rt, q))}; x{pct(pisub_rt, q) / pct(base_rt, q):.1f}",
        )

    total = 2000 if b.quick else 10_000
    watch_dir = run.dir / "outbox"
    before = len(os.listdir(watch_dir))
    names = [f"burst-{i:06d}.json" for i in range(total)]
    start = time.perf_counter()
    for name in names:
        drop(run.dir / "inbox", name, STEER)
    written = time.perf_counter()
    until(
        lambda: _receipted(run, watch_dir, before + total),
        BURST_S,
        f"the {total:,} receipts of run {run.id}",
    )
    done = time.perf_counter() - start
    with baseline_responder() as root:
        bstart = time.perf_counter()
        for name in names:
            drop(root / "inbox", name, STEER)
        until(lambda: len(os.listdir(root / "outbox")) >= total, BURST_S, "the baseline's receipts")
        bdone = time.perf_counter() - bstart
    b.data["throughput"] = {
        "requests": total,
        "pisub_s": done,
        "write_s": written - start,
        "baseline_s": bdone,
    }
    b.row(
        "throughput",
        f"{total:,} requests dropped at once → all receipted",
        f"{total / done:,.0f} req/s",
        f"floor {total / bdone:,.0f} req/s; {done:.2f} s vs {bdone:.2f} s",
    )
    cli("stop", run.id, "--wait", "5", check=False)


# -- workflows ---------------------------------------------------------------------------------


def bench_workflow(b: Bench) -> None:
    """A 16-child parallel workflow of external-cli children: time to all 16 running, the
    coordinator's RSS, and a steer's round trip through the workflow's inbox to the child's
    receipt (and to the workflow's own final receipt), beside a single run's."""
    import psutil

    import pisub

    n_children = 16
    rounds = 1 if b.quick else 5
    b.agent("sleeper", "sleep", ["3600"])
    to_running, rss = [], []
    for _ in range(rounds):
        tasks = [arg for _ in range(n_children) for arg in ("--task", "sleeper=x")]
        start = time.perf_counter()
        run = pisub.Run(
            json.loads(cli("run", "--concurrency", str(n_children), *tasks, "--json").stdout)["runId"]
        )
        until(
            functools.partial(_all_running, run, n_children),
            120,
            f"the {n_children} children of {run.id} to run",
            interval=0.005,
        )
        to_running.append(time.perf_counter() - start)
        pid = run.status().pid
        assert pid is not None
        rss.append(psutil.Process(pid).memory_info().rss)
        last = run
        if len(to_running) < rounds:
            cli("stop", run.id, "--wait", "30", check=False)
            run.wait_until_terminal(60)
    singles = [timed(lambda: pisub.launch("sleeper", "x")) for _ in range(n_children)]
    stop_all_but(b, last.id)
    b.data["workflow"] = {"to_running_s": to_running, "rss": rss, "single_launch_s": singles}
    b.row(
        "workflow",
        f"run --parallel {n_children} children → all running p50",
        f"{statistics.median(to_running):.2f} s",
        f"{n_children} pisub.launch() one by one {sum(singles):.2f} s; "
        f"x{statistics.median(to_running) / sum(singles):.2f}",
    )
    b.row("workflow", f"coordinator RSS with {n_children} children", f"{max(rss) / 2**20:.1f} MiB")

    n = 50 if b.quick else 300
    child = last.status().steps[3].run_id
    assert child is not None
    to_child, to_parent = [], []
    parent_watch, child_watch = OutboxWatch(last.dir / "outbox"), OutboxWatch(pisub.Run(child).dir / "outbox")
    try:
        for i in range(n):
            rid = f"wf-{uuid.uuid4().hex[:12]}-{i:05d}"
            start = time.perf_counter()
            drop(last.dir / "inbox", rid + ".json", b'{"v":1,"type":"steer","message":"benchmark","child":3}')
            to_child.append(child_watch.wait(f"{rid}.c3.json") - start)
            final = parent_watch.wait_until(f"{rid}.json", functools.partial(_final, last, rid))
            to_parent.append(final - start)
    finally:
        parent_watch.stop()
        child_watch.stop()
    single = pisub.launch("sleeper", "x")
    direct = round_trips(single.dir / "inbox", single.dir / "outbox", n, STEER)
    b.data["workflow"].update(
        {"steer_to_child_s": to_child, "steer_to_parent_s": to_parent, "direct_s": direct}
    )
    base = statistics.median(direct)
    b.row(
        "workflow",
        "steer via the workflow's inbox → child's receipt p50 / p99",
        f"{ms(statistics.median(to_child))} / {ms(pct(to_child, 99))}",
        f"straight to a run {ms(base)}; x{statistics.median(to_child) / base:.1f}",
    )
    b.row(
        "workflow",
        "… → the workflow's final receipt p50 / p99",
        f"{ms(statistics.median(to_parent))} / {ms(pct(to_parent, 99))}",
        f"x{statistics.median(to_parent) / base:.1f}",
    )
    cli("stop", last.id, "--wait", "30", check=False)
    last.wait_until_terminal(60)


LANGUAGE_SCRIPTS = {
    "python": (
        "workflow.py",
        "async def main(runs, state, args):\n"
        "    n = args['n']\n"
        "    calls = [{'key': f'c{i}', 'agent': 'sleeper', 'task': 'x'} for i in range(n)]\n"
        "    return len(await runs.all(calls)) if n else 0\n",
    ),
    "javascript": (
        "workflow.js",
        "const n = args.n;\n"
        "const calls = Array.from({ length: n }, (_, i) => ({ key: 'c' + i, agent: 'sleeper', task: 'x' }));\n"  # noqa: E501
        "return n ? (await runs.all(calls)).length : 0;\n",
    ),
}


def bench_script_languages(b: Bench) -> None:
    """The same workflow in Python and in JavaScript (the embedded QuickJS): a script that
    returns at once (launch → complete: the coordinator's start-up with its engine) and a
    16-child ``runs.all`` fan-out (launch → all 16 running), with the coordinator's RSS."""
    import psutil

    import pisub

    n_children = 16
    rounds = 1 if b.quick else 5
    b.agent("sleeper", "sleep", ["3600"])
    folder = b.home.parent / "scripts"
    folder.mkdir(exist_ok=True)
    figures: dict[str, dict[str, list[float]]] = {}
    for language, (name, text) in LANGUAGE_SCRIPTS.items():
        script = folder / name
        script.write_text(text)
        done, to_running, rss = [], [], []
        for _ in range(rounds):
            start = time.perf_counter()
            run = pisub.launch_workflow(script, args={"n": 0})
            run.wait(timeout=60)
            done.append(time.perf_counter() - start)
        for _ in range(rounds):
            start = time.perf_counter()
            run = pisub.launch_workflow(script, args={"n": n_children}, concurrency=n_children)
            until(
                functools.partial(_all_running, run, n_children),
                120,
                f"the {n_children} children of the {language} workflow {run.id} to run",
                interval=0.005,
            )
            to_running.append(time.perf_counter() - start)
            pid = run.status().pid
            assert pid is not None
            rss.append(float(psutil.Process(pid).memory_info().rss))
            cli("stop", run.id, "--wait", "30", check=False)
            run.wait_until_terminal(60)
        figures[language] = {"return_s": done, "to_running_s": to_running, "rss": rss}
    b.data["languages"] = figures
    py, js = figures["python"], figures["javascript"]
    for what, field in (
        ("a script that returns: launch → complete p50", "return_s"),
        (f"runs.all of {n_children} children → all running p50", "to_running_s"),
    ):
        p50_js, p50_py = statistics.median(js[field]), statistics.median(py[field])
        b.row(
            "languages",
            f"JavaScript {what}",
            f"{p50_js:.3f} s",
            f"Python {p50_py:.3f} s; x{p50_js / p50_py:.2f}",
        )
    b.row(
        "languages",
        f"coordinator RSS with {n_children} children: JavaScript",
        f"{max(js['rss']) / 2**20:.1f} MiB",
        f"Python {max(py['rss']) / 2**20:.1f} MiB; +{(max(js['rss']) - max(py['rss'])) / 2**20:.1f} MiB",
    )


def _all_running(run: Any, count: int) -> bool:
    return [str(s.status) for s in run.status().steps].count("running") >= count


def _all_started(run: Any, count: int) -> bool:
    """Every child has been ``running`` (short children may have ended already)."""
    states = [str(s.status) for s in run.status().steps]
    return sum(state in ("running", "complete", "failed", "stopped") for state in states) >= count


def _running(run: Any) -> bool:
    from pisub.protocol.status import RunState

    return bool(run.status().state == RunState.RUNNING)


def _final(run: Any, rid: str) -> bool:
    receipt = run.receipt(rid)
    return receipt is not None and bool(receipt.state.is_final)


def stop_all_but(b: Bench, keep: str) -> None:
    """Stop every live run except the workflow ``keep`` and its children."""
    import pisub
    from pisub.errors import InboxClosed

    for st in pisub.list_runs(home=b.home, children=True):
        if st.state.is_terminal or keep in (st.run_id, st.parent_run_id):
            continue
        with contextlib.suppress(InboxClosed):
            pisub.Run(st.run_id).send_stop()


# -- fan-outs -----------------------------------------------------------------------------------

TREE_ENV = "PISUB_BENCH_TREE"
"""Set to a fresh value in the environment of one fan-out's ``pisub run``: every process of that
run's tree (the coordinator, the children's runners, their children and warm spares) inherits it."""


@dataclass
class _Proc:
    pidfd: int
    comm: str = ""
    cpu_ticks: int = 0
    rss_pages: int = 0
    gone: float | None = None


class Tree:
    """The processes of one run tree, found by :data:`TREE_ENV` in their environment: a thread
    scans ``/proc`` every ``interval`` s for new ones and samples each one's CPU time and RSS
    (the last value seen per process is its CPU: what a process spends after its last sample,
    at most ``interval`` s before it ends, is missed); a pidfd per process tells exactly when it
    ended. ``exclude``: pids not to count (the ``pisub run``/``stop`` commands, counted exactly
    by the caller)."""

    def __init__(self, tag: str, interval: float = 0.05, exclude: set[int] | None = None) -> None:
        import threading

        self.needle = f"{TREE_ENV}={tag}".encode()
        self.interval = interval
        self.procs: dict[int, _Proc] = {}
        self.others: set[int] = set()
        self.exclude: set[int] = set(exclude or ())
        self.peak_rss_pages = 0
        self.scans = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.tick = os.sysconf("SC_CLK_TCK")
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.thread.start()

    def _loop(self) -> None:
        import select

        next_scan = 0.0
        while not self.done.is_set():
            now = time.monotonic()
            if now >= next_scan:
                self.scan()
                next_scan = now + self.interval
            with self.lock:
                live = {p.pidfd: p for p in self.procs.values() if p.gone is None}
            ready, _, _ = select.select(list(live), [], [], max(0.0, next_scan - time.monotonic()))
            ended = time.perf_counter()
            with self.lock:
                for fd in ready:
                    live[fd].gone = ended

    def scan(self) -> None:
        with self.lock:
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                pid = int(name)
                if pid in self.others:
                    continue
                proc = self.procs.get(pid)
                if proc is None:
                    proc = self._discover(pid)
                    if proc is None:
                        continue
                if proc.gone is None:
                    self._sample(pid, proc)
            self.peak_rss_pages = max(
                self.peak_rss_pages, sum(p.rss_pages for p in self.procs.values() if p.gone is None)
            )
            self.scans += 1

    def _discover(self, pid: int) -> _Proc | None:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            self.others.add(pid)
            return None
        if self.needle not in env.split(b"\0") or pid in self.exclude:
            self.others.add(pid)
            return None
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None
        self.procs[pid] = proc = _Proc(fd)
        return proc

    def _sample(self, pid: int, proc: _Proc) -> None:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        comm, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        proc.comm = comm
        proc.cpu_ticks = max(proc.cpu_ticks, int(rest[11]) + int(rest[12]))
        proc.rss_pages = 0 if rest[0] == "Z" else int(rest[21])

    def wait_gone(self, timeout: float) -> float:
        """Block until every process of the tree has ended (and two scans after that found no
        new one); the ``perf_counter`` time the last one ended (to a pidfd's wake-up)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                live = sum(1 for p in self.procs.values() if p.gone is None)
                scans = self.scans
            if not live:
                until(functools.partial(self._scanned_since, scans), 10, "a scan of /proc")
                with self.lock:
                    if all(p.gone is not None for p in self.procs.values()):
                        return max((p.gone or 0.0 for p in self.procs.values()), default=time.perf_counter())
                continue
            if time.monotonic() >= deadline:
                raise BenchFailure(
                    f"{live} processes of a stopped run still there after {timeout:g} s: {self.left()}"
                )
            time.sleep(0.01)

    def left(self) -> str:
        """The processes not ended yet: pid and command line (for an error message)."""
        out = []
        with self.lock:
            for pid, proc in self.procs.items():
                if proc.gone is None:
                    with suppress(OSError):
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
                        out.append(f"{pid} {cmd}")
        return ", ".join(out)

    def _scanned_since(self, scans: int) -> bool:
        return self.scans >= scans + 2

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        for proc in self.procs.values():
            os.close(proc.pidfd)

    def cpu(self) -> tuple[float, float]:
        """CPU seconds of pisub's own processes (Python: runners, the coordinator, spares) and of
        the children (anything else: ``sleep``, pi's node)."""
        ours_, child = 0, 0
        for proc in self.procs.values():
            if proc.comm.startswith("python") or proc.comm == "pisub":
                ours_ += proc.cpu_ticks
            else:
                child += proc.cpu_ticks
        return ours_ / self.tick, child / self.tick


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fanout_once(
    pisub_cmd: list[str],
    n: int,
    task: str,
    server: Any = None,
    cwd: Path | None = None,
    finish: bool = False,
    extra_env: dict[str, str] | None = None,
) -> dict[str, float]:
    """One fan-out of ``n`` children running ``task`` (``AGENT=TEXT``) with ``pisub_cmd``: launch
    → all ``running`` (→ all first model requests with a ``server``), then ``pisub stop`` → no
    process of the run's tree left (``finish``: → the run ended by itself → no process left);
    CPU seconds of pisub (the two commands, counted exactly, and the tree's Python processes)
    and of the children; the tree's peak RSS."""
    import pisub

    tag = uuid.uuid4().hex
    env = {**os.environ, **(extra_env or {}), TREE_ENV: tag}
    tree = Tree(tag)
    seen = _child_requests(server) if server is not None else 0
    figures: dict[str, float] = {}
    try:
        cli_cpu = _children_cpu()
        start = time.perf_counter()
        argv = [*pisub_cmd, "run", "--concurrency", str(n), "--max-spawns", str(n + 8), "--json"]
        argv += [a for _ in range(n) for a in ("--task", task)]
        out = _tree_command(argv, env, tree, f"pisub run of {n} children", cwd=cwd)
        the_run = pisub.Run(json.loads(out)["runId"])
        started = functools.partial(_all_started if finish else _all_running, the_run, n)
        until(started, 300, f"the {n} children of {the_run.id} to run", 0.01)
        figures["to_running_s"] = time.perf_counter() - start
        if server is not None:
            until(lambda: _child_requests(server) >= seen + n, 300, f"{n} first model requests", 0.005)
            figures["to_first_request_s"] = time.perf_counter() - start
        if finish:
            until(functools.partial(_ended_any, the_run), 300, f"{the_run.id} to end", 0.01)
            figures["to_finished_s"] = time.perf_counter() - start
            figures["to_gone_s"] = tree.wait_gone(120) - start
        else:
            figures.update(_stop(pisub_cmd, the_run.id, env, tree))
        cli_cpu = _children_cpu() - cli_cpu
    finally:
        tree.close()
    pisub_cpu, child_cpu = tree.cpu()
    figures.update(
        {
            "pisub_cpu_s": pisub_cpu + cli_cpu,
            "cpu_s": pisub_cpu + cli_cpu + child_cpu,
            "cli_cpu_s": cli_cpu,
            "child_cpu_s": child_cpu,
            "peak_rss": float(tree.peak_rss_pages * tree.page),
            "processes": float(len(tree.procs)),
        }
    )
    return figures


def _stop(pisub_cmd: list[str], run_id: str, env: dict[str, str], tree: Tree) -> dict[str, float]:
    """``pisub stop RUN --wait 0`` → the command returned, → no process of the tree left."""
    stop_at = time.perf_counter()
    _tree_command([*pisub_cmd, "stop", run_id, "--wait", "0"], env, tree, f"pisub stop {run_id}")
    command = time.perf_counter() - stop_at
    return {"stop_command_s": command, "stop_s": tree.wait_gone(120) - stop_at}


def _tree_command(
    argv: list[str], env: dict[str, str], tree: Tree, what: str, cwd: Path | None = None
) -> str:
    """Run a ``pisub`` command of a fan-out (its process not counted in ``tree``: the caller
    counts the commands exactly); its output.

    Raises:
        BenchFailure: it failed."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree.exclude.add(proc.pid)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise BenchFailure(f"{what} failed: {err.strip()[-300:]}")
    return out


def max_concurrency(pisub_cmd: list[str]) -> int:
    """The largest ``--concurrency`` the checkout of ``pisub_cmd`` accepts (the one before
    issue 29 caps it at 20), read from its own protocol."""
    python = Path(pisub_cmd[0]).parent / "python"
    if not python.exists():
        python = Path(sys.executable)
    code = "from pisub.protocol.workflow import MAX_CONCURRENCY; print(MAX_CONCURRENCY)"
    # -I, run from /: the checkout's own pisub, never the one in the working directory
    out = subprocess.run(
        [str(python), "-I", "-c", code], capture_output=True, text=True, check=False, cwd="/"
    )
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else 1 << 30


def _child_requests(server: Any) -> int:
    """The model requests of children so far: those whose conversation holds the children's
    :data:`anchor.CHILD_MARK` but not the original's parent's ``CALLS:`` prompt (which names the
    children's task too)."""
    from anchor import CHILD_MARK

    count = 0
    for body in list(server.requests):
        text = json.dumps(body.get("messages", []))
        count += CHILD_MARK in text and "CALLS:" not in text
    return count


def bench_fanout(b: Bench) -> None:
    """Fan-outs of 16 and 64 external-CLI children (``sleep 3600``) and of 16 pi children (the
    scripted model streaming without end), launched with ``pisub run --task …``: launch → all
    ``running`` (→ all first model requests), ``pisub stop`` → no process of the tree left, CPU
    seconds per child (pisub's Python / the child), peak RSS. With --quick: 8 external-CLI
    children once, no pi."""
    b.agent("sleeper", "sleep", ["3600"])
    rounds = 1 if b.quick else 3
    b.data["fanout"] = {}
    # PISUB_BENCH_FANOUT="64" (or "16 64 pi"): only those fan-outs (while working on one of them).
    chosen = os.environ.get("PISUB_BENCH_FANOUT", "").split() or (["8"] if b.quick else ["16", "64", "pi"])
    for n in [int(size) for size in chosen if size.isdigit()]:
        # A checkout that refuses n children at once (before issue 29: at most 20) is measured
        # with as many as it takes; its row is labelled with that count, and no ratio is given.
        sizes = {label: min(n, max_concurrency(cmd)) for label, cmd in b.checkouts}
        size_of = {tuple(cmd): sizes[label] for label, cmd in b.checkouts}
        figures = b.alternate(rounds, lambda cmd: fanout_once(cmd, size_of[tuple(cmd)], "sleeper=x"))  # noqa: B023
        _fanout_rows(b, f"{n} external-CLI", n, figures, sizes)
        b.data["fanout"][f"external_{n}"] = figures
        if any(size != n for size in sizes.values()):
            b.data["fanout"][f"external_{n}_sizes"] = sizes
            b.notes.append(
                f"fanout: {n} external-CLI: "
                + ", ".join(
                    f"{label} capped --concurrency at {size}" for label, size in sizes.items() if size != n
                )
                + f": measured with that many children (times not comparable with {n}: no ratio given)"
            )
    if b.quick:
        b.notes.append("fanout: the 16 pi children are skipped with --quick")
        return
    if "pi" not in chosen:
        return
    from anchor import CHILD_MARK

    from pisub.testing.fake_model import FakeModelServer, pi_env, write_pi_agent_dir

    pi_bin = _pi_bin()
    if pi_bin is None:
        b.notes.append("fanout: pi is not installed (scripts/install_pi.sh): the pi fan-out was skipped")
        return
    n = 16
    with FakeModelServer(slow_delay=0.05) as server:
        agent_dir, workdir = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
        write_pi_agent_dir(agent_dir, server.base_url)
        os.environ.update({**pi_env(agent_dir), "PISUB_PI_BIN": pi_bin})
        b.agent("pi", "", [], runner="pi")
        figures = b.alternate(
            rounds,
            lambda cmd: fanout_once(
                cmd, n, f"pi={CHILD_MARK} SLOW:1000000 a story", server=server, cwd=workdir
            ),
        )
        shutil.rmtree(agent_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    _fanout_rows(b, f"{n} pi", n, figures)
    b.data["fanout"][f"pi_{n}"] = figures


def _pi_bin() -> str | None:
    from pisub.testing.pi_pins import pinned_pi_bins

    default = next(iter(pinned_pi_bins(ROOT).values()), ROOT / ".pi-cli" / "bin" / "pi")
    pi_bin = os.environ.get("PISUB_PI_BIN") or str(default)
    return pi_bin if os.access(pi_bin, os.X_OK) else None


def _fanout_rows(
    b: Bench,
    what: str,
    n: int,
    figures: dict[str, list[dict[str, float]]],
    sizes: dict[str, int] | None = None,
) -> None:
    sizes = sizes or {}
    capped = {label: size for label, size in sizes.items() if size != n}

    def of(key: str) -> dict[str, list[float]]:
        return {label: [f[key] for f in runs] for label, runs in figures.items()}

    def versus(figures_: dict[str, list[float]], show: Callable[[float], str]) -> str:
        """The baseline's figure; when it ran fewer children (its cap), labelled so, no ratio."""
        size = capped.get("before")
        if size is None or not figures_.get("before"):
            return b.versus(figures_, show)
        return f"before, {size} children (its cap) {show(statistics.median(figures_['before']))}"

    def med(key: str, label: str = "this") -> float:
        return statistics.median(of(key)[label])

    secs = "{:.2f} s".format
    aim = " (aim ≤ 4 s)" if n == 64 and "external" in what else ""
    b.row(
        "fanout",
        f"{what}: launch → all running, p50{aim}",
        secs(med("to_running_s")),
        versus(of("to_running_s"), secs),
    )
    if "to_first_request_s" in figures["this"][0]:
        b.row(
            "fanout",
            f"{what}: launch → all first model requests, p50",
            secs(med("to_first_request_s")),
            versus(of("to_first_request_s"), secs),
        )
    aim = " (aim ≤ 1 s)" if n == 64 and "external" in what else ""
    b.row(
        "fanout",
        f"{what}: pisub stop → no process left, p50{aim}",
        secs(med("stop_s")),
        versus(of("stop_s"), secs),
    )
    per = {label: [f["pisub_cpu_s"] / sizes.get(label, n) for f in runs] for label, runs in figures.items()}
    b.row(
        "fanout",
        f"{what}: CPU s per child, pisub / child (aim pisub ≤ 0.15)",
        f"{statistics.median(per['this']):.3f} / {med('child_cpu_s') / n:.3f}",
        joined(
            f"of which the run/stop commands {med('cli_cpu_s') / n:.3f}",
            f"peak RSS {med('peak_rss') / 2**20:.0f} MiB",
            versus(per, "{:.3f}".format),
        ),
    )


# -- 4. footprint ---------------------------------------------------------------------------------


def thread_switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def bench_footprint(b: Bench) -> None:
    import psutil

    import pisub

    seconds = 2 if b.quick else 60
    b.agent("sleeper", "sleep", ["3600"])
    run = pisub.launch("sleeper", "x")
    time.sleep(1.0)  # let start-up settle (watchdog import, first scan)
    pid = run.status().pid
    assert pid is not None
    proc = psutil.Process(pid)
    rss = proc.memory_info().rss
    cpu0, sw0, t0 = sum(proc.cpu_times()[:2]), thread_switches(pid), time.monotonic()
    time.sleep(seconds)
    cpu1, sw1, t1 = sum(proc.cpu_times()[:2]), thread_switches(pid), time.monotonic()
    wall = t1 - t0
    with _env("PISUB_WARM", "0"):
        cold = pisub.launch("sleeper", "x")
    time.sleep(1.0)
    cold_pid = cold.status().pid
    assert cold_pid is not None
    cold_rss = psutil.Process(cold_pid).memory_info().rss
    cold.send_stop()
    py = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    time.sleep(0.5)
    py_rss = psutil.Process(py.pid).memory_info().rss
    py.kill()
    py.wait()
    b.data["footprint"] = {
        "rss_bytes": rss,
        "idle_cpu_s": cpu1 - cpu0,
        "idle_wall_s": wall,
        "wakeups": sw1 - sw0,
        "bare_python_rss_bytes": py_rss,
        "cold_rss_bytes": cold_rss,
    }
    b.row(
        "footprint",
        "runner RSS (without its child), warm / cold start",
        f"{rss / 2**20:.1f} / {cold_rss / 2**20:.1f} MiB",
        f"bare python {py_rss / 2**20:.1f} MiB",
    )
    b.row(
        "footprint",
        f"idle runner CPU over {seconds} s",
        f"{100 * (cpu1 - cpu0) / wall:.3f} %",
        f"{sw1 - sw0} wake-ups ({(sw1 - sw0) / wall:.1f}/s)",
    )
    cli("stop", run.id, "--wait", "5", check=False)


# -- 5. scale -------------------------------------------------------------------------------------


def bench_scale(b: Bench) -> None:
    import pisub

    counts = [20] if b.quick else [100, 200]
    b.agent("sleeper", "sleep", ["3600"])
    for count in counts:
        start = time.perf_counter()
        runs = [pisub.launch("sleeper", "x") for _ in range(count)]
        launched = time.perf_counter() - start
        polling = sum(1 for r in runs if _watch(r) == "polling")
        latencies = []
        for r in runs:
            t0 = time.perf_counter()
            rid = r.send_steer("scale")
            r.wait_for_receipt(rid, 30)
            latencies.append(time.perf_counter() - t0)
        b.data[f"scale_{count}"] = {"launch_all_s": launched, "receipt_s": latencies, "polling_runs": polling}
        b.row(
            "scale",
            f"{count} runs: launch all",
            f"{launched:.1f} s",
            f"{launched / count * 1000:.0f} ms per run",
        )
        b.row(
            "scale",
            f"{count} runs: steer each, receipt p50 / p99",
            f"{ms(pct(latencies, 50))} / {ms(pct(latencies, 99))}",
            f"{polling} runs polling (no inotify left)",
        )
        stop_all(b)


def _watch(run: Any) -> str | None:
    """How a run's runner watches its inbox (inotify or polling), once it says so."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        inbox = run.status().inbox
        if inbox is not None:
            return str(inbox.watch)
        time.sleep(0.02)
    return None


def make_finished_runs(count: int, full: int | None = None) -> Path:
    """A fresh PISUB_HOME holding ``count`` finished runs: the first ``full`` (all by default)
    as a runner leaves them, the others with just what a reader of many runs reads (their
    status and a quiet inbox: :func:`_light_finished_run`; made without fsyncs, far faster)."""
    from pisub.protocol import AgentSpec, Limits, Manifest, RunState, now_iso
    from pisub.store.mailbox import mark_answered, new_mtime
    from pisub.store.paths import open_home
    from pisub.store.results import make_result
    from pisub.store.runs import RunStore, load_status, write_result, write_status

    other = Path(tempfile.mkdtemp()) / "home"
    home = open_home(other)
    store = RunStore(home)
    spec = AgentSpec(name="fake", runner="external-cli", command="true")
    limits = Limits(timeout=1, idle_timeout=None, grace=1, output_cap=1, output_hard_cap=1)
    for _ in range(count if full is None else min(full, count)):
        manifest = Manifest(
            v=1,
            run_id=str(uuid.uuid4()),
            created_at=now_iso(),
            agent=spec,
            task="t",
            cwd="/",
            umask=0o022,
            limits=limits,
        )
        paths, fd = store.create(manifest)
        os.close(fd)
        status = load_status(paths)
        status.state = RunState.COMPLETE
        status.ended_at = now_iso()
        write_result(
            paths,
            make_result(
                run_id=manifest.run_id, state="complete", agent="fake", task="t", exit_code=0, output="ok"
            ),
        )
        write_status(paths, status, durable=False)
        mark_answered(paths, new_mtime(paths))  # as a runner leaves a finished run
    runs = other / "runs"
    template = next(iter(runs.iterdir()))
    body, old_id = (template / "status.json").read_bytes(), template.name.encode()
    for _ in range(count - len(os.listdir(runs))):
        _light_finished_run(runs, body, old_id)
    return other


READ_AND_DECODE = """
import os, sys, msgspec
decode = msgspec.json.Decoder().decode
runs = sys.argv[1]
names = sys.argv[2:] or os.listdir(runs)
for name in names:
    try:
        with open(os.path.join(runs, name, "status.json"), "rb") as fh:
            decode(fh.read())
    except OSError:
        pass
"""
"""The floor of ``list`` / ``status``: an interpreter that lists the runs (or takes the names
given), reads every ``status.json`` and decodes it with msgspec (untyped), nothing more."""


def interleaved(rounds: int, measures: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each measurement ``rounds`` times, round by round, the order rotated every round."""
    names = list(measures)
    figures: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            figures[name].append(measures[name]())
    return figures


def each_checkout(b: Bench, *args: str, env: dict[str, str] | None = None) -> dict[str, Callable[[], float]]:
    """For :func:`interleaved`: ``pisub ARGS`` timed, once per checkout (``this``/``before``)."""
    return {
        label: functools.partial(lambda argv: timed(lambda: run([*argv, *args], env=env)), argv)
        for label, argv in b.checkouts
    }


def bench_commands(b: Bench) -> None:
    """``pisub --help``, ``status --json``, ``list --json`` over 10,000 runs (1,000 with --quick)
    and ``list --state running`` over 100,000 (2,000), each beside its floor measured in the same
    rounds: the interpreter's start (``python -c pass``, ``python -S -c pass``, the same
    interpreter), an interpreter that reads and decodes the same status files, ``cat`` of them."""
    count = 1000 if b.quick else 10_000
    rounds = 2 if b.quick else 10
    other = make_finished_runs(count, full=20 if b.quick else 200)  # the rest light: what a reader reads
    runs = other / "runs"
    env = {**os.environ, "PISUB_HOME": str(other)}
    one = next(iter(os.listdir(runs)))
    py = sys.executable
    floors = {
        "python -c pass": lambda: timed(lambda: run([py, "-c", "pass"])),
        "python -S -c pass": lambda: timed(lambda: run([py, "-S", "-c", "pass"])),
    }
    help_ = interleaved(rounds, {**each_checkout(b, "--help", env=env), **floors})
    status = interleaved(
        rounds,
        {
            **each_checkout(b, "status", one, "--json", env=env),
            **floors,
            "read and decode": lambda: timed(lambda: run([py, "-c", READ_AND_DECODE, str(runs), one])),
            "cat": lambda: timed(lambda: run(["cat", str(runs / one / "status.json")])),
        },
    )
    listed = interleaved(
        rounds // 2,
        {
            **each_checkout(b, "list", "--json", env=env),
            "read and decode": lambda: timed(lambda: run([py, "-c", READ_AND_DECODE, str(runs)])),
            "cat": lambda: timed(
                lambda: run(["sh", "-c", 'cat "$1"/*/status.json >/dev/null', "sh", str(runs)])
            ),
        },
    )
    b.data["commands"] = {"runs": count, "help_s": help_, "status_s": status, "list_s": listed}
    med = statistics.median
    b.row(
        "commands",
        "pisub --help",
        ms(med(help_["this"])),
        joined(
            f"python -c pass {ms(med(help_['python -c pass']))}, -S {ms(med(help_['python -S -c pass']))}",
            b.versus(help_, ms),
        ),
    )
    b.row(
        "commands",
        "pisub status ID --json (aim ≤ 100 ms)",
        ms(med(status["this"])),
        joined(
            f"python -c pass {ms(med(status['python -c pass']))}",
            f"read + decode it {ms(med(status['read and decode']))}, cat {ms(med(status['cat']))}",
            b.versus(status, ms),
        ),
    )
    floor = med(listed["read and decode"])
    b.row(
        "commands",
        f"pisub list --json over {count:,} runs (aim ≤ x1.3 the floor)",
        ms(med(listed["this"])),
        joined(
            f"python floor (list, read, decode) {ms(floor)}: x{med(listed['this']) / floor:.2f}",
            f"cat {ms(med(listed['cat']))}",
            b.versus(listed, ms),
        ),
    )
    bench_list_running(b, other, env, 2_000 if b.quick else 100_000)
    shutil.rmtree(other.parent, ignore_errors=True)


def bench_list_running(b: Bench, other: Path, env: dict[str, str], total: int) -> None:
    """``pisub list --state running`` over ``total`` runs, three of them running: through the
    index of live runs, and by reading every run (``index/live.ok`` removed before each)."""
    import pisub

    runs = other / "runs"
    template = next(iter(runs.iterdir()))
    status = (template / "status.json").read_bytes()
    old_id = template.name.encode()
    for _ in range(total - len(os.listdir(runs))):
        _light_finished_run(runs, status, old_id)
    b.agent("sleeper", "sleep", ["3600"])
    shutil.copy(b.home / "agents" / "sleeper.md", _agents(other))
    live = [pisub.launch("sleeper", "x", home=other) for _ in range(3)]
    args = ["list", "--state", "running", "--json"]

    def scanned_once() -> float:
        (other / "index" / "live.ok").unlink(missing_ok=True)
        return timed(lambda: run([*b.pisub, *args], env=env))

    rounds = 2 if b.quick else 10
    indexed = interleaved(
        rounds,
        {
            **each_checkout(b, *args, env=env),
            "python -c pass": lambda: timed(lambda: run([sys.executable, "-c", "pass"])),
        },
    )
    scanned = [scanned_once() for _ in range(3)]
    found = run([*b.pisub, *args], env=env).stdout.splitlines()
    for live_run in live:
        live_run.send_stop()
    b.data["list_running"] = {
        "runs": total,
        "indexed_s": indexed["this"],
        "indexed_before_s": indexed.get("before", []),
        "python_pass_s": indexed["python -c pass"],
        "scanned_s": scanned,
        "found": len(found),
    }
    b.row(
        "commands",
        f"pisub list --state running over {total:,} runs, 3 live (aim ≤ 100 ms)",
        ms(statistics.median(indexed["this"])),
        joined(
            f"python -c pass {ms(statistics.median(indexed['python -c pass']))}",
            f"reading every run {ms(statistics.median(scanned))}",
            b.versus(indexed, ms),
        ),
    )


def _agents(home: Path) -> Path:
    folder = home / "agents"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _light_finished_run(runs: Path, status: bytes, old_id: bytes) -> None:
    """A finished run as a reader of many runs sees it: its status and a quiet inbox."""
    run_id = str(uuid.uuid4())
    root = runs / run_id
    os.mkdir(root, 0o700)
    (root / "status.json").write_bytes(status.replace(old_id, run_id.encode()))
    os.makedirs(root / "inbox" / "new", mode=0o700)
    marker = root / "inbox" / "answered"
    marker.write_bytes(b"")
    mtime = os.stat(root / "inbox" / "new").st_mtime_ns
    os.utime(marker, ns=(mtime, mtime))


# -- 6. the real pi -----------------------------------------------------------------------------


def bench_pi(b: Bench) -> None:
    import pisub
    from pisub.testing.fake_model import FakeModelServer, pi_env, write_pi_agent_dir
    from pisub.testing.pi_pins import pinned_pi_bins

    default = next(iter(pinned_pi_bins(ROOT).values()), ROOT / ".pi-cli" / "bin" / "pi")
    pi_bin = os.environ.get("PISUB_PI_BIN") or str(default)
    if not os.access(pi_bin, os.X_OK):
        b.notes.append(f"pi: not installed at {pi_bin} (scripts/install_pi.sh): section skipped")
        return
    n = 1 if b.quick else 5
    tasks = [("tool call + answer", "please run TOOL: echo hi"), ("3 s streamed reply", "SLOW:60 a story")]
    with FakeModelServer(slow_delay=0.05) as server:
        agent_dir = Path(tempfile.mkdtemp())
        write_pi_agent_dir(agent_dir, server.base_url)
        os.environ.update({**pi_env(agent_dir), "PISUB_PI_BIN": pi_bin})
        b.agent("pi", "", [], runner="pi")
        workdir = Path(tempfile.mkdtemp())
        b.data["pi"] = {}
        for label, task in tasks:
            direct, direct_rss, through, through_rss = [], [], [], []
            for i in range(n):
                session = workdir / f"direct-{label[:4]}-{i}.jsonl"
                argv = [
                    pi_bin,
                    "--mode",
                    "json",
                    "--no-extensions",
                    "--no-skills",
                    "--no-prompt-templates",
                    "--session",
                    str(session),
                    "-p",
                    task,
                ]
                start = time.perf_counter()
                proc = subprocess.Popen(
                    argv,
                    cwd=workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                direct_rss.append(peak_rss([proc.pid], functools.partial(exited, proc)))
                direct.append(time.perf_counter() - start)
                start = time.perf_counter()
                run = pisub.launch("pi", task, cwd=workdir)
                pids = [run.status().pid or 0, run.status().steps[0].pid or 0]
                through_rss.append(peak_rss(pids, functools.partial(ended, run)))
                run.wait(timeout=60)
                through.append(time.perf_counter() - start)
            b.data["pi"][label] = {
                "direct_s": direct,
                "pisub_s": through,
                "direct_peak_rss": direct_rss,
                "pisub_peak_rss": through_rss,
            }
            d, t = statistics.median(direct), statistics.median(through)
            b.row(
                "pi",
                f"{label}: wall, pisub vs pi --mode json",
                f"{t:.2f} s",
                f"direct {d:.2f} s; overhead {100 * (t - d) / d:+.1f} % ({(t - d) * 1000:+.0f} ms)",
            )
            b.row(
                "pi",
                f"{label}: peak RSS (runner + pi) vs pi alone",
                f"{statistics.median(through_rss) / 2**20:.0f} MiB",
                f"pi alone {statistics.median(direct_rss) / 2**20:.0f} MiB",
            )
        shutil.rmtree(agent_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


def bench_pi_versions(b: Bench) -> None:
    """Per supported pi version: launch → the first model request, and pi's peak RSS."""
    import pisub
    from pisub.testing.fake_model import FakeModelServer, pi_env, write_pi_agent_dir
    from pisub.testing.pi_pins import pinned_pi_bins

    bins = pinned_pi_bins(ROOT)
    if not bins:
        b.notes.append("pi-versions: no pinned pi installed (scripts/install_pi.sh all): section skipped")
        return
    n = 1 if b.quick else 5
    with FakeModelServer(slow_delay=0.05) as server:
        agent_dir = Path(tempfile.mkdtemp())
        write_pi_agent_dir(agent_dir, server.base_url)
        os.environ.update(pi_env(agent_dir))
        b.agent("pi", "", [], runner="pi")
        workdir = Path(tempfile.mkdtemp())
        b.data["pi_versions"] = {}
        for version, pi_bin in bins.items():
            os.environ["PISUB_PI_BIN"] = str(pi_bin)
            first, rss = [], []
            for _ in range(n):
                seen = len(server.requests)
                start = time.perf_counter()
                run = pisub.launch("pi", "hello", cwd=workdir)
                server.wait_for_requests(seen + 1, timeout=60)
                first.append(time.perf_counter() - start)
                rss.append(peak_rss([run.status().steps[0].pid or 0], functools.partial(ended, run)))
                run.wait(timeout=60)
            b.data["pi_versions"][version] = {"first_request_s": first, "pi_peak_rss": rss}
            b.row(
                "pi",
                f"pi {version}: launch → first model request, p50",
                ms(statistics.median(first)),
                f"pi peak RSS {statistics.median(rss) / 2**20:.0f} MiB",
            )
        shutil.rmtree(agent_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


def exited(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


def ended(run: Any) -> bool:
    """Cheap enough to poll without loading the machine: the result is written at the end."""
    return bool((run.dir / "result.json").exists())


def peak_rss(pids: list[int], done: Callable[[], bool]) -> int:
    import psutil

    peak = 0
    deadline = time.monotonic() + 300
    while not done():
        if time.monotonic() >= deadline:
            raise BenchFailure(f"processes {pids} still going after 300 s")
        total = 0
        for pid in pids:
            with suppress(psutil.Error):
                total += psutil.Process(pid).memory_info().rss
        peak = max(peak, total)
        time.sleep(0.02)
    return peak


# -- main ---------------------------------------------------------------------------------------


def machine() -> str:
    cpu = "?"
    with suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    system = f"{platform.system()} {platform.release()}"
    return f"{system}, {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


# -- top ------------------------------------------------------------------------------------------


class Pty:
    """A command in a pseudo-terminal of ``rows`` x ``cols``, its output read by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str], rows: int = 40, cols: int = 160) -> None:
        import fcntl
        import struct
        import termios
        import threading

        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**env, "TERM": "xterm-256color"},
            start_new_session=True,
        )
        os.close(slave)
        self.output = bytearray()
        self.last_output = self.started
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.output += data
                self.last_output = time.perf_counter()

    def shows(self, text: str, since: int = 0) -> bool:
        with self.lock:
            return text.encode() in self.output[since:]

    def size(self) -> int:
        with self.lock:
            return len(self.output)

    def close(self) -> None:
        with suppress(OSError):
            os.write(self.master, b"q")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
        self.reader.join(timeout=5)


def _new_finished_run(runs: Path, template: Path) -> str:
    """A finished run newer than every other (the top row of ``pisub top``), made aside and
    renamed into ``runs/`` in one step; its id."""
    from pisub.protocol import now_iso

    status = json.loads((template / "status.json").read_bytes())
    run_id = str(uuid.uuid4())
    stamp = now_iso()
    status.update({"runId": run_id, "startedAt": stamp, "updatedAt": stamp, "endedAt": stamp})
    staging = runs.parent / f"staging-{run_id}"
    os.makedirs(staging / "inbox" / "new", mode=0o700)
    (staging / "status.json").write_text(json.dumps(status))
    (staging / "inbox" / "answered").write_bytes(b"")
    mtime = os.stat(staging / "inbox" / "new").st_mtime_ns
    os.utime(staging / "inbox" / "answered", ns=(mtime, mtime))
    os.rename(staging, runs / run_id)
    return run_id


def top_once(
    b: Bench, pisub_cmd: list[str], env: dict[str, str], newest: str, runs: Path
) -> dict[str, float]:
    """``pisub top`` in a pty: start → the first screen (the newest run's id shown); a finished
    run added (renamed into ``runs/``) → shown (each 0.3 s after the screen's last output, past
    the redraw's minimum interval), three times; its CPU over an idle stretch."""
    import psutil

    idle = 2.0 if b.quick else 10.0
    template = runs / newest
    top = Pty([*pisub_cmd, "top"], env)
    try:
        until(functools.partial(top.shows, newest[:8]), 60, "pisub top's first screen", 0.002)
        figures: dict[str, Any] = {"first_screen_s": time.perf_counter() - top.started, "refresh_s": []}
        for _ in range(3):
            until(lambda: time.perf_counter() - top.last_output > 0.3, 10, "pisub top to be quiet", 0.01)
            mark = top.size()
            start = time.perf_counter()
            run_id = _new_finished_run(runs, template)
            until(functools.partial(top.shows, run_id[:8], mark), 30, "pisub top to show a new run", 0.002)
            figures["refresh_s"].append(time.perf_counter() - start)
        time.sleep(1.0)  # (not timed) the last redraw done
        proc = psutil.Process(top.proc.pid)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
        time.sleep(idle)
        cpu1, t1 = sum(proc.cpu_times()[:2]), time.perf_counter()
        figures["idle_cpu_pct"] = 100 * (cpu1 - cpu0) / (t1 - t0)
    finally:
        top.close()
    return figures


def bench_top(b: Bench) -> None:
    """``pisub top`` over 10,000 runs (300 with --quick), 20 of them live: start → the first
    screen, a new run → shown (the refresh: re-reading the runs, redrawing), and its CPU while
    nothing happens (the clock ticks once a second), in a pseudo-terminal of 160 x 40."""
    import pisub

    count, live_n = (300, 4) if b.quick else (10_000, 20)
    rounds = 1 if b.quick else 3
    other = make_finished_runs(count - live_n, full=100)
    env = {**os.environ, "PISUB_HOME": str(other)}
    b.agent("sleeper", "sleep", ["3600"])
    shutil.copy(b.home / "agents" / "sleeper.md", _agents(other))
    live = [pisub.launch("sleeper", "x", home=other) for _ in range(live_n)]
    runs = other / "runs"
    try:
        figures = b.alternate(rounds, lambda cmd: top_once(b, cmd, env, live[-1].id, runs))
    finally:
        for live_run in live:
            live_run.send_stop()
        for live_run in live:
            with suppress(Exception):
                live_run.wait_until_terminal(30)
        shutil.rmtree(other.parent, ignore_errors=True)
    b.data["top"] = {"runs": count, "live": live_n, "by_checkout": figures}

    def of(key: str) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for label, rounds_ in figures.items():
            out[label] = [v for f in rounds_ for v in (f[key] if isinstance(f[key], list) else [f[key]])]
        return out

    what = f"pisub top over {count:,} runs, {live_n} live"
    for key, label, show in (
        ("first_screen_s", "start → first screen, p50", ms),
        ("refresh_s", "a new run → shown (refresh), p50", ms),
        ("idle_cpu_pct", "idle CPU, % of a core (aim ≤ 1 %)", "{:.2f} %".format),
    ):
        values = of(key)
        b.row("top", f"{what}: {label}", show(statistics.median(values["this"])), b.versus(values, show))


# -- anchor (opt-in: --only anchor) ---------------------------------------------------------------


def _tagged(tag: str) -> set[int]:
    needle = f"{TREE_ENV}={tag}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with suppress(OSError):
                if needle in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                    found.add(int(name))
    return found


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def original_once(
    parent: Any, tag: str, server: Any, temp_root: Path, n: int, task: str, finish: bool
) -> dict[str, float]:
    """One fan-out by the original: the parent pi is prompted, its scripted model calls the
    ``subagent`` tool (an async ``runs.all`` of ``n`` children) → all first model requests of
    the children → the workflow's ``complete`` → no process of it left (``finish``), or the
    parent prompted again, its model calling ``subagent`` with ``action: "stop"`` → no process
    left. CPU: every process the fan-out started (the children's runners, each hosting its pi
    session) plus what the parent spent meanwhile (it runs the workflow script)."""
    import anchor

    tree = Tree(tag, exclude=_tagged(tag))  # not the parent, nor what it keeps between fan-outs
    seen = _child_requests(server)
    before = set(anchor.run_dirs(temp_root))
    figures: dict[str, float] = {}
    try:
        parent_cpu = _cpu_of(parent.proc.pid)
        start, since = parent.prompt(anchor.prompt(n, task))
        _, event = parent.wait_event(
            lambda e: e.get("type") == "tool_execution_end" and e.get("toolName") == "subagent", 300, since
        )
        details = (event.get("result") or {}).get("details") or {}
        run_id = details.get("runId")
        if not run_id:
            text = json.dumps(event.get("result"))[:300]
            raise anchor.Unavailable(f"the original's subagent tool started no run: {text}")
        figures["tool_returned_s"] = time.perf_counter() - start
        until(
            lambda: _child_requests(server) >= seen + n,
            300,
            f"the original's {n} first model requests",
            0.005,
        )
        figures["to_first_request_s"] = time.perf_counter() - start
        if finish:

            def complete() -> bool:
                status = anchor.status_of(temp_root, run_id)
                return status is not None and status.get("state") in ("complete", "failed", "stopped")

            until(complete, 300, f"the original's workflow {run_id} to end", 0.01)
            figures["to_finished_s"] = time.perf_counter() - start
            state = (anchor.status_of(temp_root, run_id) or {}).get("state")
            if state != "complete":
                raise BenchFailure(f"the original's workflow {run_id} ended {state}")
            figures["to_gone_s"] = tree.wait_gone(120) - start
        else:
            parent.wait_event(lambda e: e.get("type") == "agent_end", 60, since)
            stop_at, since = parent.prompt(anchor.stop_prompt(run_id))
            figures["stop_s"] = tree.wait_gone(120) - stop_at
            _, event = parent.wait_event(
                lambda e: e.get("type") == "tool_execution_end" and e.get("toolName") == "subagent", 60, since
            )
            if event.get("isError"):
                raise anchor.Unavailable(
                    f"the original's stop failed: {json.dumps(event.get('result'))[:300]}"
                )
        parent.wait_idle(120)
        parent_cpu = _cpu_of(parent.proc.pid) - parent_cpu
    finally:
        tree.close()
    runner_cpu, child_cpu = tree.cpu()
    figures.update(
        {
            "cpu_s": runner_cpu + child_cpu + parent_cpu,
            "parent_cpu_s": parent_cpu,
            "peak_rss": float(tree.peak_rss_pages * tree.page),
            "parent_rss": float(
                int(Path(f"/proc/{parent.proc.pid}/statm").read_text().split()[1]) * tree.page
            ),
            "processes": float(len(tree.procs)),
            "runs": float(len(set(anchor.run_dirs(temp_root)) - before)),
        }
    )
    return figures


def bench_anchor(b: Bench) -> None:
    """The original pi-subagents 0.67.0 (npm, installed once into a cache folder) beside pisub,
    the same pi 0.85.1 and the same scripted model, alternating round by round: a 16-child pi
    fan-out (4 with --quick) → all first model requests, → finished (each child streams 2 s), →
    no process left, its CPU and peak RSS; and the same fan-out streaming without end, stopped
    → no process left. The original is driven as a user drives it: one parent ``pi --mode rpc
    -e pi-subagents/index.ts`` for the whole section, whose model calls its ``subagent`` tool."""
    import anchor

    from pisub.testing.fake_model import FakeModelServer, pi_env, write_pi_agent_dir
    from pisub.testing.pi_pins import pinned_pi_bins

    pi_bin = pinned_pi_bins(ROOT).get(anchor.PI_VERSION)
    if pi_bin is None:
        b.notes.append(
            f"anchor: pi {anchor.PI_VERSION} is not installed (scripts/install_pi.sh all): skipped"
        )
        return
    try:
        package = anchor.install()
    except anchor.Unavailable as exc:
        b.notes.append(f"anchor: skipped: {exc}")
        return
    n = 4 if b.quick else 16
    rounds = 1 if b.quick else 3
    finite, endless = f"{anchor.CHILD_MARK} SLOW:40 a story", f"{anchor.CHILD_MARK} SLOW:1000000 a story"
    scratch = b.home.parent / "anchor"
    agent_dir, temp_root, workdir = scratch / "agent", scratch / "root", scratch / "work"
    workdir.mkdir(parents=True)
    tag = uuid.uuid4().hex
    with FakeModelServer(slow_delay=0.05) as server:
        write_pi_agent_dir(agent_dir, server.base_url)
        env = {**os.environ, **pi_env(agent_dir), "PI_SUBAGENTS_TEMP_ROOT": str(temp_root), TREE_ENV: tag}
        parent = anchor.Parent(str(pi_bin), package, agent_dir, workdir, env)
        try:
            start = time.perf_counter()
            parent.call({"type": "get_state"}, timeout=600)
            b.data["anchor"] = {"parent_start_s": time.perf_counter() - start}
            original_once(parent, tag, server, temp_root, n, finite, True)  # warm-up: jiti's cache
            b.agent("bench", "", [], runner="pi")
            pisub_env = {"PISUB_PI_BIN": str(pi_bin)}
            figures: dict[str, list[dict[str, float]]] = {
                "original": [],
                "pisub": [],
                "original stop": [],
                "pisub stop": [],
            }
            pisub_env = {**pi_env(agent_dir), **pisub_env}

            def original(fin: bool) -> dict[str, float]:
                return original_once(parent, tag, server, temp_root, n, finite if fin else endless, fin)

            def ours_(fin: bool) -> dict[str, float]:
                task = f"bench={finite if fin else endless}"
                return fanout_once(b.pisub, n, task, server, workdir, fin, pisub_env)

            sides: list[tuple[str, Callable[[bool], dict[str, float]]]] = [
                ("original", original),
                ("pisub", ours_),
            ]
            for i in range(rounds):
                for name, once in sides if i % 2 == 0 else sides[::-1]:
                    figures[name].append(once(True))
                    figures[f"{name} stop"].append(once(False))
        except anchor.Unavailable as exc:
            b.notes.append(f"anchor: the original could not be run: {exc}")
            return
        finally:
            parent.close()
    b.data["anchor"].update(figures)
    _anchor_rows(b, n, figures)


def _anchor_rows(b: Bench, n: int, figures: dict[str, list[dict[str, float]]]) -> None:
    def med(name: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[name])

    def versus(key: str, show: Callable[[float], str], side: str = "") -> tuple[str, str]:
        pisub_, original = med(f"pisub{side}", key), med(f"original{side}", key)
        return f"{show(pisub_)}", f"original {show(original)}; x{pisub_ / original:.2f}"

    secs = "{:.2f} s".format
    for key, label, side in (
        ("to_first_request_s", "launch → all first model requests", ""),
        ("to_finished_s", "launch → finished (2 s streams)", ""),
        ("to_gone_s", "launch → no process left", ""),
        ("stop_s", "stop (streaming) → no process left", " stop"),
    ):
        value, base = versus(key, secs, side)
        b.row("anchor", f"{n} pi children: {label}, p50", value, base)
    value, base = versus("cpu_s", "{:.2f} s".format)
    b.row(
        "anchor",
        f"{n} pi children: CPU s, the whole fan-out",
        value,
        base + " (original: with its parent's share)",
    )
    value, base = versus("peak_rss", lambda v: f"{v / 2**20:.0f} MiB")
    b.row(
        "anchor",
        f"{n} pi children: peak RSS of the fan-out's processes",
        value,
        base + f" (+ its parent pi {med('original', 'parent_rss') / 2**20:.0f} MiB)",
    )


# -- Slurm (opt-in: --only slurm, needs scripts/slurm-up.sh) ---------------------------------------


def bench_slurm(b: Bench) -> None:
    """Submit → running and a control round trip, local beside Slurm, in the same process."""
    import pisub

    n = 3 if b.quick else 10
    b.agent("bench-sleeper", "sleep", ["3600"])
    (b.home / "config.toml").write_text("[placement]\nheartbeat_ttl = 10\n")
    figures: dict[str, dict[str, list[float]]] = {}
    for backend in ("local", "slurm"):
        to_running, round_trip = [], []
        for _ in range(n):
            start = time.perf_counter()
            run = pisub.launch("bench-sleeper", "x", backend=backend)
            until(functools.partial(_running, run), 120, f"run {run.id} to run", 0.005)
            to_running.append(time.perf_counter() - start)
            sent = time.perf_counter()
            rid = run.send_steer("bench")  # an external CLI cannot be steered: answered "rejected"
            receipt = run.wait_for_receipt(rid, 30)
            assert receipt is not None and receipt.state != "pending", receipt
            round_trip.append(time.perf_counter() - sent)
            run.stop(wait=10)
            run.wait(timeout=60)
        figures[backend] = {"to_running_s": to_running, "round_trip_s": round_trip}
    b.data["slurm"] = figures
    for key, what in (("to_running_s", "launch → running"), ("round_trip_s", "request → receipt")):
        local, slurm = pct(figures["local"][key], 50), pct(figures["slurm"][key], 50)
        b.row("slurm", f"{what} p50 (n={n})", ms(slurm), f"local {ms(local)}; x{slurm / local:.1f}")


# -- queue -------------------------------------------------------------------------------------

TICK = """
import fcntl, json, os, sys, time
name = sys.stdin.read().strip()
def note(kind):
    with open(os.environ["PISUB_BENCH_QUEUE_LOG"], "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(json.dumps([kind, name, time.monotonic()]) + "\\n")
import signal
signal.signal(signal.SIGTERM, lambda *_: (note("end"), sys.exit(143)))
note("start")
time.sleep(float(os.environ.get("PISUB_BENCH_TICK_S", "0.3")))
note("end")
"""
"""A trivial external-CLI child: appends ``start``/``end`` (CLOCK_MONOTONIC, the same clock in
every process) under ``flock`` to one log, so the order children ran in is the log's order (a
child ended by a repair — its runner was killed — says ``end`` on its SIGTERM)."""


def bench_queue(b: Bench) -> None:
    """N runs (200; 24 with --quick) launched into a paused group of 4, then resumed, with some
    runners killed (kill -9)
    while they hold a slot: the most children ever running at once (read from one log written
    under flock, in the order it happened — never sampled), each freed slot → the next child
    running (p50 / p90), the total wall time, and that every run ended and every slot was filled."""
    import pisub

    n, limit, kills = (24, 4, 2) if b.quick else (200, 4, 6)
    log = b.home.parent / "queue-log.jsonl"
    log.touch()
    os.environ["PISUB_BENCH_QUEUE_LOG"] = str(log)
    b.agent("tick", sys.executable, ["-c", TICK])
    pisub.group_add("bench", limit=limit)
    pisub.group_pause("bench")  # every run queued first: the queue, not the launches, is measured
    start = time.monotonic()
    runs = [pisub.launch("tick", f"r{i}", group="bench") for i in range(n)]
    launched = time.monotonic() - start
    start = time.monotonic()
    pisub.group_resume("bench")
    killed = _kill_holders(runs, kills, n)
    until(lambda: all(_ended_any(r) for r in runs), 600, "every queued run to end", interval=0.2)
    wall = time.monotonic() - start
    events = [json.loads(line) for line in log.read_text().splitlines()]
    most, turnover = _replay(events, limit)
    refill, admitted = _slot_to_child(runs)
    states = [str(r.status().state) for r in runs]
    b.data["queue"] = {
        "runs": n,
        "limit": limit,
        "killed": len(killed),
        "max_running": most,
        "refill_s": refill,
        "turnover_s": turnover,
        "admitted_s": admitted,
        "wall_s": wall,
        "launch_s": launched,
        "states": {s: states.count(s) for s in set(states)},
    }
    b.row("queue", f"{n} runs through a group of {limit}: most running at once", f"{most}", f"limit {limit}")
    b.row(
        "queue",
        "freed slot → next run running p50 / p90",
        f"{ms(statistics.median(refill))} / {ms(pct(refill, 90))}",
        f"{len(refill)} refills (slot freed: the ending run's run.left)",
    )
    b.row(
        "queue",
        "… of which freed slot → next run admitted p50 / p90",
        f"{ms(statistics.median(admitted))} / {ms(pct(admitted, 90))}",
        "run.left is written after the decision: ≤ 0 is possible; the rest is the startup",
    )
    b.row(
        "queue",
        "a child's end → the next child's start p50 / p90",
        f"{ms(statistics.median(turnover))} / {ms(pct(turnover, 90))}",
        "includes the ending runner's result and status",
    )
    tick = float(os.environ.get("PISUB_BENCH_TICK_S", "0.3"))
    b.row(
        "queue",
        "total wall from resume to the last run's end",
        f"{wall:.1f} s",
        f"ideal {n * tick / limit:.1f} s ({tick:g} s children); launches {launched:.1f} s",
    )
    complete = states.count("complete")
    b.row(
        "queue",
        f"runners killed -9 while holding a slot: {len(killed)}",
        f"{complete} complete, {states.count('failed')} failed",
        f"every run ended: {len(states) == n and all(s in ('complete', 'failed') for s in states)}",
    )


def _started(run: Any) -> bool:
    return str(run.status().state) in ("running", "complete", "failed")


def _ended_any(run: Any) -> bool:
    return bool(run.status().state.is_terminal)


def _kill_holders(runs: list[Any], kills: int, n: int) -> list[str]:
    """kill -9 the runners of ``kills`` runs while they hold a slot (their children running),
    spread over the queue; the killed runs."""
    killed: list[str] = []
    for target in runs[n // (kills + 1) :: max(1, n // (kills + 1))][:kills]:
        until(functools.partial(_started, target), 300, "a run to start")
        st = target.status()
        if str(st.state) != "running" or st.pid is None:
            continue
        with suppress(ProcessLookupError):
            os.kill(st.pid, signal.SIGKILL)
            killed.append(target.id)
    return killed


def _slot_to_child(runs: list[Any]) -> tuple[list[float], list[float]]:
    """For each run given a slot by a run that ended (its ``run.left`` event names whom it
    admitted), the time from that event to the admitted run's ``run.admitted`` (it saw its
    admission) and to its ``run.started`` (its startup commit: ``running``). From the runs'
    events (wall-clock milliseconds: a measurement, never a decision)."""
    import datetime as dt

    def at(event: dict[str, Any]) -> float:
        return dt.datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()

    left: dict[str, float] = {}
    seen: dict[str, dict[str, float]] = {}
    for run in runs:
        events = [json.loads(line) for line in (run.dir / "events.jsonl").read_text().splitlines() if line]
        seen[run.id] = {e["type"]: at(e) for e in events}
        for event in events:
            if event["type"] == "run.left":
                for admitted in event["data"].get("admitted", []):
                    left[admitted] = at(event)
    to_running = [seen[r]["run.started"] - t for r, t in left.items() if "run.started" in seen.get(r, {})]
    to_admitted = [seen[r]["run.admitted"] - t for r, t in left.items() if "run.admitted" in seen.get(r, {})]
    return to_running, to_admitted


def _replay(events: list[list[Any]], limit: int) -> tuple[int, list[float]]:
    """The most children running at once, and for each start made while the group was full
    before a child ended, the time from that end (its slot freed) to the start."""
    running, most = 0, 0
    freed: list[float] = []
    refill: list[float] = []
    for kind, _name, at in events:
        if kind == "end":
            if running == limit:
                freed.append(at)
            running -= 1
        else:
            running += 1
            most = max(most, running)
            if freed:
                refill.append(at - freed.pop(0))
    return most, refill


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute (CI)")
    parser.add_argument("--out", type=Path, default=Path("bench-results.json"))
    parser.add_argument(
        "--only",
        nargs="*",
        help="sections: launch control workflow languages footprint scale commands top fanout pi "
        "pi-versions queue, and slurm and anchor (only when named)",
    )
    parser.add_argument(
        "--baseline-checkout",
        type=Path,
        metavar="DIR",
        help="another checkout of pisub with its own DIR/.venv: every CLI-driven figure is also "
        "measured with DIR/.venv/bin/pisub, alternating round by round (before / after)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pisub-bench-"))
    os.environ[TAG] = uuid.uuid4().hex
    home = tmp / "home"
    home.mkdir(mode=0o700)
    os.environ["PISUB_HOME"] = str(home)
    baseline = args.baseline_checkout.resolve() if args.baseline_checkout else None
    if baseline is not None and not os.access(baseline / ".venv" / "bin" / "pisub", os.X_OK):
        print(f"bench: no {baseline}/.venv/bin/pisub (make the checkout's venv first)", file=sys.stderr)
        return 2
    b = Bench(args.quick, home, baseline)
    print(f"pisub benchmark ({'quick' if args.quick else 'full'}) on {machine()}")
    if baseline is not None:
        print(f"before: {baseline} ({_describe(baseline)}); this: {ROOT} ({_describe(ROOT)})")
    sections = {
        "launch": bench_launch,
        "control": bench_control,
        "workflow": bench_workflow,
        "languages": bench_script_languages,
        "footprint": bench_footprint,
        "scale": bench_scale,
        "commands": bench_commands,
        "top": bench_top,
        "fanout": bench_fanout,
        "pi": bench_pi,
        "pi-versions": bench_pi_versions,
        "queue": bench_queue,
        "slurm": bench_slurm,
        "anchor": bench_anchor,
    }
    only_when_named = ("slurm", "anchor")
    started = time.monotonic()
    try:
        for name, fn in sections.items():
            if (args.only and name not in args.only) or (name in only_when_named and not args.only):
                continue
            began = time.monotonic()
            fn(b)
            b.data.setdefault("section_s", {})[name] = time.monotonic() - began
    except BenchFailure as exc:
        print(f"bench: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all(b)
        cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    for note in b.notes:
        print(f"note: {note}")
    b.data["machine"] = machine()
    b.data["quick"] = args.quick
    b.data["seconds"] = time.monotonic() - started
    args.out.write_text(json.dumps(b.data, indent=1) + "\n")
    print("\n| section | measurement | pisub | baseline / ratio |\n|---|---|---|---|")
    for row in b.rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n{len(b.rows)} figures in {b.data['seconds']:.0f} s; written to {args.out}")
    return 0


def _describe(checkout: Path) -> str:
    proc = subprocess.run(
        ["git", "-C", str(checkout), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return proc.stdout.strip() or "?"


def cleanup() -> None:
    """End every process left that this benchmark started (each carries its tag)."""
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid() and ours(int(name)):
            with suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
