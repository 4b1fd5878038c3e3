# Source me after ./scripts/demo.sh:   . scripts/env.sh   (bash or zsh; idempotent)
#
#   - puts this checkout's .venv/bin (pisub) first on PATH;
#   - sets PISUB_PI_BIN to the pi that scripts/install_pi.sh installed (unless yours works);
#   - when pi has no usable model (`pi --list-models`, at most 10 s, lists none: no API key such
#     as ANTHROPIC_API_KEY, no ~/.pi/agent/auth.json or models.json), starts the scripted local
#     model server (pisub.testing.fake_model: no API key, no tokens) in the background and sets
#     PI_CODING_AGENT_DIR (its pi config), PI_OFFLINE=1, PI_TELEMETRY=0, PI_SKIP_VERSION_CHECK=1
#     and adds 127.0.0.1,localhost to NO_PROXY. A user with a real provider gets nothing started.
#
#   . scripts/env.sh --scripted   start (or reuse) the scripted model even if pi has a model
#   . scripts/env.sh --stop       stop the scripted model and give those five variables back the
#                                 values they had before (unset if they were unset)
#   . scripts/env.sh --start      what no option does (from a script: see below)
#
# The server's files are in ${XDG_CACHE_HOME:-~/.cache}/pisub/scripted-model (a 0700 directory:
# url, pid, log, pi-agent/). --stop ends a process only if the pid file there is a regular file of
# yours and the process is yours, runs exactly that server with that directory and listens on
# the port its url file names. PATH and PISUB_PI_BIN stay; PISUB_ENV_RESTORE holds the values
# --stop gives back. Nothing else changes.
#
# It is sourced: it never exits your shell (under `set -e` a problem is printed and the script
# returns 0; otherwise it returns 1, or 2 for an unknown option). Arguments: only those given to
# the `.` command itself are read. In bash a script's own arguments never reach env.sh; in zsh a
# bare `. scripts/env.sh` in a script sees the script's arguments (zsh cannot tell them apart),
# so scripts should give an option: `. scripts/env.sh --start`.

if [ -z "${BASH_VERSION:-}" ] && [ -z "${ZSH_VERSION:-}" ]; then
    echo "env.sh: source me from bash or zsh (this shell is neither): bash, then . scripts/env.sh" >&2
    return 0 2>/dev/null || exit 2
fi

if [ -n "${ZSH_VERSION:-}" ]; then
    eval '_pisub_env_src=${(%):-%x}'  # the file being sourced (zsh)
    _pisub_env_mine=1
else
    _pisub_env_src="${BASH_SOURCE[0]}"
    # bash records a `.` without arguments as BASH_ARGV[0] = the file (the caller's positional
    # parameters are then visible here, and are not ours)
    _pisub_env_mine=1
    if [ "${BASH_ARGC[0]-}" = 1 ] && [ "${BASH_ARGV[0]-}" = "$_pisub_env_src" ]; then
        _pisub_env_mine=""
    fi
fi

