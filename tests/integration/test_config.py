"""config.toml (`$XDG_CONFIG_HOME/pisub/config.toml`, and the old `<home>/config.toml`): defaults below
the call and the agent file, above the built-ins."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import pisub
from pisub.api.client import launch_parallel
from pisub.errors import InvalidInput
from tests.conftest import AgentMaker, pisub_cli


@pytest.fixture
def quick(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", command="true")
    make_agent("timed", command="true", timeout=7)


def _shown() -> dict[str, tuple[Any, str]]:
    rows = json.loads(pisub_cli("config", "show", "--json", check=True).stdout)
    return {r["name"]: (r["value"], r["source"]) for r in rows}


def test_without_a_file_every_setting_is_the_default(home: Path, quick: None) -> None:
    shown = _shown()
    assert shown["limits.timeout"] == (1800, "default")
    assert shown["workflow.concurrency"] == (4, "default")
    assert all(source == "default" for _value, source in shown.values())
    assert "limits.timeout" in pisub_cli("config", "show", check=True).stdout


def test_the_file_sits_between_the_agent_and_the_defaults(
    home: Path, quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "config.toml").write_text(
        "[limits]\ntimeout = 5\nidle_timeout = 2.5\n\n[workflow]\nconcurrency = 2\nmax_spawns = 9\n"
    )
    monkeypatch.setenv("PISUB_MAX_DEPTH", "1")
    shown = _shown()
    assert shown["limits.timeout"] == (5, "config.toml")
    assert shown["limits.idle_timeout"] == (2.5, "config.toml")
    assert shown["limits.output_cap"][1] == "default"
    assert shown["workflow.max_spawns"] == (9, "config.toml")
    assert shown["depth.max_depth"] == (1, "env PISUB_MAX_DEPTH")
    assert pisub.launch("quick", "x").manifest().limits.timeout == 5  # the file
    assert pisub.launch("timed", "x").manifest().limits.timeout == 7  # the agent beats it
    assert pisub.launch("timed", "x", timeout=3).manifest().limits.timeout == 3  # the call beats both
    run = launch_parallel([{"agent": "quick", "task": "x"}])
    spec = run.manifest().workflow
    assert spec is not None and spec.concurrency == 2 and spec.max_spawns == 9
    again = launch_parallel([{"agent": "quick", "task": "x"}], concurrency=3).manifest().workflow
    assert again is not None and again.concurrency == 3


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[limits]\ncolour = 1\n", "colour"),
        ("[limits]\nidle_timeout = 'soon'\n", "limits.idle_timeout"),
        ("[limits]\ntimeout = -1\n", "limits.timeout"),
        ("[workflow]\nconcurrency = 99\n", "workflow.concurrency"),
        ("[nonsense]\n", "nonsense"),
        ("[limits\n", "not valid TOML"),
        (b"\xff\xfe", "not valid TOML"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_field(
    home: Path, quick: None, text: str | bytes, needle: str
) -> None:
    path = home / "config.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InvalidInput, match=r"config\.toml") as caught:
        pisub.launch("quick", "x")
    assert needle in caught.value.message
    for args in (["config", "show"], ["run", "--agent", "quick", "x"]):
        done = pisub_cli(*args)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and needle in done.stderr
    assert not list(pisub.list_runs())


@pytest.mark.parametrize(
    ("place", "kind"),
    [(p, k) for p in ("old", "xdg") for k in ("fifo", "directory", "huge")]
    + [("old", "symlink"), ("xdg", "parent is a file")],
)
def test_a_hostile_file_is_refused_never_followed_or_waited_on(
    home: Path, quick: None, tmp_path: Path, kind: str, place: str
) -> None:
    """In either place (``<home>/config.toml``, ``$XDG_CONFIG_HOME/pisub/config.toml``): one line
    naming the file, and nothing starts."""
    path = home / "config.toml" if place == "old" else _xdg_config(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        elsewhere = tmp_path / "elsewhere.toml"
        elsewhere.write_text("[limits]\ntimeout = 5\n")
        path.symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        path.write_text("# " + "x" * 400_000 + "\n")
    else:
        path.parent.rmdir()
        path.parent.write_text("not a directory")
    for args in (["config", "show"], ["run", "--agent", "quick", "x"]):
        done = pisub_cli(*args, timeout=20)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "config.toml" in done.stderr
    assert not list(pisub.list_runs())


def test_a_symlinked_xdg_config_of_the_users_is_followed(home: Path, quick: None, tmp_path: Path) -> None:
    """A dotfile manager's link (two links in a row here) to a file of the user's: read; the old
    place's symlink is refused with a message that says where a link is followed."""
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "pisub.toml").write_text("[limits]\ntimeout = 5\n")
    (dotfiles / "current.toml").symlink_to("pisub.toml")
    xdg = _xdg_config(tmp_path)
    xdg.symlink_to(dotfiles / "current.toml")
    assert _shown()["limits.timeout"] == (5, "config.toml")
    (home / "config.toml").symlink_to(dotfiles / "pisub.toml")
    done = pisub_cli("config", "show")
    assert done.returncode == 1 and "Too many levels" not in done.stderr
    assert "config.toml is a symlink: pisub reads <home>/config.toml only as a regular file" in done.stderr
    assert f"move it to {xdg} (a symlink is followed there)" in done.stderr


