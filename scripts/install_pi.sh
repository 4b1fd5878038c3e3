#!/usr/bin/env bash
# Install pinned pi coding agent CLIs into the project folder .pi-cli/ (nothing else changes).
#
# Usage: scripts/install_pi.sh [VERSION ...|all]
#
# Without arguments it installs the default pin (the first of scripts/pi-pins.sh); `all`
# installs every pin. Each version goes to .pi-cli/<version>/, with a launcher
# .pi-cli/<version>/bin/pi that runs it with a Node new enough for it: the system's when it is
# >= NODE_MIN, else a Node from the npm registry installed once into .pi-cli/node.
# Idempotent; several versions install side by side. The last line(s) on stdout are the
# absolute paths of the launchers, one per version in the order asked, so callers can do:
# PISUB_PI_BIN="$(scripts/install_pi.sh | tail -n 1)".
# All diagnostics go to stderr.
set -euo pipefail

die() { printf 'install_pi.sh: error: %s\n' "$*" >&2; exit 1; }
note() { printf 'install_pi.sh: %s\n' "$*" >&2; }

project_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]:-$0}")/.." && pwd -P)"
# shellcheck source=scripts/pi-pins.sh
. "$project_dir/scripts/pi-pins.sh"
install_root="$project_dir/.pi-cli"

command -v npm >/dev/null 2>&1 || die "npm not found on PATH; install Node.js and npm (https://nodejs.org/)"

# npm's output (EBADENGINE warnings when npm itself runs on an older Node than pi needs, notices,
# install-script warnings) goes to a log; it is shown only when npm fails.
quiet_npm() {  # quiet_npm LOG ARGS...
    local log="$1"
    shift
    mkdir -p "$(dirname -- "$log")"
    if npm --no-update-notifier "$@" >"$log" 2>&1; then
        return 0
    fi
    note "npm $1 failed; its output ($log):"
    tail -n 60 "$log" >&2
    return 1
}

version_ge() {  # version_ge A B: A >= B (dotted numbers)
    [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]
}

node_for_pi() {
    local system
    system="$(node --version 2>/dev/null || true)"
    system="${system#v}"
    if [ -n "$system" ] && version_ge "$system" "$NODE_MIN"; then
        readlink -f "$(command -v node)"  # resolved: launchers compare it
        return
    fi
    local dir="$install_root/node" bin
    bin="$dir/node_modules/${NODE_PIN%@*}/bin/node"
    if [ ! -x "$bin" ] || [ "$("$bin" --version 2>/dev/null)" != "v${NODE_PIN##*@}" ]; then
        note "system Node is ${system:-missing}; pi needs >= $NODE_MIN: installing $NODE_PIN into $dir (for pi alone; nothing else changes)"
        mkdir -p "$dir"
        quiet_npm "$dir/npm-install.log" install --prefix "$dir" --no-audit --no-fund --no-save "$NODE_PIN" \
            || die "npm install of $NODE_PIN failed"
        [ -x "$bin" ] || die "$NODE_PIN did not provide $bin"
    fi
    readlink -f "$bin"
}

install_one() {  # install_one PACKAGE@VERSION NODE
    local pin="$1" node="$2" package version dir launcher cli got
    package="${pin%@*}"
    version="${pin##*@}"
    dir="$install_root/$version"
    launcher="$dir/bin/pi"
    if [ -x "$launcher" ] && got="$("$launcher" --version </dev/null 2>&1 | tail -n 1 | tr -d '[:space:]')" \
        && [ "$got" = "$version" ] && grep -qF "$node" "$launcher"; then
        note "$pin already installed in $dir"
    else
        note "installing $pin into $dir"
        mkdir -p "$dir/bin"
        quiet_npm "$dir/npm-install.log" install --prefix "$dir" --no-audit --no-fund --no-save \
            --engine-strict=false "$pin" || die "npm install of $pin failed"
        cli="$(readlink -f "$dir/node_modules/.bin/pi")" || die "$pin has no pi binary"
        # The package's bin says `#!/usr/bin/env node`: the launcher names the Node to use.
        printf '#!/bin/sh\n# pi %s (%s), run by the Node pisub installed or found for it.\nexec %q %q "$@"\n' \
            "$version" "$package" "$node" "$cli" >"$launcher.tmp"
        chmod 755 "$launcher.tmp"
        mv "$launcher.tmp" "$launcher"
        got="$("$launcher" --version </dev/null 2>&1 | tail -n 1 | tr -d '[:space:]')"
        [ "$got" = "$version" ] || die "after install, '$launcher --version' printed '$got', expected '$version'"
        note "installed $pin"
    fi
    printf '%s\n' "$launcher"
}

usage() {
    printf 'usage: scripts/install_pi.sh [VERSION ...|all]   (pinned: %s; default %s)\n' \
        "${PI_PINS[*]##*@}" "${PI_PINS[0]##*@}" >&2
}
case " $* " in
    *" -h "* | *" --help "*) usage; exit 0 ;;
esac
wanted=("$@")
[ "${#wanted[@]}" -gt 0 ] || wanted=("${PI_PINS[0]##*@}")
if [ "${wanted[0]}" = all ]; then
    [ "${#wanted[@]}" -eq 1 ] || { usage; die "'all' stands alone"; }
    wanted=("${PI_PINS[@]##*@}")
fi
# Every argument is checked before anything is installed.
pins=()
for want in "${wanted[@]}"; do
    pin=
    for candidate in "${PI_PINS[@]}"; do
        [ "${candidate##*@}" != "$want" ] || pin="$candidate"
    done
    [ -n "$pin" ] || { usage; die "pi '$want' is not pinned in scripts/pi-pins.sh"; }
    pins+=("$pin")
done
node="$(node_for_pi)"
# The versions side by side (npm mostly waits on the network); the launchers printed in order.
outs=() pids=()
for pin in "${pins[@]}"; do
    outs+=("$(mktemp)")
    install_one "$pin" "$node" >"${outs[-1]}" &
    pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed=1
done
for out in "${outs[@]}"; do
    cat "$out"
    rm -f "$out"
done
[ "$failed" -eq 0 ] || die "installing ${wanted[*]} failed (see above)"
