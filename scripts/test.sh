#!/usr/bin/env bash
# Install pisub with its development tools into .venv, then lint, type-check and test.
# Extra arguments go to pytest (e.g. scripts/test.sh --stress, scripts/test.sh -k crash).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' --config-settings editable_mode=compat
echo "== pi CLI (pinned, into .pi-cli/)"
PISUB_PI_BIN=$(bash scripts/install_pi.sh | tail -n 1)
export PISUB_PI_BIN
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check pisub tests scripts --exclude pisub/testing --exclude scripts/record_pi_fixtures.py
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
.venv/bin/python -m pytest -q "$@"
