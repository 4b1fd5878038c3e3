"""Workflow runs: one detached coordinator that starts many child runs (see ``spec/protocol.md``,
Workflow runs)."""
