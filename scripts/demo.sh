#!/usr/bin/env bash
# The main job on a fresh machine: install pisub into .venv, start a real detached run,
# follow its output live, then print its result. No API key needed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
export PATH="$PWD/.venv/bin:$PATH"
run=$(pisub run --agent hello "Summarise the open issues of this repository, please")
echo "started run $run in $(pisub path "$run")"
pisub logs -f "$run"
echo "--- result"
pisub wait "$run"
echo "--- status"
pisub status "$run"
