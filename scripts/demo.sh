#!/usr/bin/env bash
# The main job on a fresh machine, with no API key: install pisub (into .venv) and the
# pinned pi CLI (into .pi-cli), start a scripted OpenAI-compatible model server on
# 127.0.0.1, then run the real pi as a detached background sub-agent through pisub,
# follow its output live and say how it ended. It ends with the README's "try it yourself"
# lines, which work in a new shell from this folder (scripts/env.sh sets that shell up).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { printf '\n== %s\n' "$*"; }

say "installing pisub into .venv"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e . --config-settings editable_mode=compat
export PATH="$PWD/.venv/bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "installing the pinned pi into .pi-cli (npm's output goes to .pi-cli/*/npm-install.log)"
if ! PISUB_PI_BIN=$(bash scripts/install_pi.sh 2>"$work/install.log" | tail -n 1); then
    sed 's/^install_pi.sh: /  /' "$work/install.log" >&2
    exit 1
fi
sed 's/^install_pi.sh: /  /' "$work/install.log"
export PISUB_PI_BIN

.venv/bin/python -m pisub.testing.fake_model --port-file "$work/url" --pi-agent-dir "$work/pi-agent" \
    --slow-delay 0.05 >/dev/null &
server=$!
trap 'kill "$server" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/url" ] && break; sleep 0.1; done
[ -s "$work/url" ] || { echo "the local model server did not start" >&2; exit 1; }
export PI_CODING_AGENT_DIR="$work/pi-agent" PI_OFFLINE=1 PI_TELEMETRY=0 NO_PROXY=127.0.0.1,localhost

task="Look around first: TOOL: ls"
say "the model: a local scripted one at $(cat "$work/url") (no API key, no tokens)"
echo "  It answers a task holding 'TOOL: <command>' by calling pi's bash tool with that command,"
echo "  then says what the tool printed. With a real provider, pi's own model answers instead."
say "starting the agent 'coder' (the real pi) in the background"
echo "\$ pisub run --agent coder \"$task\""
run=$(pisub run --agent coder "$task")
echo "$run"
echo "  (the run's files: $(pisub path "$run"))"
say "its output, live"
echo "\$ pisub logs -f ${run:0:8}"
pisub logs -f "$run"
say "how it ended"
echo "\$ pisub wait ${run:0:8}"
if pisub wait "$run" >/dev/null; then ended=0; else ended=$?; fi
pisub status --json "$run" >"$work/status.json"
.venv/bin/python - "$work/status.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
step = (s.get("steps") or [{}])[0]
print(f"  {s['state']}: the agent {s['agent']} took {step.get('turnCount', 0)} turn(s) and"
      f" {step.get('toolCount', 0)} tool call(s) (pisub wait exits 0 only for a complete run)")
PY
say "try it yourself: in a new shell, from this folder ($PWD)"
sed -n '/^<!-- try-it-yourself -->$/,/^```$/p' README.md | sed -e '1,2d' -e '$d'
echo "  (scripts/env.sh starts the scripted model only when pi has no model of yours; . scripts/env.sh --stop ends it)"
exit "$ended"
