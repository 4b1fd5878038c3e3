"""The control plane with real runners: requests in, exactly one receipt out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pisub
from pisub.api.client import Run
from pisub.backends.local import spawn_runner
from pisub.errors import InboxClosed
from pisub.protocol import Limits, Manifest, RunState, now_iso
from pisub.protocol.control import Stop
from pisub.store.mailbox import write_request
from pisub.store.paths import open_home
from pisub.store.runs import RunStore
from tests.conftest import ROOT, AgentMaker, pid_alive, pisub_cli, processes_of, wait_for
from tests.helpers import SLEEPER, drop_request, launch_sleeper, run_receipts


def test_stop_ends_everything(home: Path, make_agent: AgentMaker) -> None:
    run = launch_sleeper(make_agent)
    pids = json.loads((run.dir / "pids.json").read_text())
    proc = pisub_cli("stop", run.id, "--json")
    assert proc.returncode == 0, proc.stderr
    receipt = json.loads(proc.stdout)
    assert receipt["state"] == "delivered" and receipt["type"] == "stop" and receipt["runId"] == run.id
    assert receipt["deliveryStatus"] == "delivered" and receipt["targets"][0]["child"] == 0
    result = run.wait(timeout=30)
    assert result.state == "stopped"
    for pid in pids:
        assert not pid_alive(pid)
    assert (run.dir / "inbox" / "closed").exists()
    assert run.status().steering.requested == 1  # the terminal status is written at once


def test_interrupt_external_cli_is_refused_and_a_raw_request_pauses(
    home: Path, make_agent: AgentMaker
) -> None:
    run = launch_sleeper(make_agent)
    proc = pisub_cli("interrupt", run.id)  # it could not be resumed: refused, stop it instead
    assert proc.returncode == 1 and "[NOT_RESUMABLE]" in proc.stderr and "pisub stop" in proc.stderr
    assert run.status().state == RunState.RUNNING
    run.send_interrupt()  # a request written by hand still pauses it
    assert run.wait(timeout=30).state == "paused"
    assert run.status().state == RunState.PAUSED


def test_steer_external_cli_fails_with_reason(home: Path, make_agent: AgentMaker) -> None:
    run = launch_sleeper(make_agent)
    proc = pisub_cli("steer", run.id, "change course", "--json")
    assert proc.returncode == 1 and "[NOT_STEERABLE]" in proc.stderr  # refused before writing
    receipt = run.wait_for_receipt(run.send_steer("change course"), 10)  # written by hand: failed
    assert receipt is not None and receipt.state == "failed"
    assert receipt.reason == "steering is not supported by the external-cli runner"
    bad_child = pisub_cli("stop", run.id, "--child", "3")
    assert bad_child.returncode == 2 and "no child 3" in bad_child.stdout
    assert run.status().state == RunState.RUNNING
    wait_for(lambda: run.status().steering.failed == 2, what="the coalesced ledger")
    ledger = run.status().steering
    assert (ledger.requested, ledger.failed) == (2, 2)
    assert [e.preview for e in ledger.recent] == ["change course", ""]


def test_wait_zero_returns_at_once(home: Path, make_agent: AgentMaker) -> None:
    run = launch_sleeper(make_agent)
    proc = pisub_cli("stop", run.id, "--wait", "0")
    assert proc.returncode == 0
    rid = proc.stdout.strip()
    receipt = wait_for(lambda: run.receipt(rid))
    assert receipt.state == "delivered"


def test_request_written_before_the_runner_starts(home: Path, make_agent: AgentMaker) -> None:
    """A request already in inbox/new when the runner starts is handled by its first scan."""
    make_agent("sleeper", python=SLEEPER)
    spec = pisub.agent_catalog().get("sleeper").spec()
    limits = Limits(timeout=60, idle_timeout=None, grace=1, output_cap=1 << 20, output_hard_cap=1 << 26)
    manifest = Manifest(
        v=1,
        run_id="0123abcd-0000-4000-8000-000000000001",
        created_at=now_iso(),
        agent=spec,
        task="x",
        cwd=str(home.parent),
        umask=0o022,
        limits=limits,
    )
    paths, lock_fd = RunStore(open_home()).create(manifest)
    rid = write_request(paths, Stop(v=1, reason="early"))
    try:
        spawn_runner(paths, lock_fd)
    finally:
        os.close(lock_fd)
    run = Run(paths.run_id)
    assert run.wait(timeout=30).state == "stopped"
    receipt = run.receipt(rid)
    assert receipt is not None and receipt.state == "delivered"


WRITER = textwrap.dedent("""
    import sys
    from pisub.api.client import Run
    run = Run(sys.argv[1])
    writer = sys.argv[2]
    ids = [run.send_steer(f"{writer}:{i}") for i in range(int(sys.argv[3]))]
    print("\\n".join(ids))
