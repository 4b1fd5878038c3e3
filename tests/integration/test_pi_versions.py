"""The pi its users have: the supported range, refusal of anything else, and the behaviours
that differ between versions (issue 11).

The pi tests run against the default pin; ``scripts/test.sh`` runs every ``pi``-marked test again
against each other pinned version (``PISUB_PI_VERSIONS``), so each test here runs on every
supported version.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

import pisub
from pisub.children.pi import versions as pi_versions
from pisub.children.pi.versions import SUPPORTED, caps_for, detect_version
from pisub.errors import UnsupportedPi
from pisub.protocol.cache import PiVersions
from pisub.protocol.codec import decode
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pinned_pi_bins, pisub_cli, processes_of, wait_for

pytestmark = pytest.mark.pi_versions  # all of it is about what differs between versions


def _fake_pi(tmp_path: Path, version_output: str, code: int = 0) -> Path:
    """A `pi` that only answers --version (as a wrong or broken install would)."""
    path = tmp_path / "fake-pi" / "pi"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' {json.dumps(version_output)} >&2\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _pi_agent(home: Path) -> None:
    agents = home / "agents"
    agents.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.chmod(home, 0o700)
    (agents / "pi.md").write_text("---\nname: pi\nrunner: pi\n---\nBe terse.\n")


@pytest.mark.parametrize(
    ("printed", "code", "says"),
    [
        ("0.73.1", 0, "pi 0.73.1 is not supported"),
        ("2.0.0", 0, "pi 2.0.0 is not supported"),
        ("no version here", 0, "does not run"),
        (
            "SyntaxError: The requested module 'node:module' does not provide an export named "
            "'enableCompileCache'",
            1,
            "needs Node >= 22.19",
        ),
    ],
)
def test_an_unsupported_pi_is_refused_at_launch_in_one_line(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, printed: str, code: int, says: str
) -> None:
    _pi_agent(home)
    monkeypatch.setenv("PISUB_PI_BIN", str(_fake_pi(tmp_path, printed, code)))
    proc = pisub_cli("run", "--agent", "pi", "hello")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith("[UNSUPPORTED_PI]"), proc.stderr
    assert says in lines[0]
    if "not supported" in says:
        assert SUPPORTED in lines[0], "the refusal names the supported range"
    assert not list((home / "runs").iterdir()), "no run was created"
    doctor = pisub_cli("doctor")
    assert doctor.returncode == 1 and any(
        line.startswith("BAD  pi") and says in line for line in doctor.stdout.splitlines()
    ), doctor.stdout


def test_the_version_is_detected_once_per_binary_and_again_when_it_changes(tmp_path: Path) -> None:
    pi = _fake_pi(tmp_path, "1.6.0")
    cache = tmp_path / "cache"
    assert detect_version(str(pi), cache) == "1.6.0"
    st = pi.stat()
    text = pi.read_text().replace("1.6.0", "2.0.0")  # same size
    pi.write_text(text)
    os.utime(pi, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime: the ctime still moved
    assert detect_version(str(pi), cache) == "2.0.0", "a replaced binary is asked again"
    assert caps_for("1.6.0").system_messages and not caps_for("0.85.1").system_messages


def test_the_version_cache_is_a_versioned_file(tmp_path: Path) -> None:
    pi = _fake_pi(tmp_path, "1.6.0")
    cache = tmp_path / "cache"
    detect_version(str(pi), cache)
    data = json.loads((cache / "pi-versions.json").read_bytes())
    assert data == {"v": 1, "versions": {pi_versions._cache_key(str(pi)): "1.6.0"}}
    decode((cache / "pi-versions.json").read_bytes(), PiVersions, "pi-versions.json")


def test_an_old_version_cache_without_v_still_loads(tmp_path: Path) -> None:
    """pisub before ``v`` wrote a bare ``{key: version}``: its entries are still used (no pi is
    run), and the next write keeps them in the versioned file."""
    (tmp_path / "b").mkdir()
    pi, other = _fake_pi(tmp_path, "1.6.0"), _fake_pi(tmp_path / "b", "1.5.0")
    cache = tmp_path / "cache"
    cache.mkdir()
    key = pi_versions._cache_key(str(pi))
    assert key is not None
    (cache / "pi-versions.json").write_text(json.dumps({key: "1.4.2", "junk": 7}))
    assert detect_version(str(pi), cache) == "1.4.2", "the old file was not read"
    assert detect_version(str(other), cache) == "1.5.0"
    data = json.loads((cache / "pi-versions.json").read_bytes())
    assert data["v"] == 1 and data["versions"][key] == "1.4.2" and "junk" not in data["versions"]


@pytest.mark.parametrize(
    "text",
    [
        '{"v": 2, "versions": {"KEY": "1.4.2"}}',
        '{"v": 1, "versions": {"KEY": "1.4.2\\u001b]0;x"}}',
        '{"v": 1, "versions": ["1.4.2"]}',
        '{"KEY": 1.42}',
        "not json",
        "[1, 2]",
    ],
)
def test_a_version_cache_that_does_not_decode_is_a_miss(tmp_path: Path, text: str) -> None:
    pi = _fake_pi(tmp_path, "1.6.0")
    cache = tmp_path / "cache"
    cache.mkdir()
    key = pi_versions._cache_key(str(pi))
    assert key is not None
    (cache / "pi-versions.json").write_text(text.replace("KEY", json.dumps(key)[1:-1]))
    assert detect_version(str(pi), cache) == "1.6.0"  # asked again
    data = json.loads((cache / "pi-versions.json").read_bytes())
    assert data == {"v": 1, "versions": {key: "1.6.0"}}


@pytest.mark.parametrize(
    "printed",
    [
        "v1.6.0",
        "pi 1.6.0",
        "1.6.0-beta.1",
        "1.6.0+build",
        "\uff11.6.0",
        "1.6.0\x1b]0;pwned\x07",
        "1.6.0 2.0.0",
        "0.73.1\n1.6.0",
        "1.6",
    ],
)
def test_only_one_exact_version_line_is_a_version(tmp_path: Path, printed: str) -> None:
    with pytest.raises(UnsupportedPi, match="does not run as a pi"):
        detect_version(str(_fake_pi(tmp_path, printed)))


def test_a_package_json_beside_a_binary_vouches_for_nothing(tmp_path: Path) -> None:
    package = tmp_path / "spoof"
    (package / "bin").mkdir(parents=True)
    (package / "package.json").write_text('{"name":"@earendil-works/pi-coding-agent","version":"1.6.0"}')
    pi = _fake_pi(package / "bin", "0.73.1")
    with pytest.raises(UnsupportedPi, match=r"pi 0\.73\.1 is not supported"):
        caps_for(detect_version(str(pi)))


def test_a_hanging_pi_is_refused_and_nothing_it_started_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pi_versions, "VERSION_TIMEOUT_S", 1.0)
    marker = f"pisub-hang-{os.getpid()}"
    pi = tmp_path / "hang"
    pi.write_text(f"#!/bin/sh\nsleep 300 {marker} 2>/dev/null &\nsleep 300\n")
    pi.chmod(0o755)
    with pytest.raises(UnsupportedPi, match="did not answer within 1s"):
        detect_version(str(pi))
    wait_for(lambda: not [p for p in processes_of(tmp_path)], what="the probe's processes to be gone")


def test_pi_1_under_node_20_is_refused(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``npm install -g`` gives on a machine with Node 20: a pi that dies at import."""
    bin_ = Path(__file__).resolve().parents[2] / ".pi-cli" / "1.6.0" / "node_modules" / ".bin" / "pi"
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    if not bin_.exists() or not node.startswith("v20."):
        pytest.skip(f"needs pi 1.6.0 installed and a system Node 20 (found {node or 'none'})")
    _pi_agent(home)
    monkeypatch.setenv("PISUB_PI_BIN", str(bin_))
    proc = pisub_cli("run", "--agent", "pi", "hello")
    assert proc.returncode == 1 and proc.stderr.strip().endswith("[UNSUPPORTED_PI]"), proc.stderr
    assert "needs Node >= 22.19" in proc.stderr and not list((home / "runs").iterdir())


