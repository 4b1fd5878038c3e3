"""Shared fixtures: a private PISUB_HOME per test, agent files, waiting on conditions."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from pisub.testing.fake_model import FakeModelServer, pi_env, write_pi_agent_dir
from tests.agentfile import agent_text
from tests.nonroot import NonrootSetupError, Unprivileged, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]


def pinned_pi_bins() -> dict[str, Path]:
    """The launchers of the installed pinned pi versions, the default first."""
    from pisub.testing.pi_pins import pinned_pi_bins as pinned

    return pinned(ROOT)


PI_BIN_DEFAULT = next(iter(pinned_pi_bins().values()), ROOT / ".pi-cli" / "bin" / "pi")


# Hypothesis: "ci" (the default: 100 examples, drawn afresh on every run, so successive CI runs
# explore different ones; CI starts from a fresh clone, so no example database is kept) and
# "stress" (--stress: 1,000). The property tests take their count from the profile.
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,  # a loaded 2-core machine: a slow example is not a failure
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("stress", parent=settings.get_profile("ci"), max_examples=1000)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress", action="store_true", default=False, help="run the long stress modes")
    parser.addoption(
        "--nfs", action="store_true", default=False, help="run the real-NFS test (a QEMU guest, ~6 min)"
    )


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("stress" if config.getoption("--stress") else "ci")
    # A suite started in the background of a non-interactive shell (`cmd &`) inherits SIGINT
    # ignored, and so would every child: the tests of what Ctrl-C does need it as a terminal
    # gives it (each xdist worker runs this too).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid
        for item in items
        if "unprivileged" in getattr(item, "fixturenames", ()) and "root" not in item.keywords
    ]
    if unmarked:  # scripts/test.sh selects the root pass by the marker
        raise pytest.UsageError(f"tests using the unprivileged fixture must be marked root: {unmarked}")
    skip_slow = pytest.mark.skip(reason="long mode: run with --stress")
    skip_nfs = pytest.mark.skip(reason="real NFS in a QEMU guest: run with --nfs")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--stress"):
            item.add_marker(skip_slow)
        if "nfs" in item.keywords and not config.getoption("--nfs"):
            item.add_marker(skip_nfs)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after -m and -k deselect
def pytest_collection_modifyitems_slowest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (scripts/test.sh's main pass), the slowest tests start first on every worker:
    :func:`slowest_first`. PISUB_TEST_ORDER=collected keeps the collection order."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 0 and os.environ.get("PISUB_TEST_ORDER", "slowest-first") != "collected":
        items[:] = slowest_first(items, workers, _xdist_mode(config) == "worksteal")


def _xdist_mode(config: pytest.Config) -> str:
    """The controller's ``--dist`` (a worker's own option says "no"): from its command line."""
    argv = list(getattr(config, "workerinput", {}).get("mainargv", []))
    argv += os.environ.get("PYTEST_ADDOPTS", "").split()
    mode = "load"  # xdist's default with -n
    for i, arg in enumerate(argv):
        if arg == "--dist" and i + 1 < len(argv):
            mode = argv[i + 1]
        elif arg.startswith("--dist="):
            mode = arg.removeprefix("--dist=")
    return mode


DURATIONS = ROOT / "tests" / "durations.txt"
"""The last recorded duration of every test (scripts/test.sh with PISUB_DURATIONS)."""


def recorded_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds by node id (the longest of a test's passes); empty when there is no record."""
    found: dict[str, float] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) != 4 or line.startswith("#"):
            continue
        try:
            seconds = float(fields[0])
        except ValueError:
            continue
        found[fields[3]] = max(seconds, found.get(fields[3], 0.0))
    return found


