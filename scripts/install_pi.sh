#!/usr/bin/env bash
# Install the pinned pi coding agent CLI into the project-local folder .pi-cli/.
#
# Usage: scripts/install_pi.sh
#
# Idempotent: does nothing when .pi-cli/node_modules/.bin/pi already reports the
# pinned version. The last line printed on stdout is the absolute path of the pi
# binary, so callers can do: PI="$(scripts/install_pi.sh | tail -n 1)".
# All diagnostics go to stderr.
set -euo pipefail

PI_PACKAGE="@mariozechner/pi-coding-agent"
PI_VERSION="0.73.1"
NODE_MIN_MAJOR=20
NODE_MIN_MINOR=6

die() {
    printf 'install_pi.sh: error: %s\n' "$*" >&2
    exit 1
}

note() {
    printf 'install_pi.sh: %s\n' "$*" >&2
}

script_path="${BASH_SOURCE[0]:-$0}"
case "$script_path" in
    */*) script_dir="${script_path%/*}" ;;
    *) script_dir="." ;;
esac
script_dir="$(cd -- "$script_dir" && pwd -P)"
project_dir="$(cd -- "$script_dir/.." && pwd -P)"
install_dir="$project_dir/.pi-cli"
pi_bin="$install_dir/node_modules/.bin/pi"

command -v node >/dev/null 2>&1 \
    || die "node not found on PATH; install Node.js >= ${NODE_MIN_MAJOR}.${NODE_MIN_MINOR} (https://nodejs.org/)"
command -v npm >/dev/null 2>&1 \
    || die "npm not found on PATH; install npm (it ships with Node.js >= ${NODE_MIN_MAJOR}.${NODE_MIN_MINOR})"

node_version="$(node --version 2>/dev/null || true)"   # e.g. v20.20.2
node_version="${node_version#v}"
node_major="${node_version%%.*}"
node_rest="${node_version#*.}"
node_minor="${node_rest%%.*}"
case "$node_major$node_minor" in
    '' | *[!0-9]*) die "cannot parse the Node.js version '${node_version}'" ;;
esac
if [ "$node_major" -lt "$NODE_MIN_MAJOR" ] \
    || { [ "$node_major" -eq "$NODE_MIN_MAJOR" ] && [ "$node_minor" -lt "$NODE_MIN_MINOR" ]; }; then
    die "Node.js ${node_version} is too old; ${PI_PACKAGE}@${PI_VERSION} needs Node.js >= ${NODE_MIN_MAJOR}.${NODE_MIN_MINOR}"
fi

installed_version() {
    if [ -x "$pi_bin" ]; then
        # pi 0.73.1 prints its version on stderr, not stdout.
        "$pi_bin" --version </dev/null 2>&1 | tail -n 1 | tr -d '[:space:]' || true
    fi
}

if [ "$(installed_version)" = "$PI_VERSION" ]; then
    note "${PI_PACKAGE}@${PI_VERSION} already installed in ${install_dir}"
else
    note "installing ${PI_PACKAGE}@${PI_VERSION} into ${install_dir} (node ${node_version})"
    mkdir -p "$install_dir"
    # npm's own progress output goes to stderr so that stdout stays clean.
    npm install --prefix "$install_dir" --no-audit --no-fund "${PI_PACKAGE}@${PI_VERSION}" 1>&2 \
        || die "npm install of ${PI_PACKAGE}@${PI_VERSION} failed"
    got="$(installed_version)"
    [ "$got" = "$PI_VERSION" ] \
        || die "after install, '${pi_bin} --version' printed '${got}', expected '${PI_VERSION}'"
    note "installed ${PI_PACKAGE}@${PI_VERSION}"
fi

printf '%s\n' "$pi_bin"
