"""Lane evidence must be what it claims (issue 23): the stored patches are hashed again every
time the evidence decides anything, a lane is never superseded by itself or through a cycle,
a merge that contradicts the recorded one is refused as stale, commit ids are full, and
recorders racing each other or a cleanup never both win. Real workflow runs, real git."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pisub
from pisub.worktrees import cleanup_plan, load_record
from tests.conftest import pisub_cli, wait_for
from tests.integration.test_worktree_runs import _two_writers, git, plant_merge, repo  # noqa: F401

IDS: dict[str, str] = {}
"""The commits :func:`_plant` made in the current test's repository."""


def _plant(where: Path) -> None:
    (h1, h2, h3, h4), m1, m2 = plant_merge(where)
    IDS.clear()
    IDS.update(H1=h1, H2=h2, H3=h3, H4=h4, M1=m1, M2=m2)


def _state(run_id: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(pisub_cli("lane", "status", run_id, "--json", check=True).stdout)
    return found


def _merge(
    run_id: str, head: str | None = None, commit: str | None = None, pr: str = "7"
) -> subprocess.CompletedProcess[str]:
    head, commit = head or IDS["H1"], commit or IDS["M1"]
    return pisub_cli(
        "lane", "record-merge", run_id, "--pr", pr, "--reviewed-head", head, "--merge-commit", commit,
        "--tree-equivalent", "--post-merge-checks", "recorded", "--by", "ana", "--json",
    )  # fmt: skip


def _patch_of(child: str) -> Path:
    link = pisub.Run(child).manifest().worktree
    assert link is not None
    info = load_record(Path(link.record)).patch
    assert info is not None
    return Path(info.path)


def _worktree_of(child: str) -> Path:
    link = pisub.Run(child).manifest().worktree
    assert link is not None
    return Path(link.path)


def test_a_replaced_patch_is_evidence_mismatch_and_blocks_cleanup_until_restored(repo: Path) -> None:  # noqa: F811
    run, (a, b) = _two_writers(repo, "a", "b")
    _plant(repo)
    done = _merge(run.id)
    assert done.returncode == 0, done.stderr
    assert _state(run.id)["state"] == "terminal-eligible"
    patch = _patch_of(a)
    original = patch.read_bytes()
    for forged in (original.replace(b"+a", b"+z"), original + b"\n", b""):  # same size, longer, empty
        patch.write_bytes(forged)
        state = _state(run.id)
        assert state["state"] == "evidence-mismatch" and state["code"] == "EVIDENCE_MISMATCH", state
        assert state["cleanupCommand"] is None and "restore the patch" in state["reason"]
        human = pisub_cli("lane", "status", run.id)
        assert "evidence-mismatch" in human.stdout and "[EVIDENCE_MISMATCH]" in human.stdout
        clean = pisub_cli("worktree", "cleanup", "--apply", "--lane", run.id, "--json")
        assert clean.returncode == 1 and "EVIDENCE_MISMATCH" in clean.stderr, clean
        assert "Traceback" not in clean.stderr and _worktree_of(a).is_dir() and _worktree_of(b).is_dir()
        again = _merge(run.id)
        assert again.returncode == 1 and "EVIDENCE_MISMATCH" in again.stderr, again
    patch.unlink()
    assert _state(run.id)["state"] == "evidence-mismatch"
    os.mkfifo(patch)  # never blocks a reader
    assert _state(run.id)["state"] == "evidence-mismatch"
    patch.unlink()
    (patch.parent / "copy").write_bytes(original)
    patch.symlink_to(patch.parent / "copy")  # the right bytes, behind a symlink: never followed
    assert _state(run.id)["state"] == "evidence-mismatch"
    patch.unlink()
    patch.write_bytes(original.replace(b"+a", b"+z"))
    # The cleanup's own choke point hashes again too, whatever the caller says is settled.
    roots = {Path(pisub.Run(c).manifest().worktree.record).parent for c in (a, b)}  # type: ignore[union-attr]
    for root in roots:
        plan = {e.run_id: e for e in cleanup_plan(root, lambda _rid: False, lambda _rid: True)}
        assert plan[a].decision.value == "keep" and "not the one captured" in (plan[a].detail or "")
        assert plan[b].decision.value == "remove"
    patch.write_bytes(original)
    assert _state(run.id)["state"] == "terminal-eligible"
    out = json.loads(
        pisub_cli("worktree", "cleanup", "--apply", "--lane", run.id, "--json", check=True).stdout
    )
    assert sorted(r["entry"]["runId"] for r in out["removed"] if r["removed"]) == sorted([a, b])


def test_a_lane_is_never_superseded_by_itself_or_through_a_cycle(repo: Path) -> None:  # noqa: F811
    first, _ = _two_writers(repo, "x")
    second, _ = _two_writers(repo, "y")
    own = pisub_cli("lane", "record-supersession", first.id, "--by-lane", first.id, "--by", "bo")
    assert own.returncode == 1 and "INVALID_INPUT" in own.stderr and "itself" in own.stderr, own
    assert _state(first.id)["state"] == "terminal-blocked"
    ok = pisub_cli("lane", "record-supersession", first.id, "--by-lane", second.id, "--by", "bo", "--json")
    assert json.loads(ok.stdout)["state"] == "superseded-eligible", ok.stderr
    back = pisub_cli("lane", "record-supersession", second.id, "--by-lane", first.id, "--by", "bo")
    assert back.returncode == 1 and "cycle" in back.stderr, back
    assert _state(second.id)["state"] == "terminal-blocked"
    held = (pisub.Run(first.id).dir / "handoff.json").read_bytes()
    same = pisub_cli("lane", "record-supersession", first.id, "--by-lane", second.id, "--by", "cy")
    assert same.returncode == 0 and (pisub.Run(first.id).dir / "handoff.json").read_bytes() == held
    # Two recorders racing past each other's check (each handoff written as the other reads):
    # the cycle is caught when judged, and neither lane is eligible.
    digest = _state(second.id)["digest"]
    forged = {
        "v": 1, "runId": second.id, "digest": digest, "updatedAt": "2026-01-01T00:00:00Z",
        "supersession": {"byLane": first.id, "attestedBy": "eve", "attestedAt": "2026-01-01T00:00:00Z"},
    }  # fmt: skip
    (pisub.Run(second.id).dir / "handoff.json").write_text(json.dumps(forged))
    for lane in (first.id, second.id):
        state = _state(lane)
        assert state["state"] == "terminal-blocked" and "cycle" in state["reason"], state
        assert state["cleanupCommand"] is None
    same = pisub_cli("lane", "record-supersession", first.id, "--by-lane", second.id, "--by", "bo")
    assert same.returncode == 1 and "cycle" in same.stderr  # nor is it recorded again


def test_a_contradicting_merge_is_stale_the_same_one_is_idempotent_and_ids_are_full(repo: Path) -> None:  # noqa: F811
    run, _ = _two_writers(repo, "m")
    _plant(repo)
    for short in ("abc1234", "1" * 39, "1" * 41, "g" * 40, "1" * 63):
        bad = _merge(run.id, head=short)
        assert bad.returncode == 1 and "full commit id" in bad.stderr and "INVALID_INPUT" in bad.stderr, bad
        bad = _merge(run.id, commit=short)
        assert bad.returncode == 1 and "--merge-commit must be a full commit id" in bad.stderr, bad
    other_format = _merge(run.id, head="c" * 64)  # a SHA-256 id for this SHA-1 repository
    assert other_format.returncode == 1 and "SHA-1 ids of 40" in other_format.stderr, other_format
    assert not (pisub.Run(run.id).dir / "handoff.json").exists()
    assert _merge(run.id).returncode == 0
    handoff = pisub.Run(run.id).dir / "handoff.json"
    first = handoff.read_bytes()
    same = _merge(run.id, head=IDS["H1"].upper())
    assert same.returncode == 0 and json.loads(same.stdout)["state"] == "terminal-eligible", same.stderr
    assert handoff.read_bytes() == first  # idempotent: not even rewritten
    for kwargs in ({"head": IDS["H2"]}, {"commit": IDS["M2"]}, {"pr": "8"}):
        stale = _merge(run.id, **kwargs)
        assert stale.returncode == 1 and "EVIDENCE_STALE" in stale.stderr, stale
        assert "Traceback" not in stale.stderr
    assert handoff.read_bytes() == first
    # The file's own type is as strict: an abbreviated id in handoff.json is unknown, never eligible.
    data = json.loads(first)
    data["merge"]["reviewedHead"] = "abc1234"
    handoff.write_text(json.dumps(data))
    assert _state(run.id)["state"] == "unknown"
    data["merge"]["reviewedHead"] = "0" * 40  # the null id names no commit
    handoff.write_text(json.dumps(data))
    assert _state(run.id)["state"] == "unknown"
    data["merge"]["reviewedHead"] = "c" * 64  # a SHA-256 repository's id is a full one
    handoff.write_text(json.dumps(data))
    assert _state(run.id)["state"] == "terminal-eligible"


def test_a_merge_names_commits_the_lane_s_repository_holds_never_the_null_id(repo: Path) -> None:  # noqa: F811
    """Outside attack (issue 23): an all-zero merge commit made a lane eligible, and its cleanup
    then removed a worktree whose work was never applied anywhere."""
    run, (child,) = _two_writers(repo, "n")
    _plant(repo)
    blob = git(repo, "rev-parse", "HEAD:README").strip()  # an object, not a commit
    absent = "5" * 40
    for option, value, why in (
        ("head", "0" * 40, "null id"),
        ("commit", "0" * 40, "null id"),
        ("commit", "0000000000000000000000000000000000000006", "not a commit of the lane's repository"),
        ("head", absent, "not a commit of the lane's repository"),
        ("commit", absent, "not a commit of the lane's repository"),
        ("commit", blob, "not a commit of the lane's repository"),
    ):
        bad = _merge(run.id, **{option: value})
        assert bad.returncode == 1 and "INVALID_INPUT" in bad.stderr, (option, value, bad)
        assert why in bad.stderr, (option, value, bad)
        assert "Traceback" not in bad.stderr
    assert not (pisub.Run(run.id).dir / "handoff.json").exists()
    assert _state(run.id)["state"] == "terminal-blocked"
    out = json.loads(
        pisub_cli("worktree", "cleanup", "--apply", "--lane", run.id, "--json", check=True).stdout
    )
    assert not [r for r in out["removed"] if r["removed"]] and _worktree_of(child).is_dir()
    # A squash or rebase merge does not hold the reviewed head: the ids need only exist.
    assert _merge(run.id, head=IDS["H3"], commit=IDS["M2"]).returncode == 0
    assert _state(run.id)["state"] == "terminal-eligible"


RACER = """
import sys
from pisub.errors import PisubError
from pisub.api.lane_evidence import record_merge
try:
    record_merge(sys.argv[1], pr=7, reviewed_head=sys.argv[2], merge_commit=sys.argv[3],
                 tree_equivalent=True, post_merge_checks="recorded", by="racer")
except PisubError as exc:
    print(exc.code)
    sys.exit(1)
print("OK")
"""


def test_concurrent_recorders_one_wins_the_others_are_stale(repo: Path, tmp_path: Path) -> None:  # noqa: F811
    run, _ = _two_writers(repo, "r")
    _plant(repo)
    go = tmp_path / "go"
    script = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.001)\n" + RACER
    heads = [IDS[f"H{n}"] for n in range(1, 5)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, run.id, head, IDS["M1"]],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for head in heads
    ]
    go.write_text("")
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(outs) == ["EVIDENCE_STALE"] * 3 + ["OK"], outs
    winner = heads[outs.index("OK")]
    assert _state(run.id)["merge"]["reviewedHead"] == winner