@pytest.mark.parametrize("kind", ["dangling", "directory", "fifo", "loop"])
def test_a_symlinked_xdg_config_to_no_regular_file_is_refused(
    home: Path, quick: None, tmp_path: Path, kind: str
) -> None:
    xdg = _xdg_config(tmp_path)
    target = tmp_path / "target"
    if kind == "directory":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "loop":
        target.symlink_to(xdg)
    xdg.symlink_to(target)
    done = pisub_cli("config", "show", timeout=20)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "Too many levels" not in done.stderr
    expected = {
        "dangling": f"{xdg} links to {target}, which does not exist; fix or remove the link",
        "directory": f"{xdg} links to {target}, which is not a regular file (directory); fix the link",
        "fifo": f"{xdg} links to {target}, which is not a regular file (FIFO); fix the link",
        "loop": f"{xdg}: more than 8 symlinks in a row (a loop?); fix the link",
    }[kind]
    assert done.stderr.strip().splitlines() == [f"pisub: {expected} [INVALID_INPUT]"], done.stderr


@pytest.mark.root
@pytest.mark.parametrize("whose", ["link", "target"])
def test_a_config_symlink_or_target_of_another_user_is_refused(
    home: Path, quick: None, tmp_path: Path, whose: str
) -> None:
    """As root, a link or file owned by another user (nobody: 65534) is not followed."""
    if os.getuid() != 0:
        pytest.skip("needs root to give a file to another user")
    target = tmp_path / "theirs.toml"
    target.write_text("[limits]\ntimeout = 5\n")
    xdg = _xdg_config(tmp_path)
    xdg.symlink_to(target)
    os.lchown(xdg if whose == "link" else target, 65534, 65534)
    done = pisub_cli("config", "show")
    note = "pisub follows a config symlink only when each link and its target are yours (or root's)"
    said = (
        f"{xdg}: the symlink {xdg} is owned by uid 65534; {note}"
        if whose == "link"
        else f"{xdg} links to {target}, which is owned by uid 65534; {note}"
    )
    assert done.returncode == 1 and done.stderr.strip() == f"pisub: {said} [INVALID_INPUT]", done.stderr


def _xdg_config(tmp_path: Path) -> Path:
    """``$XDG_CONFIG_HOME/pisub/config.toml`` of the test (the home fixture points it at tmp)."""
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "pisub" / "config.toml"
    assert path.is_relative_to(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_the_xdg_config_wins_key_by_key_over_the_old_place(home: Path, quick: None, tmp_path: Path) -> None:
    xdg = _xdg_config(tmp_path)
    xdg.write_text('[limits]\ntimeout = 5\n\n[placement]\nbackend = "local"\n')
    (home / "config.toml").write_text("[limits]\ntimeout = 9\nidle_timeout = 3\n")
    rows = {r["name"]: r for r in json.loads(pisub_cli("config", "show", "--json", check=True).stdout)}
    assert (rows["limits.timeout"]["value"], rows["limits.timeout"]["file"]) == (5, str(xdg))
    assert (rows["limits.idle_timeout"]["value"], rows["limits.idle_timeout"]["file"]) == (
        3,
        str(home / "config.toml"),
    )
    assert rows["limits.output_cap"]["file"] is None and rows["limits.timeout"]["source"] == "config.toml"
    lines = pisub_cli("config", "show", check=True).stdout.splitlines()
    assert lines[0] == f"# read   {xdg}"
    assert lines[1].startswith(f"# read   {home / 'config.toml'} (the old place: still read;")
    assert lines[2] == "# both set limits.timeout = 5 (not 9, from the old place)"
    assert any(line.startswith("limits.timeout ") and line.endswith(f"({xdg})") for line in lines)
    manifest = pisub.launch("quick", "x").manifest()
    assert manifest.limits.timeout == 5 and manifest.limits.idle_timeout == 3
    xdg.write_text("[limits]\nidle_timeout = -2\n")  # a bad value: the error names its file
    done = pisub_cli("config", "show")
    assert done.returncode == 1 and done.stderr.startswith(f"pisub: {xdg}: ") and "idle" in done.stderr


def test_config_show_names_the_files_it_looked_for(home: Path, quick: None, tmp_path: Path) -> None:
    xdg = _xdg_config(tmp_path)
    lines = pisub_cli("config", "show", check=True).stdout.splitlines()
    assert lines[0] == f"# absent {xdg}" and lines[1].startswith(f"# absent {home / 'config.toml'}")
    # A relative XDG_CONFIG_HOME is ignored (the XDG spec): ~/.config/pisub/config.toml then.
    fake_home = tmp_path / "user"
    env = {**os.environ, "XDG_CONFIG_HOME": "relative/dir", "HOME": str(fake_home)}
    shown = pisub_cli("config", "show", env=env, check=True).stdout.splitlines()
    assert shown[0] == f"# absent {fake_home}/.config/pisub/config.toml"