_pisub_env() {  # $1: this file; $2: 1 when $3… are the `.` command's own arguments
    [ -z "${ZSH_VERSION:-}" ] || emulate -L sh
    local src="$1" root="" py="" state="" mode="" pi="" pid="" url="" models="" i=""
    [ "$2" != 1 ] || mode="${3:-}"
    root="$(CDPATH='' cd -- "$(dirname -- "$src")/.." && pwd -P)" || return 1
    py="$root/.venv/bin/python"
    state="${XDG_CACHE_HOME:-$HOME/.cache}/pisub/scripted-model"
    case "$mode" in
        "" | --start | --scripted | --stop) ;;
        [!-]*) mode="" ;;  # a word, not an option: not ours
        *) printf 'env.sh: unknown option %s (give --start, --scripted or --stop)\n' "$mode" >&2; return 2 ;;
    esac
    if [ "$mode" = --stop ]; then
        _pisub_env_stop "$state" "$py"
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
        for i in "$root"/.pi-cli/[0-9]*/bin/pi; do  # the newest version
            [ -x "$i" ] && { [ -z "$pi" ] || [ "$(printf '%s\n%s\n' "$pi" "$i" | sort -V | tail -n 1)" = "$i" ]; } \
                && pi="$i"
        done
        if [ -z "$pi" ]; then
            printf 'env.sh: no pi installed in %s/.pi-cli: run ./scripts/install_pi.sh\n' "$root" >&2
            return 1
        fi
        export PISUB_PI_BIN="$pi"
    fi
    printf 'env.sh: pisub %s on PATH; PISUB_PI_BIN=%s\n' "$root/.venv/bin/pisub" "$pi"
    if [ "$mode" != --scripted ] && [ "${PI_CODING_AGENT_DIR:-}" != "$state/pi-agent" ]; then
        models="$(_pisub_env_models "$pi")"
        if [ "$models" = timeout ]; then
            printf 'env.sh: %s --list-models did not answer in 10 s: cannot tell whether pi has a model; starting the scripted one\n' "$pi" >&2
        elif [ "${models:-0}" -gt 0 ]; then
            printf 'env.sh: pi has %s model(s) of your own (pi --list-models): no scripted model started\n' "$models"
            return 0
        fi
    fi
    _pisub_env_dir "$state" || return 1
    pid="$(_pisub_env_pid "$state" "$py")"
    url="$( { cat -- "$state/url"; } 2>/dev/null || true)"
    if [ -n "$pid" ] && [ -n "$url" ]; then
        printf 'env.sh: the scripted model already serves %s (pid %s)\n' "$url" "$pid"
    else
        rm -f -- "$state/url" "$state/pid"
        (
            setsid "$py" -m pisub.testing.fake_model --port-file "$state/url" \
                --pi-agent-dir "$state/pi-agent" --slow-delay 0.05 </dev/null >"$state/log" 2>&1 &
            echo $! >"$state/pid"
        )
        pid="$(cat -- "$state/pid")"
        for i in $(seq 100); do
            [ -s "$state/url" ] && break
            sleep 0.1
        done
        url="$( { cat -- "$state/url"; } 2>/dev/null || true)"
        if [ -z "$url" ]; then
            printf 'env.sh: the scripted model did not start; see %s\n' "$state/log" >&2
            return 1
        fi
        printf 'env.sh: started the scripted model (no API key, no tokens) at %s, pid %s\n' "$url" "$pid"
    fi
    if [ -z "${PISUB_ENV_RESTORE+x}" ]; then  # the user's values, once (sourcing again keeps them)
        PISUB_ENV_RESTORE="$(_pisub_env_saved)"
    fi
    export PI_CODING_AGENT_DIR="$state/pi-agent" PI_OFFLINE=1 PI_TELEMETRY=0 PI_SKIP_VERSION_CHECK=1
    case ",${NO_PROXY:-}," in
        *,127.0.0.1,*) ;;
        *) export NO_PROXY="${NO_PROXY:+$NO_PROXY,}127.0.0.1,localhost" ;;
    esac
    printf "env.sh: PI_CODING_AGENT_DIR=%s; stop it with: . '%s' --stop\n" "$PI_CODING_AGENT_DIR" \
        "$(printf '%s' "$root/scripts/env.sh" | sed "s/'/'\\\\''/g")"
}

_pisub_env_models() {  # how many models `pi --list-models` lists (at most 10 s), or "timeout"
    [ -z "${ZSH_VERSION:-}" ] || emulate -L sh
    local pi="$1" out="" rc=0 limit=""
    out="$(mktemp)" || { echo 0; return 0; }
    # into a file, not a pipe: a process pi leaves behind cannot hold the shell
    ! command -v timeout >/dev/null 2>&1 || limit="timeout -k 2 10"
    PI_OFFLINE=1 PI_SKIP_VERSION_CHECK=1 PI_TELEMETRY=0 $limit "$pi" --list-models </dev/null >"$out" 2>/dev/null \
        || rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo timeout
    else
        awk 'seen && NF { n++ } /^provider[[:space:]]+model/ { seen = 1 } END { print n + 0 }' "$out"
    fi
    rm -f -- "$out"
}

_pisub_env_dir() {  # the state directory: a real directory of the user's, mode 0700
    [ -z "${ZSH_VERSION:-}" ] || emulate -L sh
    local state="$1"
    mkdir -p -- "$state" 2>/dev/null
    if [ -L "$state" ] || [ ! -d "$state" ] || [ ! -O "$state" ]; then
        printf 'env.sh: %s is not a directory of yours; remove it\n' "$state" >&2
        return 1
    fi
    chmod 700 -- "$state"
}

