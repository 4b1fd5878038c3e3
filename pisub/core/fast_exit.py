"""Ending a process that has done its work without the interpreter's teardown: tearing down the
hundreds of modules a launch or a runner imported costs tens of milliseconds of CPU and keeps
the process alive longer (a launcher's caller, a stop, wait for it to be gone). The one
mechanism for ``pisub run``/``resume`` (:mod:`pisub.__main__`) and the runner
(:mod:`pisub.runner.__main__`).
"""

from __future__ import annotations

import os
import sys


def exit_now(done: SystemExit) -> None:
    """End the process as ``done`` would, without tearing the interpreter down: the exit
    handlers run (an unused warm runner is ended) and the standard streams are flushed. Returns
    (the caller re-raises ``done``: the ordinary exit) when the code is not a number, a thread
    that is not a daemon still runs, or a stream cannot be flushed (the ordinary exit reports
    it as it always does)."""
    code = 0 if done.code is None else done.code
    if not isinstance(code, int) or isinstance(code, bool):
        return
    threading = sys.modules.get("threading")
    if threading is not None and any(
        t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()
    ):
        return
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            return  # (an exit handler wrote to a stream that broke: the ordinary exit says so)
    os._exit(code & 0xFF)
