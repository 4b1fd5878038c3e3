#!/usr/bin/env bash
# The main job on a fresh machine, with no API key: install pisub (into .venv) and the
# pinned pi CLI (into .pi-cli), start a scripted OpenAI-compatible model server on
# 127.0.0.1, then run the real pi as a detached background sub-agent through pisub,
# follow its output live and print its result.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e . --config-settings editable_mode=compat
export PATH="$PWD/.venv/bin:$PATH"
PISUB_PI_BIN=$(bash scripts/install_pi.sh | tail -n 1)
export PISUB_PI_BIN

work=$(mktemp -d)
.venv/bin/python -m pisub.testing.fake_model --port-file "$work/url" --pi-agent-dir "$work/pi-agent" \
    --slow-delay 0.05 >/dev/null &
server=$!
trap 'kill "$server" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/url" ] && break; sleep 0.1; done
[ -s "$work/url" ] || { echo "the local model server did not start" >&2; exit 1; }
export PI_CODING_AGENT_DIR="$work/pi-agent" PI_OFFLINE=1 PI_TELEMETRY=0 NO_PROXY=127.0.0.1,localhost

run=$(pisub run --agent coder "Look around first: TOOL: ls -la")
echo "started run $run in $(pisub path "$run")"
pisub logs -f "$run"
echo "--- result"
pisub wait "$run"
echo "--- status"
pisub status "$run"