# == cleanup racing apply and record-merge ============================================
def _at_once(tmp_path: Path, *commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Start every ``pisub`` command, wait until each has imported pisub, then release them
    together; their results."""
    base = tmp_path / f"race-{len(list(tmp_path.glob('race-*')))}"
    base.mkdir()
    go = base / "go"
    procs = []
    for n, args in enumerate(commands):
        script = (
            "import os, runpy, sys, time\nimport pisub.cli, pisub.api.lane_evidence, pisub.api.worktree_ops\n"
            f"open({str(base / f'ready-{n}')!r}, 'w').close()\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
            "sys.argv = ['pisub', *sys.argv[1:]]\nrunpy.run_module('pisub', run_name='__main__')\n"
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    wait_for(lambda: len(list(base.glob("ready-*"))) == len(commands), 60, what="the racers to be ready")
    go.write_text("")
    done = []
    for proc, args in zip(procs, commands, strict=True):
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    return done


def _record_anywhere(child: str) -> dict[str, Any]:
    link = pisub.Run(child).manifest().worktree
    assert link is not None
    where = Path(link.record)
    for path in (where, where.parent / ".removed" / where.name):
        if path.exists():
            found: dict[str, Any] = json.loads(path.read_text())
            return found
    raise AssertionError(f"the record of {child} is gone")


def test_cleanup_racing_apply_and_record_merge_never_loses_or_half_applies(
    repo: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    for round_ in range(3):
        name = f"r{round_}"
        run, (child,) = _two_writers(repo, name)
        _plant(repo)
        assert _merge(run.id).returncode == 0
        commands = [
            ["worktree", "apply", child],
            ["worktree", "cleanup", "--apply", "--lane", run.id, "--json"],
            ["lane", "record-merge", run.id, "--pr", "9", "--reviewed-head", IDS["H2"],
             "--merge-commit", IDS["M1"], "--tree-equivalent", "--post-merge-checks", "recorded",
             "--by", "bo"],
            ["lane", "status", run.id, "--json"],
        ]  # fmt: skip
        if round_ < 2:
            apply, clean, merge, status_ = _at_once(tmp_path, *commands)
        else:  # the cleanup first, then the apply (the race's other order, made certain)
            clean, apply, merge, status_ = (pisub_cli(*commands[i]) for i in (1, 0, 2, 3))
        assert json.loads(status_.stdout)["state"] == "terminal-eligible", status_  # never torn
        for done in (apply, clean, merge, status_):
            assert "Traceback" not in done.stderr, done
        assert clean.returncode == 0, clean.stderr
        assert merge.returncode == 1 and "EVIDENCE_STALE" in merge.stderr, merge
        record = _record_anywhere(child)
        target = repo / f"{name}.txt"
        status = git(repo, "status", "--porcelain=v1", "--untracked-files=all")
        if apply.returncode == 0:  # applied whole, before or after the removal's lock
            assert record["state"] == "applied" and target.read_text() == f"{name}\n"
            assert status.strip() == f"A  {name}.txt", status
            git(repo, "commit", "-qm", f"applied {name}")
        else:  # removed first on the lane's evidence: apply refused, the repository untouched
            assert "no worktree record" in apply.stderr, apply.stderr
            assert record["state"] == "captured" and record["removedAt"] and not target.exists()
            assert status == "", status
            assert git(repo, "rev-parse", "--verify", f"refs/pisub/{child}").strip()  # the work stays
        assert not _worktree_of(child).exists()
        assert _state(run.id)["state"] == "terminal-eligible"
