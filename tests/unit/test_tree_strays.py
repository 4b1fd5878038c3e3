"""The runner's leftovers (issue 29): :meth:`pisub.runner.tree.Subreaper.strays` reads the tree
below it in one pass over ``/proc``: every live descendant is found, a spared runner is left
with everything below it, and a zombie (a runner that has exited) is no stray."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, time
    from pisub.runner.tree import Subreaper, process_tree

    stray = subprocess.Popen(["sleep", "60"])
    spared = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
    exited = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the spared one's own child exists, the short one exited
        below, _ = process_tree()
        done = os.waitid(os.P_PID, exited.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if below.get(spared.pid) and done is not None:
            break
        time.sleep(0.01)
    grandchild = process_tree()[0][spared.pid]
    found = Subreaper("not-a-run").strays(spare={spared.pid})
    everything = Subreaper("not-a-run").strays()
    print(json.dumps({
        "found": sorted(found), "stray": stray.pid, "everything": sorted(everything),
        "spared": [spared.pid, *grandchild], "exited": exited.pid,
    }))
    for p in (stray, spared):
        p.kill()
    subprocess.run(["kill", "-9", *map(str, grandchild)], check=False)
    """
)


def test_strays_are_read_in_one_pass_and_spare_runners_and_zombies() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout)
    assert seen["found"] == [seen["stray"]]
    assert seen["everything"] == sorted([seen["stray"], *seen["spared"]])
    assert seen["exited"] not in seen["everything"]  # a zombie: nothing left to end
