"""The real pi against the scripted model (issue 25): its reply is in the transcript and in
``logs -f`` while the model streams it (audit #111), and a steer to a pi child of a workflow
that has not started yet is ``scheduled``, then delivered when it starts (#126)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

import pisub
from pisub.api.client import launch_workflow
from pisub.testing.fake_model import FakeModelServer
from tests.conftest import pisub_cli, wait_for
from tests.helpers import first_and_later, run_receipts, sent_with

pytestmark = pytest.mark.pi

SAID = "Hello from the fake LLM. You said: "


def _transcript(run: pisub.Run) -> list[str]:
    proc = pisub_cli("status", run.id, "--view", "transcript", "--json", check=True)
    return list(json.loads(proc.stdout)["lines"])


class _Follow:
    """``pisub logs RUN -f`` in a subprocess, what it printed gathered as it comes."""

    def __init__(self, run: pisub.Run) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pisub", "logs", run.id, "-f"], stdout=subprocess.PIPE
        )
        self.text = ""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 4096):
            self.text += chunk.decode("utf-8", "replace")

    def close(self, timeout: float = 30) -> str:
        self.proc.wait(timeout=timeout)
        self.thread.join(timeout=timeout)
        assert not self.thread.is_alive(), "logs -f's output did not end"
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return self.text


@pytest.mark.pi_versions
def test_a_pi_reply_is_in_the_transcript_and_logs_while_the_model_streams_it(pi_home: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    run = pisub.launch("pi", f"SLOW:120 story {tag}")  # 120 chunks, 0.1 s apart: 12 s
    follow = _Follow(run)
    try:
        first = "Slow chunk 1 of 120."
        lines = wait_for(
            lambda: (found := _transcript(run)) and first in "".join(found) and found,
            30,
            what="the first words in the transcript",
        )
        text = "".join(lines)
        assert run.status().state == "running"
        assert "Slow chunk 120 of 120." not in text  # the message has not ended
        wait_for(lambda: first in follow.text, 30, what="logs -f to show the first words")
        assert "Slow chunk 120 of 120." not in follow.text
        assert run.status().state == "running"
    finally:
        result = run.wait(timeout=120)
        shown = follow.close()
    assert result.state == "complete", result.content[0].text
    whole = "".join(f"Slow chunk {i} of 120. " for i in range(1, 121))
    assert result.details.results[0].output == whole
    assert (run.dir / "output-0.log").read_text() == whole + "\n"  # streamed, never written twice
    assert shown == whole + "\n"
    assert _transcript(run) == [whole]
    assert [whole.startswith(line) for line in run.status().steps[0].recent_output] == [True]  # cut


def test_a_streamed_reply_and_its_tool_calls_keep_their_lines(pi_home: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    run = pisub.launch("pi", f"please run TOOL: echo {tag}")
    assert run.wait(timeout=60).state == "complete"
    log = (run.dir / "output-0.log").read_text()
    assert log == f"Running a command.\ntool: bash echo {tag}\nTool said: {tag}\n"


@pytest.mark.pi_versions
def test_a_steer_to_a_queued_pi_child_is_scheduled_then_delivered_when_it_starts(
    pi_home: Path, model_server: FakeModelServer, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    script = first_and_later(tmp_path, "pi", f"SLOW:120 first {tag}", f"SLOW:10 later {tag}")
    run = launch_workflow(script, concurrency=1)
    wait_for(
        lambda: [str(s.status) for s in run.status().steps] == ["running", "queued"], 60, what="later queued"
    )
    proc = pisub_cli("steer", run.id, "--child", "later", f"STEER {tag}", "--json")
    receipt = json.loads(proc.stdout)
    assert proc.returncode == 0 and receipt["state"] == "scheduled", proc.stdout + proc.stderr
    result = run.wait(timeout=180)
    assert result.state == "complete", result.content[0].text
    final = run_receipts(run)[receipt["requestId"]]
    assert (final["state"], final["deliveryStatus"]) == ("delivered", "delivered"), final
    assert final["targets"][0]["deliveredAt"]
    assert json.loads(result.content[0].text)[1][3] == f"{SAID}STEER {tag}"
    assert sent_with(model_server, f"STEER {tag}")
