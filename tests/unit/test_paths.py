from __future__ import annotations

from pathlib import Path

import pytest

from pisub.errors import HomeUnusable, InvalidInput
from pisub.store.paths import (
    RunPaths,
    default_home,
    is_run_id,
    open_home,
    open_home_to_read,
    validate_run_ref,
)


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "  ",
        "../x",
        "/abs",
        "abc",
        "123",
        "zzzzzzzz",
        "mylabel",
        "@",
        "@ x",
        "@a\x1b[31mb",
        "@a\nb",
        "@" + "x" * 81,
        "@\u202eevil",
        "a" * 37,
        "12345678/..",
        "12345678\n",
        "-12345678",
    ],
)
def test_bad_run_refs_are_refused_before_the_disk(ref: str) -> None:
    with pytest.raises(InvalidInput):
        validate_run_ref(ref)


@pytest.mark.parametrize("ref", ["1234", "ABCDEF12", "3f2a1b4c-1234", "3f2a1b4c-1234-4abc-8def-0123456789ab"])
def test_ids_and_long_prefixes_are_accepted_lowercased(ref: str) -> None:
    assert validate_run_ref(ref) == ref.lower()


@pytest.mark.parametrize("ref", ["@fix login", "@cafe", "@" + "x" * 80, "@ünïcode ✓"])
def test_a_label_reference_is_kept_as_given(ref: str) -> None:
    assert validate_run_ref(ref) == ref


def test_is_run_id() -> None:
    assert is_run_id("3f2a1b4c-1234-4abc-8def-0123456789ab")
    assert not is_run_id("3f2a1b4c")
    assert not is_run_id(".creating-3f2a1b4c-1234-4abc-8def-0123456789ab")


def test_the_home_is_pisub_home_else_xdg_state_else_local_state() -> None:
    assert default_home({"PISUB_HOME": "/x/y"}) == Path("/x/y")
    assert default_home({"XDG_STATE_HOME": "/state"}) == Path("/state/pisub")
    assert default_home({"XDG_STATE_HOME": "relative"}) == Path.home() / ".local/state/pisub"
    assert default_home({}) == Path.home() / ".local/state/pisub"


def test_every_name_of_a_run_is_the_one_the_protocol_documents() -> None:
    """RunPaths is the one place that names a run's files: each name it gives is in spec/protocol.md."""
    spec = (Path(__file__).resolve().parents[2] / "spec" / "protocol.md").read_text()
    paths = RunPaths(Path("/h/runs/r"))
    names = {
        name: getattr(paths, name)
        for name, member in vars(RunPaths).items()
        if isinstance(member, property) and name not in ("run_id", "home", "repair_lock")
    }
    names |= {
        "output_log": paths.output_log(0),
        "stderr_log": paths.stderr_log(3),
        "receipt": paths.receipt("x"),
    }
    for name, path in names.items():
        relative = str(path.relative_to(paths.root))
        documented = relative.replace("0", "<N>").replace("3", "<N>").replace("x.json", "<id>.json")
        assert (
            f"`{documented}" in spec or f"{documented}/" in spec or f"`{documented.split('/')[-1]}" in spec
        ), f"RunPaths.{name} ({relative}) is not in spec/protocol.md"
    assert [p.name for p in paths.control_dirs()] == ["inbox", "tmp", "new", "cur", "rejected", "outbox"]


def test_a_folder_of_other_files_named_as_the_home_is_refused_and_never_changed(tmp_path: Path) -> None:
    """PISUB_HOME=/tmp (or, as root, /proc) must not chmod it 0700: found by an outside attack."""
    real = tmp_path / "real"
    (real / "stuff").mkdir(parents=True)
    real.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(real)
    for named in (real, link):
        with pytest.raises(HomeUnusable, match="folder of other files"):
            open_home(named)
        assert real.stat().st_mode & 0o777 == 0o755
        assert not (real / "runs").exists()


@pytest.mark.parametrize("kind", ["empty", "home", "agents"])
def test_an_empty_folder_or_a_home_of_pisubs_is_tightened(tmp_path: Path, kind: str) -> None:
    home = tmp_path / "home"
    (home / {"empty": "", "home": "runs", "agents": "agents"}[kind]).mkdir(parents=True)
    home.chmod(0o755)
    open_home(home)
    assert home.stat().st_mode & 0o777 == 0o700


def test_a_home_that_is_a_dangling_symbolic_link_is_refused_naming_where_it_points(tmp_path: Path) -> None:
    """The attack's F3 (issue 29): it was refused as "No such file or directory" — of which?"""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    for opener in (open_home, open_home_to_read):
        with pytest.raises(HomeUnusable, match=r"is a symbolic link to .*gone, which does not exist"):
            opener(link)
    assert not (tmp_path / "gone").exists()