""")


@pytest.mark.parametrize(("writers", "each"), [(10, 100)])
def test_concurrent_writers_every_request_one_receipt(
    home: Path, make_agent: AgentMaker, writers: int, each: int
) -> None:
    run = launch_sleeper(make_agent)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, run.id, f"w{n}", str(each)], stdout=subprocess.PIPE, text=True
        )
        for n in range(writers)
    ]
    ids: dict[str, list[str]] = {}
    for n, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        ids[f"w{n}"] = out.split()
    total = writers * each
    wait_for(
        lambda: len(list((run.dir / "outbox").glob("*.json"))) >= total, timeout=120, what="all receipts"
    )
    receipts = run_receipts(run)
    assert len(receipts) == total
    assert {r["state"] for r in receipts.values()} == {"failed"}  # external-cli cannot be steered
    assert sorted(receipts) == sorted(i for v in ids.values() for i in v)
    # The runner handled each writer's requests in the order they were written.
    events = [json.loads(line) for line in (run.dir / "events.jsonl").read_text().splitlines()]
    handled = [e["data"]["id"] for e in events if e["type"] == "control.received"]
    assert len(handled) == total and len(set(handled)) == total
    for writer_ids in ids.values():
        positions = [handled.index(i) for i in writer_ids]
        assert positions == sorted(positions)
    wait_for(lambda: run.status().steering.failed == total, what="the coalesced ledger")
    ledger = run.status().steering
    assert ledger.requested == total and ledger.failed == total and len(ledger.recent) == 20


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [
        ("garbage.json", b"\x00\xff not json", "not valid JSON"),
        ("array.json", b"[1, 2, 3]", "Expected `object`"),
        ("unknown.json", b'{"v":1,"type":"dance"}', "Invalid value 'dance'"),
        ("extra.json", b'{"v":1,"type":"stop","bogus":1}', "unknown field `bogus`"),
        ("wrongtype.json", b'{"v":1,"type":"stop","child":"0"}', "$.child"),
        ("blank.json", b'{"v":1,"type":"steer","message":"   "}', "blank"),
        ("noversion.json", b'{"type":"stop"}', "missing required field `v`"),
        ("empty.json", b"", "not valid JSON"),
        ("big.json", b'{"v":1,"type":"steer","message":"' + b"x" * 300_000 + b'"}', "larger than"),
        ("msg.json", b'{"v":1,"type":"steer","message":"' + b"x" * 140_000 + b'"}', "larger than 131072"),
        ("bad id.json", b'{"v":1,"type":"stop"}', "not a valid request id"),
        ("idbad.json", b'{"v":1,"type":"stop","id":"../../x"}', "$.id"),
    ],
)
def test_malformed_requests_rejected_between_good_ones(
    home: Path, make_agent: AgentMaker, name: str, data: bytes, why: str
) -> None:
    run = launch_sleeper(make_agent)
    drop_request(run, "a-before.json", b'{"v":1,"type":"steer","message":"first"}')
    drop_request(run, name, data)
    drop_request(run, "z-after.json", b'{"v":1,"type":"steer","message":"last"}')
    wait_for(lambda: len(list((run.dir / "outbox").glob("*.json"))) == 3, what="three receipts")
    receipts = run_receipts(run)
    assert receipts["a-before"]["state"] == "failed" and receipts["z-after"]["state"] == "failed"
    (bad_id,) = [k for k in receipts if k not in ("a-before", "z-after")]
    bad = receipts[bad_id]
    assert bad["state"] == "rejected" and why in str(bad["reason"]), bad
    # moved only once its receipt is durable: named after that receipt
    wanted = [f"{bad_id}.json", f"{bad_id}.reason"]
    wait_for(lambda: sorted(p.name for p in (run.dir / "inbox" / "rejected").iterdir()) == wanted)
    assert run.status().state == RunState.RUNNING, "a bad request never crashes the runner"
    wait_for(lambda: run.status().steering.rejected == 1, what="the ledger (status writes are coalesced)")


def test_duplicate_id_rejected_first_receipt_kept(home: Path, make_agent: AgentMaker) -> None:
    run = launch_sleeper(make_agent)
    drop_request(run, "dup.json", b'{"v":1,"type":"steer","message":"one"}')
    wait_for(lambda: (run.dir / "outbox" / "dup.json").exists())
    first = (run.dir / "outbox" / "dup.json").read_bytes()
    drop_request(run, "dup.json", b'{"v":1,"type":"stop"}')
    reason = run.dir / "inbox" / "rejected" / "dup.reason"
    wait_for(reason.exists, what="the duplicate's reason beside it")
    assert "duplicate" in reason.read_text()
    assert (run.dir / "outbox" / "dup.json").read_bytes() == first
    assert run.status().state == RunState.RUNNING


def test_symlink_rejected(home: Path, make_agent: AgentMaker, tmp_path: Path) -> None:
    run = launch_sleeper(make_agent)
    secret = tmp_path / "secret.json"
    secret.write_text('{"v":1,"type":"stop"}')
    os.symlink(secret, run.dir / "inbox" / "new" / "link.json")
    wait_for(lambda: len(run_receipts(run)) == 1)
    receipts = run_receipts(run)
    assert receipts["link"]["state"] == "rejected" and "symlink" in str(receipts["link"]["reason"])
    assert run.status().state == RunState.RUNNING


@pytest.mark.root  # only root can make a file another user's
def test_foreign_owner_rejected(home: Path, make_agent: AgentMaker) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    run = launch_sleeper(make_agent)
    foreign = run.dir / "inbox" / "tmp" / "foreign.json"
    foreign.write_text('{"v":1,"type":"stop"}')
    os.chown(foreign, 12345, 12345)
    os.rename(foreign, run.dir / "inbox" / "new" / "foreign.json")
    wait_for(lambda: len(run_receipts(run)) == 1)
    receipts = run_receipts(run)
    assert receipts["foreign"]["state"] == "rejected" and "uid 12345" in str(receipts["foreign"]["reason"])
    assert run.status().state == RunState.RUNNING


def test_closed_inbox_requests_are_answered(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    with pytest.raises(InboxClosed):
        run.send_stop()
    proc = pisub_cli("steer", run.id, "too late", "--json")
    closed = json.loads(proc.stdout)
    assert proc.returncode == 1 and closed["state"] == "failed" and closed["code"] == "RUN_CLOSED"
    drop_request(run, "by-hand.json", b'{"v":1,"type":"follow_up","message":"late"}')
    assert run.status().state == RunState.COMPLETE  # the reader answers it
    receipt = run.receipt("by-hand")
    assert receipt is not None and receipt.state == "failed"
    assert receipt.reason == "the run finished before the request was consumed"


def test_killed_runner_leaves_no_request_unanswered(home: Path, make_agent: AgentMaker) -> None:
    import signal

    from pisub.core.locks import is_held

    run = launch_sleeper(make_agent)
    pid = run.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # frozen: requests pile up unclaimed
    try:
        for n in range(5):
            drop_request(run, f"req-{n}.json", b'{"v":1,"type":"steer","message":"hello"}')
        drop_request(run, "broken.json", b"{")
    finally:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid) and not is_held(run.dir / "runner.lock"))
    assert run.status().state == RunState.FAILED
    receipts = run_receipts(run)
    assert sorted(receipts) == ["broken", *[f"req-{n}" for n in range(5)]]
    assert receipts["broken"]["state"] == "rejected"
    for n in range(5):
        assert receipts[f"req-{n}"]["state"] == "failed"
        assert receipts[f"req-{n}"]["reason"] == "the runner died before the request was consumed"
    assert not processes_of(home)


def test_the_reference_shell_scripts_steer_and_stop_a_run(home: Path, make_agent: AgentMaker) -> None:
    run = launch_sleeper(make_agent)
    steer = subprocess.run(
        ["sh", str(ROOT / "scripts" / "steer.sh"), str(run.dir), 'say "hi"\\ and\tgo'],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert steer.returncode == 2, steer.stderr  # an external CLI cannot be steered: failed
    receipt = json.loads(steer.stdout)
    assert receipt["state"] == "failed" and receipt["type"] == "steer"
    wait_for(lambda: run.status().steering.failed == 1, what="the coalesced ledger")
    ledger = run.status().steering
    assert ledger.recent[-1].preview == 'say "hi"\\ and go'
    stop = subprocess.run(
        ["sh", str(ROOT / "scripts" / "stop.sh"), str(run.dir)], capture_output=True, text=True, timeout=30
    )
    assert stop.returncode == 0, stop.stderr
    assert json.loads(stop.stdout)["state"] == "delivered"
    assert run.wait(timeout=30).state == "stopped"
    late = subprocess.run(
        ["sh", str(ROOT / "scripts" / "stop.sh"), str(run.dir)], capture_output=True, text=True, timeout=30
    )
    assert late.returncode == 2 and json.loads(late.stdout)["state"] == "failed"
    odd = "\x1b[31mred\x0c and " + "x" * 5000
    proc = subprocess.run(
        ["sh", str(ROOT / "scripts" / "steer.sh"), str(run.dir), odd],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2  # the run has finished


def test_steer_sh_escapes_every_control_character(home: Path, make_agent: AgentMaker) -> None:
    run = launch_sleeper(make_agent)
    message = "".join(chr(c) for c in range(1, 32)) + ' \\ " é ' + "y" * 20_000
    proc = subprocess.run(
        ["sh", str(ROOT / "scripts" / "steer.sh"), str(run.dir), message],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr  # valid JSON: failed only because external-cli cannot steer
    receipt = json.loads(proc.stdout)
    assert receipt["state"] == "failed" and "not supported" in receipt["reason"]


def test_a_request_id_cannot_be_published_twice(home: Path, make_agent: AgentMaker) -> None:
    import signal

    from pisub.errors import InvalidInput
    from pisub.protocol.control import Steer

    run = launch_sleeper(make_agent)
    pid = run.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # nothing is claimed while both writers publish
    try:
        run.send(Steer(v=1, id="same", message="first"))
        with pytest.raises(InvalidInput, match="already waiting"):
            run.send(Stop(v=1, id="same"))
    finally:
        os.kill(pid, signal.SIGCONT)
    receipt = wait_for(lambda: run.receipt("same"))
    assert receipt.type == "steer"
    with pytest.raises(InvalidInput, match="already used"):
        run.send(Stop(v=1, id="same"))
    assert run.status().state == RunState.RUNNING


def test_a_reader_dying_while_answering_leaves_work_for_the_next(
    home: Path, make_agent: AgentMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pisub.store.mailbox as mailbox

    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    drop_request(run, "late.json", b'{"v":1,"type":"steer","message":"late"}')
    drop_request(run, "bad.json", b"{")

    def crash(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(mailbox, "write_receipt", crash)
        with pytest.raises(KeyboardInterrupt):
            run.status()
    assert run.receipt("late") is None  # claimed, not answered: the reader died
    run.status()
    late, bad = run.receipt("late"), run.receipt("bad")
    assert late is not None and late.state == "failed"
    assert bad is not None and bad.state == "rejected"