@pytest.mark.pi
def test_the_runs_pi_version_is_in_its_manifest(pi_home: Path, pi_bin: str) -> None:
    run = pisub.launch("pi", "hello")
    run.wait(timeout=60)
    version = run.manifest().agent.pi_version
    assert version is not None and caps_for(version)
    assert version == detect_version(pi_bin)


@pytest.mark.pi
def test_a_compaction_right_after_the_turn_does_not_stall_the_run(
    pi_home: Path, tmp_path: Path, model_server: FakeModelServer
) -> None:
    """pi compacts its context after ``agent_end`` when the context nears the window: the idle
    check must be asked again once the compaction ends (it stalled on every version)."""
    settings_path = Path(os.environ["PI_CODING_AGENT_DIR"]) / "settings.json"
    settings = json.loads(settings_path.read_text())
    settings["compaction"] = {"enabled": True, "reserveTokens": 127990, "keepRecentTokens": 10}
    settings_path.write_text(json.dumps(settings))
    run = pisub.launch("pi", "hello", timeout=60)
    result = run.wait(timeout=45)
    assert result.state == "complete", result.content[0].text
    types = [json.loads(line)["type"] for line in (run.dir / "events.jsonl").read_text().splitlines()]
    assert "pi.compaction_end" in types, "the compaction happened"


