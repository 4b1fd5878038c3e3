"""Where a run's runner lives: the placement request's checks (strict input, field paths)."""

from __future__ import annotations

import shutil

import pytest

from pisub.errors import InvalidInput, LaunchFailed, PisubError
from pisub.protocol.agent import AgentFrontmatter
from pisub.protocol.codec import convert
from pisub.protocol.config import Config
from pisub.protocol.placement import BackendName, SlurmOptions
from pisub.runs.launch import placement_request


def _fm(**extra: object) -> AgentFrontmatter:
    return convert({"name": "a", "command": "true", **extra}, AgentFrontmatter, "agent.md")


def test_local_is_the_default_and_writes_no_request() -> None:
    assert placement_request(None, _fm(), Config()) is None
    assert placement_request("local", _fm(backend="slurm"), Config()) is None


def test_an_unknown_backend_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InvalidInput, match="'kubernetes' is not one of local, slurm"):
        placement_request("kubernetes", _fm(), Config())


@pytest.mark.parametrize(
    ("slurm", "where"),
    [
        ({"partition": "a b"}, "partition"),
        ({"partition": "--wrap=x"}, "partition"),
        ({"time": "tomorrow"}, "time"),
        ({"mem": "4 GB"}, "mem"),
        ({"mem": "0"}, "mem"),
        ({"cpus": 0}, "cpus"),
        ({"sbatch": ["-o x"]}, "sbatch"),
        ({"sbatch": ["--account=ml\n--wrap=rm"]}, "sbatch"),
        ({"sbatch": "--account=ml"}, "sbatch"),
        ({"nodes": 2}, "nodes"),
    ],
)
def test_hostile_slurm_options_in_an_agent_file_are_refused_with_their_field(
    slurm: dict[str, object], where: str
) -> None:
    with pytest.raises(PisubError, match=where):
        _fm(slurm=slurm)


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs sbatch on PATH")
@pytest.mark.parametrize(
    "word",
    [
        *["--output=/tmp/x", "--wrap=id", "--export=NONE", "--array=1-4", "--chdir=/"],
        *["--job-n=evil", "--arr=1-2", "--chd=/tmp", "--outp=/tmp/x", "--err=/tmp/y", "--par"],
    ],
)
def test_sbatch_options_pisub_sets_itself_are_refused(word: str) -> None:
    with pytest.raises(InvalidInput, match=r"slurm\.sbatch: .* leave it out"):
        placement_request("slurm", _fm(slurm={"sbatch": [word]}), Config())


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs sbatch on PATH")
def test_the_agent_files_slurm_options_go_over_the_configs_key_by_key() -> None:
    config = convert(
        {"slurm": {"partition": "cpu", "time": "1:00:00"}, "placement": {"heartbeat_ttl": 8}}, Config, "c"
    )
    request = placement_request("slurm", _fm(slurm={"time": "2:00:00", "sbatch": ["--account=ml"]}), config)
    assert request is not None and request.backend == BackendName.SLURM
    assert request.slurm == SlurmOptions(partition="cpu", time="2:00:00", sbatch=["--account=ml"])
    assert request.heartbeat_ttl == 8


def test_without_sbatch_a_slurm_launch_says_where_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(LaunchFailed, match="sbatch is not on PATH"):
        placement_request("slurm", _fm(), Config())