_pisub_env_pid() {  # the pid of this user's scripted model serving $1, or nothing
    [ -z "${ZSH_VERSION:-}" ] || emulate -L sh
    local state="$1" py="$2" pid="" want="" have=""
    [ ! -L "$state" ] && [ -d "$state" ] && [ -O "$state" ] || return 0
    case "$(ls -ld -- "$state" 2>/dev/null)" in drwx------*) ;; *) return 0 ;; esac
    [ ! -L "$state/pid" ] && [ -f "$state/pid" ] && [ -O "$state/pid" ] || return 0
    pid="$( { cat -- "$state/pid"; } 2>/dev/null || true)"
    case "$pid" in "" | *[!0-9]*) return 0 ;; esac
    [ -O "/proc/$pid" ] || return 0
    want="$(printf '%s\n' "$py" -m pisub.testing.fake_model --port-file "$state/url" \
        --pi-agent-dir "$state/pi-agent" --slow-delay 0.05)"
    have="$( { tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null || true)"
    [ "$have" = "$want" ] && _pisub_env_listens "$pid" "$state/url" && echo "$pid"
    return 0
}

_pisub_env_listens() {  # process $1 listens on the port its url file $2 names
    [ -z "${ZSH_VERSION:-}" ] || emulate -L sh
    local pid="$1" url="" port="" sockets=""
    url="$( { cat -- "$2"; } 2>/dev/null || true)"
    port="${url##*:}"
    port="${port%%/*}"
    case "$port" in "" | *[!0-9]*) return 1 ;; esac
    sockets="$(ls -l "/proc/$pid/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p')"
    [ -n "$sockets" ] || return 1
    printf '%s\n' "$sockets" | awk -v port="$(printf ':%04X' "$port")" '
        NR == FNR { mine[$1] = 1; next }
        substr($2, length($2) - 4) == port && $4 == "0A" && ($10 in mine) { found = 1 }
        END { exit !found }' - "/proc/$pid/net/tcp" "/proc/$pid/net/tcp6" 2>/dev/null
}

_pisub_env_saved() {  # shell code that gives the variables env.sh sets their current values back
    [ -z "${ZSH_VERSION:-}" ] || emulate -L sh
    local name="" value=""
    for name in PI_CODING_AGENT_DIR PI_OFFLINE PI_TELEMETRY PI_SKIP_VERSION_CHECK NO_PROXY; do
        if eval "[ -n \"\${$name+x}\" ]"; then
            eval "value=\"\$$name\""
            printf "export %s='%s'; " "$name" "$(printf '%s' "$value" | sed "s/'/'\\\\''/g")"
        else
            printf 'unset %s; ' "$name"
        fi
    done
}

_pisub_env_stop() {
    [ -z "${ZSH_VERSION:-}" ] || emulate -L sh
    local state="$1" py="$2" pid="" i=""
    pid="$(_pisub_env_pid "$state" "$py")"
    if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
        for i in $(seq 50); do
            [ -n "$(_pisub_env_pid "$state" "$py")" ] || break
            sleep 0.1
        done
        printf 'env.sh: stopped the scripted model (pid %s)\n' "$pid"
        rm -f -- "$state/pid" "$state/url"
    else
        printf 'env.sh: no scripted model running\n'
    fi
    if [ -n "${PISUB_ENV_RESTORE+x}" ]; then
        eval "$PISUB_ENV_RESTORE"
        unset PISUB_ENV_RESTORE
    fi
}

_pisub_env_rc=0
_pisub_env "$_pisub_env_src" "$_pisub_env_mine" "$@" || _pisub_env_rc=$?
unset -f _pisub_env _pisub_env_models _pisub_env_dir _pisub_env_pid _pisub_env_listens _pisub_env_saved \
    _pisub_env_stop
unset _pisub_env_src _pisub_env_mine
case "$-:$_pisub_env_rc" in
    *e*:* | *:0) unset _pisub_env_rc; return 0 ;;  # under set -e: the message is printed, the shell goes on
esac
eval "unset _pisub_env_rc; return $_pisub_env_rc"
