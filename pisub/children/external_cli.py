"""Any command-line program as the child.

argv is used as given, never through a shell. The prompt (the agent's system prompt,
a blank line, then the task) is written to stdin, which is then closed. stdout goes
to ``output-<N>.log`` and stderr to ``stderr-<N>.log``, each capped; the last 64 KiB
of each are kept for the result.
"""

from __future__ import annotations

import selectors
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from pisub.children.base import ChildHooks, ChildOutcome
from pisub.children.process import PipeWriter, ProcessChild
from pisub.defaults import TAIL_BYTES
from pisub.protocol.env import ENV_RUN_DIR, ENV_RUNNER
from pisub.protocol.manifest import Manifest
from pisub.store.lineage import markers
from pisub.store.output import StreamSink
from pisub.store.paths import RunPaths

READ_CHUNK = 64 * 1024


def build_prompt(system_prompt: str, task: str) -> bytes:
    """What an external CLI reads on stdin."""
    text = f"{system_prompt.strip()}\n\n{task}" if system_prompt.strip() else task
    return (text if text.endswith("\n") else text + "\n").encode("utf-8")


class ExternalCliChild(ProcessChild):
    """A one-shot command-line child: prompt on stdin, output on stdout."""

    def __init__(
        self, index: int, hooks: ChildHooks, manifest: Manifest, paths: RunPaths, env: Mapping[str, str]
    ) -> None:
        super().__init__(index, hooks)
        self.manifest = manifest
        self.env = dict(env)
        cap = manifest.limits.output_cap
        self.stdout = StreamSink(paths.output_log(index), cap, TAIL_BYTES)
        self.stderr = StreamSink(paths.stderr_log(index) if manifest.artifacts else None, cap, TAIL_BYTES)
        self.sinks = (self.stdout, self.stderr)
        self._prompt = build_prompt(manifest.agent.system_prompt, manifest.task)

    def start(self) -> None:
        spec = self.manifest.agent
        assert spec.command
        self.spawn([spec.command, *spec.args], cwd=self.manifest.cwd, env=self.env, umask=self.manifest.umask)

    def register(self, sel: selectors.BaseSelector) -> None:
        super().register(sel)
        assert self.proc and self.proc.stdout and self.proc.stderr and self.proc.stdin
        sel.register(self.proc.stdout, selectors.EVENT_READ, self._reader(self.proc.stdout, self.stdout))
        sel.register(self.proc.stderr, selectors.EVENT_READ, self._reader(self.proc.stderr, self.stderr))
        self._open_streams = 2
        stdin = PipeWriter(self.proc.stdin, sel)
        stdin.write(self._prompt)
        stdin.close()

    def _reader(self, stream: IO[bytes], sink: StreamSink) -> Callable[[int], None]:
        def on_ready(_mask: int) -> None:
            data = self.read_chunk(stream, READ_CHUNK)
            if not data:
                return
            if sink is self.stdout:
                self.progress.add_output(data)
            if sink.feed(data):
                self.hooks.event("child.output_truncated", self.index, log=str(sink.path), cap=sink.cap)
            self.hooks.output(self.index, len(data), sink.truncated)
            self.hooks.activity(self.index)

        return on_ready

    def outcome(self) -> ChildOutcome:
        rc, sig = self.exit_status()
        exit_code = 128 + sig if sig else rc
        error = None
        if rc != 0:
            tail = self.stderr.tail_text().strip()
            how = f"was killed by signal {sig}" if sig else f"exited with code {rc}"
            error = f"External CLI {how}" + (f": {tail[-4000:]}" if tail else "")
        return ChildOutcome(
            exit_code=exit_code,
            process_exit=exit_code,
            signal=sig,
            output=self.stdout.tail_text(),
            error=error,
        )


def child_env(base: Mapping[str, str], manifest: Manifest, run_dir: Path) -> dict[str, str]:
    """The caller's environment plus the run markers every child carries (its run, its run
    directory, its tree and depth: :mod:`pisub.store.lineage`)."""
    env = {k: v for k, v in base.items() if k != ENV_RUNNER}
    env.update(markers(manifest.run_id, manifest.root_run_id, manifest.depth, manifest.max_depth))
    env[ENV_RUN_DIR] = str(run_dir)
    return env