def slowest_first(items: list[pytest.Item], workers: int, worksteal: bool) -> list[pytest.Item]:
    """The order under xdist that starts the slowest tests first on every worker, so that a long
    test (cron's minute, a 64-child fan-out) never starts late and sets the pass's tail.

    Each test's time is its recorded one (``tests/durations.txt``); a test not yet recorded
    counts as the mean of its module's recorded tests (else 1 s). Every worker collects the same
    items and computes the same order. ``--dist worksteal`` hands worker ``i`` the ``i``-th
    contiguous chunk of the collection (sized as xdist sizes it) and an idle worker steals the
    tail of another's queue: each chunk gets, slowest first, its share of the tests (each test
    to the chunk with the least time so far that has room), so every worker starts with a slow
    one and steals only short ones. ``--dist load`` hands tests out in turn: slowest first."""
    known = recorded_durations()
    by_module: dict[str, list[float]] = {}
    for nodeid, seconds in known.items():
        by_module.setdefault(nodeid.split("::", 1)[0], []).append(seconds)

    def estimate(item: pytest.Item) -> float:
        if item.nodeid in known:
            return known[item.nodeid]
        module = by_module.get(item.nodeid.split("::", 1)[0])
        return sum(module) / len(module) if module else 1.0

    ranked = sorted(items, key=lambda item: -estimate(item))  # stable: ties keep collection order
    if not worksteal or workers < 2:
        return ranked
    sizes, left = [], len(items)
    for i in range(workers):  # xdist's WorkStealingScheduling.check_schedule
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    chunks: list[list[pytest.Item]] = [[] for _ in sizes]
    loads = [0.0] * workers
    for item in ranked:
        i = min((i for i in range(workers) if len(chunks[i]) < sizes[i]), key=lambda i: loads[i])
        chunks[i].append(item)
        loads[i] += estimate(item)
    return [item for chunk in chunks for item in chunk]


def wait_for(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or predicate} (last: {value!r})"
            )
        time.sleep(interval)


def processes_of(root: Path) -> list[int]:
    """Pids of live processes whose command line or environment mentions ``root``."""
    needle = str(root).encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if (needle in cmd or needle in env) and pid_alive(int(name)):
            found.append(int(name))
    return found


def wait_no_processes(root: Path, timeout: float = 10.0) -> None:
    """Wait until no process of ``root`` is left; on timeout, name the survivors."""
    deadline = time.monotonic() + timeout
    while left := processes_of(root):
        if time.monotonic() < deadline:
            time.sleep(0.05)
            continue
        cmdlines = []
        for pid in left:
            try:
                cmdlines.append(
                    f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                )
            except OSError:
                continue
        raise AssertionError(f"processes left after {timeout}s: {cmdlines}")


