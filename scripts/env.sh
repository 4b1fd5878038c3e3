# Source me after ./scripts/demo.sh:   . scripts/env.sh   (bash; idempotent)
#
#   - puts this checkout's .venv/bin (pisub) first on PATH;
#   - sets PISUB_PI_BIN to the pi that scripts/install_pi.sh installed (unless yours works);
#   - when pi has no usable model (`pi --list-models` lists none: no API key such as
#     ANTHROPIC_API_KEY, no ~/.pi/agent/auth.json or models.json), starts the scripted local model
#     server (pisub.testing.fake_model: no API key, no tokens) in the background and points
#     PI_CODING_AGENT_DIR at its pi config. A user with a real provider gets nothing started.
#
#   . scripts/env.sh --scripted   start (or reuse) the scripted model even if pi has a model
#   . scripts/env.sh --stop       stop the scripted model and undo its PI_CODING_AGENT_DIR
#
# The server's files are in ${XDG_CACHE_HOME:-~/.cache}/pisub/scripted-model (url, pid, log,
# pi-agent/). Nothing else changes. It is sourced: it never exits your shell.

_pisub_env() {
    local root py state mode="${1:-}" pi pid url models
    root="$(cd -- "$(dirname -- "${BASH_SOURCE[0]:-$0}")/.." && pwd -P)" || return 1
    py="$root/.venv/bin/python"
    state="${XDG_CACHE_HOME:-$HOME/.cache}/pisub/scripted-model"
    case "$mode" in
        "" | --scripted | --stop) ;;
        [!-]*) mode="" ;;  # sourced from a script: its own arguments are not ours
        *) printf 'env.sh: unknown option %s (give --scripted or --stop)\n' "$mode" >&2; return 2 ;;
    esac
    if [ "$mode" = --stop ]; then
        _pisub_env_stop "$state"
        return 0
    fi
    if [ ! -x "$root/.venv/bin/pisub" ]; then
        printf 'env.sh: %s/.venv has no pisub yet: run ./scripts/demo.sh first\n' "$root" >&2
        return 1
    fi
    case ":$PATH:" in
        *":$root/.venv/bin:"*) ;;
        *) export PATH="$root/.venv/bin:$PATH" ;;
    esac
    if [ -n "${PISUB_PI_BIN:-}" ] && [ -x "$PISUB_PI_BIN" ]; then
        pi="$PISUB_PI_BIN"
    else
        pi="$(ls -d "$root"/.pi-cli/[0-9]*/bin/pi 2>/dev/null | sort -V | tail -n 1)"
        if [ -z "$pi" ] || [ ! -x "$pi" ]; then
            printf 'env.sh: no pi installed in %s/.pi-cli: run ./scripts/install_pi.sh\n' "$root" >&2
            return 1
        fi
        export PISUB_PI_BIN="$pi"
    fi
    printf 'env.sh: pisub %s on PATH; PISUB_PI_BIN=%s\n' "$root/.venv/bin/pisub" "$pi"
    if [ "$mode" != --scripted ] && [ "${PI_CODING_AGENT_DIR:-}" != "$state/pi-agent" ]; then
        models="$(PI_OFFLINE=1 PI_SKIP_VERSION_CHECK=1 PI_TELEMETRY=0 "$pi" --list-models </dev/null 2>/dev/null \
            | awk 'seen && NF { n++ } /^provider[[:space:]]+model/ { seen = 1 } END { print n + 0 }')"
        if [ "${models:-0}" -gt 0 ]; then
            printf 'env.sh: pi has %s model(s) of your own (pi --list-models): no scripted model started\n' "$models"
            return 0
        fi
    fi
    pid="$(cat "$state/pid" 2>/dev/null || true)"
    url="$(cat "$state/url" 2>/dev/null || true)"
    if [ -n "$pid" ] && [ -n "$url" ] && _pisub_env_ours "$pid"; then
        printf 'env.sh: the scripted model already serves %s (pid %s)\n' "$url" "$pid"
    else
        mkdir -p "$state" || return 1
        rm -f "$state/url" "$state/pid"
        (
            setsid "$py" -m pisub.testing.fake_model --port-file "$state/url" \
                --pi-agent-dir "$state/pi-agent" --slow-delay 0.05 </dev/null >"$state/log" 2>&1 &
            echo $! >"$state/pid"
        )
        pid="$(cat "$state/pid")"
        for _ in $(seq 100); do
            [ -s "$state/url" ] && break
            sleep 0.1
        done
        url="$(cat "$state/url" 2>/dev/null || true)"
        if [ -z "$url" ]; then
            printf 'env.sh: the scripted model did not start; see %s\n' "$state/log" >&2
            return 1
        fi
        printf 'env.sh: started the scripted model (no API key, no tokens) at %s, pid %s\n' "$url" "$pid"
    fi
    export PI_CODING_AGENT_DIR="$state/pi-agent" PI_OFFLINE=1 PI_TELEMETRY=0 PI_SKIP_VERSION_CHECK=1
    case ",${NO_PROXY:-}," in
        *,127.0.0.1,*) ;;
        *) export NO_PROXY="${NO_PROXY:+$NO_PROXY,}127.0.0.1,localhost" ;;
    esac
    printf 'env.sh: PI_CODING_AGENT_DIR=%s; stop it with: . scripts/env.sh --stop\n' "$PI_CODING_AGENT_DIR"
}

_pisub_env_ours() {  # the pid is a live scripted model server
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q 'pisub.testing.fake_model'
}

_pisub_env_stop() {
    local state="$1" pid
    pid="$(cat "$state/pid" 2>/dev/null || true)"
    if [ -n "$pid" ] && _pisub_env_ours "$pid"; then
        kill "$pid" || return 1
        for _ in $(seq 50); do
            _pisub_env_ours "$pid" || break
            sleep 0.1
        done
        printf 'env.sh: stopped the scripted model (pid %s)\n' "$pid"
    else
        printf 'env.sh: no scripted model running\n'
    fi
    rm -f "$state/pid" "$state/url"
    if [ "${PI_CODING_AGENT_DIR:-}" = "$state/pi-agent" ]; then
        unset PI_CODING_AGENT_DIR PI_OFFLINE PI_TELEMETRY PI_SKIP_VERSION_CHECK
    fi
}

_pisub_env "$@"
_pisub_env_rc=$?
unset -f _pisub_env _pisub_env_ours _pisub_env_stop
return "$_pisub_env_rc" 2>/dev/null || true