@pytest.mark.pi
def test_the_system_prompt_bulk_stays_out_of_the_event_log(pi_home: Path) -> None:
    run = pisub.launch("pi", "hello")
    assert run.wait(timeout=60).state == "complete"
    events = [json.loads(line) for line in (run.dir / "events.jsonl").read_text().splitlines()]
    for event in events:
        message = event.get("data", {}).get("message")
        assert not (isinstance(message, dict) and message.get("role") == "system"), event["type"]
        assert "messages" not in event.get("data", {}) or event["type"] != "pi.agent_end"
    assert max(len(json.dumps(e)) for e in events) < 8000


@pytest.mark.pi
@pytest.mark.parametrize(("trusted", "users_default"), [(False, None), (False, "always"), (True, None)])
def test_project_resources_load_only_for_a_trusting_agent(
    pi_home: Path, tmp_path: Path, model_server: FakeModelServer, trusted: bool, users_default: str | None
) -> None:
    """Not trusting the project wins over the user's own pi settings (``defaultProjectTrust``)."""
    if users_default is not None:
        settings_path = Path(os.environ["PI_CODING_AGENT_DIR"]) / "settings.json"
        settings = json.loads(settings_path.read_text())
        settings["defaultProjectTrust"] = users_default
        settings_path.write_text(json.dumps(settings))
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    marker = f"PROJECT-MARKER-{os.getpid()}-{trusted}"
    (project / ".pi" / "APPEND_SYSTEM.md").write_text(f"{marker}\n")
    agent = pi_home / "agents" / "trusting.md"
    agent.write_text(f"---\nname: trusting\nrunner: pi\ntrustProject: {json.dumps(trusted)}\n---\n")
    seen = len(model_server.requests)
    run = pisub.launch("trusting", "hello", cwd=project)
    assert run.wait(timeout=60).state == "complete"
    bodies = json.dumps(model_server.requests[seen:])
    assert (marker in bodies) is trusted


@pytest.mark.pi
def test_a_session_continues_across_the_supported_versions(
    pi_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session written by one supported pi is resumed by the other, and back."""
    bins = pinned_pi_bins()
    if len(bins) < 2:
        pytest.skip(
            f"needs two pinned pi versions installed (scripts/install_pi.sh all); found {sorted(bins)}"
        )
    first, second = sorted(bins)[:2]
    monkeypatch.setenv("PISUB_PI_BIN", str(bins[first]))
    run = pisub.launch("pi", "ECHO_HISTORY one")
    assert run.wait(timeout=60).state == "complete"
    for version, word in ((second, "two"), (first, "three")):
        monkeypatch.setenv("PISUB_PI_BIN", str(bins[version]))
        run = pisub.resume(run.id, f"ECHO_HISTORY {word}")
        result = run.wait(timeout=60)
        assert result.state == "complete", result.content[0].text
        assert run.manifest().agent.pi_version == version
    output = result.details.results[0].output or ""
    assert all(word in output for word in ("one", "two", "three")), output
