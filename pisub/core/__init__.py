"""Primitives that know nothing of runs: files, locks, polling, redaction, processes."""
