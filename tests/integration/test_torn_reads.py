"""status.json is never seen torn while a writer replaces it a thousand times."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pisub
from pisub.protocol import Status, decode
from pisub.store.paths import RunPaths
from pisub.store.runs import load_status
from tests.conftest import AgentMaker

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from pisub.store.paths import RunPaths
    from pisub.store.runs import load_status, write_status
    paths = RunPaths(Path(sys.argv[1]))
    status = load_status(paths)
    print("ready", flush=True)
    for i in range(1000):
        status.steps[0].output_bytes = i
        status.agent = "x" * (i % 97)   # vary the size so a torn read would show
        write_status(paths, status)
""")


def test_status_never_torn_under_rewrites(home: Path, make_agent: AgentMaker) -> None:
    make_agent("quick", python="print('done')")
    run = pisub.launch("quick", "x")
    run.wait(timeout=30)
    paths = RunPaths(run.dir)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run.dir)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"
    reads = 0
    seen = set()
    deadline = time.monotonic() + 60
    while writer.poll() is None:
        assert time.monotonic() < deadline, "the writer was still going after 60 s"
        status = decode(paths.status.read_bytes(), Status, "status.json")
        seen.add(status.steps[0].output_bytes)
        reads += 1
    writer.stdout.close()
    assert writer.returncode == 0
    assert load_status(paths).steps[0].output_bytes == 999
    assert reads > 100 and len(seen) > 10
    assert not [p for p in Path(run.dir).iterdir() if p.name.endswith(".tmp")]