def end_processes(pids: list[int], uids: set[int]) -> None:
    """SIGKILL ``pids`` (found by :func:`processes_of`: they name this test's private folder)
    — only those that run as one of ``uids``: a test ends only processes it started."""
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}").st_uid not in uids:
                continue
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            continue


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh pisub home, exported as PISUB_HOME; its processes are ended afterwards."""
    root = tmp_path / "home"
    monkeypatch.setenv("PISUB_HOME", str(root))
    # pi's own agent folder (~/.pi/agent/agents) is a user scope: never the developer's in a test.
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "pi-agent"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))  # never the developer's config.toml
    # Warm runners, but no spare left in this process between tests (a spare carries the
    # home in its environment until this process exits): tests/integration/test_warm_launch.py.
    monkeypatch.setenv("PISUB_WARM", os.environ.get("PISUB_WARM", "1"))
    monkeypatch.chdir(tmp_path)
    yield root
    left = processes_of(root)
    end_processes(left, {os.getuid()})
    # A zombie counts as ended: orphans are reaped by PID 1, which here takes up to ~2 s.
    wait_for(lambda: not any(map(pid_alive, left)), timeout=5, what=f"processes {left} to end")


AgentMaker = Callable[..., Path]


@pytest.fixture
def make_agent(home: Path) -> AgentMaker:
    """Write a user-scope agent file; ``python`` is a script run by this interpreter."""

    def make(
        name: str,
        *,
        python: str | None = None,
        command: str | None = None,
        args: list[str] | None = None,
        body: str = "",
        **extra: object,
    ) -> Path:
        text = agent_text(
            name, interpreter=sys.executable, python=python, command=command, args=args, body=body, **extra
        )
        path = home / "agents" / f"{name}.md"
        home.mkdir(mode=0o700, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.write_text(text)
        return path

    return make


def pisub_cli(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (``python -m pisub``) in a subprocess."""
    proc = subprocess.run(
        [sys.executable, "-m", "pisub", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or dict(os.environ),
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"pisub {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="session")
def pi_bin() -> str:
    """The real pi CLI (installed by scripts/install_pi.sh); required under CI."""
    path = os.environ.get("PISUB_PI_BIN") or str(PI_BIN_DEFAULT)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        message = f"pi is not installed at {path}: run scripts/install_pi.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def model_server() -> Iterator[FakeModelServer]:
    """One scripted OpenAI-compatible model server on 127.0.0.1 for the whole session."""
    with FakeModelServer(slow_delay=0.1) as server:
        yield server


@functools.cache
def pi_version(pi_bin: str) -> str:
    """The version of the pi at ``pi_bin``, asked once per test process (a parent pi's argv
    depends on it): ``pi --version`` is a Node start-up, ~0.3 CPU-seconds each time."""
    from pisub.children.pi.versions import detect_version

    return detect_version(pi_bin)


@pytest.fixture(scope="session")
def pi_versions_cache(pi_bin: str, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """pisub's own ``cache/pi-versions.json`` for ``pi_bin``, written by pisub's detection once
    per test process; :func:`pi_home` starts every home with it, so a test's first pi launch
    does not ask ``pi --version`` again (tests/integration/test_pi_versions.py tests asking)."""
    from pisub.children.pi.versions import detect_version

    cache = tmp_path_factory.mktemp("pi-versions")
    detect_version(pi_bin, cache)
    return (cache / "pi-versions.json").read_bytes()


@pytest.fixture
def pi_home(
    home: Path,
    pi_bin: str,
    model_server: FakeModelServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    pi_versions_cache: bytes,
) -> Path:
    """A home with a ``pi`` agent whose pi talks to the fake model server (and whose cache
    already knows that pi's version)."""
    agent_dir = tmp_path / "pi-agent"
    write_pi_agent_dir(agent_dir, model_server.base_url)
    for key, value in pi_env(agent_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PISUB_PI_BIN", pi_bin)
    agents = home / "agents"
    agents.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.chmod(home, 0o700)
    (home / "cache").mkdir(mode=0o700, exist_ok=True)
    fd = os.open(home / "cache" / "pi-versions.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pi_versions_cache)
    # The scripted model echoes the task: this agent asks for no acceptance report, so that the
    # transport's tests see the task as sent (inference is tested with agents of its own).
    no_report = 'acceptance: {level: none, reason: "the scripted model echoes the task"}\n'
    (agents / "pi.md").write_text(
        f"---\nname: pi\nrunner: pi\ndescription: the real pi\n{no_report}---\nBe terse.\n"
    )
    return home


@pytest.fixture
def unprivileged() -> Iterator[Unprivileged]:
    """pisub as the ordinary user ``$PISUB_NONROOT_USER`` (``pisub-ci``), for a test running as root.

    Gives a PISUB_HOME of that user in a world-traversable folder and ``.pisub(*args)``, which runs
    ``$PISUB_NONROOT_PYTHON -m pisub`` as that user with a clean environment. Skips when not root
    or when scripts/test.sh did not set PISUB_NONROOT_PYTHON; fails when that setup is broken.
    """
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    try:
        user = Unprivileged.create()
    except NonrootSetupError as exc:
        pytest.fail(f"the unprivileged setup is broken: {exc}")
    try:
        yield user
    finally:
        left = processes_of(user.base)
        end_processes(left, {os.getuid(), user.uid})
        try:
            # A zombie counts as ended: orphans are reaped by PID 1, which may take seconds.
            wait_for(lambda: not any(map(pid_alive, left)), timeout=10, what=f"processes {left} to end")
        finally:
            user.remove()
