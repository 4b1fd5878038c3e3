#!/usr/bin/env bash
# Install pisub with its development tools into .venv, then lint, type-check and test.
# Extra arguments go to every pytest pass (e.g. scripts/test.sh --stress, scripts/test.sh -k crash;
# -m is the script's own: it selects the passes).
#
# The installs (pip, apt, both pis, the unprivileged copy) run side by side. Then the tests, in
# passes selected by marker (pyproject.toml says what each marker means):
#
#   main       everything but `serial` (and, as root, but `root`), on PISUB_TEST_WORKERS xdist
#              workers (default 4: the tests mostly wait on child processes) — as root, as the
#              unprivileged user pisub-ci (created if missing) from a copy of the project in a
#              world-traversable temp dir, since root's CAP_FOWNER, CAP_DAC_OVERRIDE and
#              protected_hardlinks exemption hide real failures;
#   root       (as root) the `root` tests: mounts, chown to other users, driving pisub as pisub-ci
#              through tests/nonroot.py (PISUB_NONROOT_PYTHON / _USER / _TMPDIR are set for it);
#   pi X       the `pi_versions` tests against every other selected pi version;
#   idle       the `idle` tests (they wait on a clock: the cron daemon's minute, a pisub
#              deadline), without xdist, as the main pass's user: none holds a worker while it waits;
#   serial     the `serial` tests, alone, without xdist (then, as root, the `root` ones among
#              them, e.g. those stepping the wall clock, once the Slurm cluster is stopped).
#
# The first four run at the same time, with ruff and mypy --strict; their output is printed
# as each ends. Every pass prints its 15 slowest tests; the end prints the slowest overall, and
# PISUB_DURATIONS=FILE writes every test's duration to FILE (tests/durations.txt is one such
# record: tests/conftest.py reads it to start the slowest tests first on every xdist worker, so a
# long one never starts late and sets the main pass's tail; regenerate it when tests are added
# or sped up). The exit code is non-zero when any step fails.
#
# pi: every pinned version (scripts/pi-pins.sh) is installed; the suite runs against the default
# pin. PISUB_PI_VERSIONS=default (the fast path) runs the default only; PISUB_PI_VERSIONS="1.6.0
# 0.85.1" picks versions. PISUB_NONROOT=0 (as root) runs everything as root. PISUB_SLURM=0 skips
# the one-node Slurm cluster (the Slurm tests then skip). PISUB_TEST_WORKERS=0 runs without xdist.
set -euo pipefail
usage() {
    cat <<'EOF'
usage: scripts/test.sh [PYTEST ARGS...]     (this help: scripts/test.sh --help; it installs nothing)

Installs pisub with its dev tools into .venv and every pinned pi into .pi-cli (npm; an older
Node is supplemented there), then runs ruff (pisub tests scripts), mypy --strict and the tests in
passes: main (xdist), root, each other pi version, idle, serial. Extra arguments go to every pytest
pass (e.g. -k crash, --stress, --nfs); -m is the script's own.

As root it also changes the system:
  - apt-get installs what is missing of tmux, bindfs, zsh and cron (and, for the Slurm tests,
    slurm-wlm, slurmctld, slurmd, slurm-client, munge);
  - starts the cron daemon (Debian's cron) when none runs, for the tests where cron alone fires
    a schedule, and stops it at the end (one already running is left as it is);
  - adds the system user pisub-ci (useradd, no home) and runs most tests as that user from a
    copy of the project in /tmp/pisub-nonroot.*;
  - starts a one-node Slurm cluster (scripts/slurm-up.sh) and stops it before the serial pass.
As an ordinary user it changes nothing outside the checkout (root-only tests skip).

Environment:
  PISUB_NONROOT=0        as root: run everything as root (no pisub-ci user, no copy)
  PISUB_SLURM=0          no Slurm packages or cluster (the Slurm tests skip)
  PISUB_PI_VERSIONS=default | "1.6.0 0.85.1"   which pinned pis to test (default: all)
  PISUB_TEST_WORKERS=N   xdist workers of the main pass (default 4; 0: no xdist)
  PISUB_DURATIONS=FILE   write every test's duration to FILE
  PYTHON=python3.X       the Python that makes .venv

How long: the full run (as root, every pin, Slurm) takes about 10 minutes on 2 idle cores (CI:
9-10), more on a loaded machine, plus the installs the first time; --nfs adds ~6 minutes.
EOF
}
case " $* " in
    *" -h "* | *" --help "*) usage; exit 0 ;;
esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORKERS=${PISUB_TEST_WORKERS:-4}
NONROOT_USER=pisub-ci
is_root=
[ "$(id -u)" -ne 0 ] || is_root=1
use_nonroot=
[ -z "$is_root" ] || [ "${PISUB_NONROOT:-1}" = 0 ] || use_nonroot=1
use_slurm=
[ -z "$is_root" ] || [ "${PISUB_SLURM:-1}" = 0 ] || use_slurm=1

logs=$(mktemp -d /tmp/pisub-test.XXXXXX)
declare -A step_pid=() step_started=()
nonroot_dir=
slurm_started=
nonroot_cleanup() {
    [ -n "$nonroot_dir" ] || return 0
    # Processes left by an aborted run (detached runners and their children) name the dir.
    local proc
    for proc in /proc/[0-9]*; do
        [ "${proc#/proc/}" != "$$" ] || continue
        if grep -qsF -- "$nonroot_dir" "$proc/environ" "$proc/cmdline"; then
            kill -KILL "${proc#/proc/}" 2>/dev/null || true
        fi
    done
    # Its crontab: entries an aborted run's tests left (the user is the tests' own).
    crontab -r -u "$NONROOT_USER" >/dev/null 2>&1 || true
    rm -rf -- "$nonroot_dir"
}
slurm_cleanup() {
    [ -z "$slurm_started" ] || bash scripts/slurm-down.sh >/dev/null 2>&1 || true
    slurm_started=
}
cleanup() {
    # Background steps of an aborted run first (each leads its own process group).
    local pid
    for pid in "${!step_pid[@]}"; do kill -TERM -- "-${step_pid[$pid]}" 2>/dev/null || true; done
    nonroot_cleanup
    slurm_cleanup
    cron_cleanup
    rm -rf -- "$logs"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Steps in the background: `start NAME CMD...` runs CMD (its own process group) with its output
# in $logs/NAME.log; `finish NAME` waits for it, prints its output and time, returns its code.
start() {
    local name=$1
    shift
    step_started[$name]=$SECONDS
    set -m
    (
        # (not `"$@" || ...`: that would turn set -e off inside it)
        # Its exit code too: bash may forget a background job that ended long before the
        # `wait` for it once the pids wrap ("pid N is not a child of this shell", 127).
        trap 'echo "$SECONDS $?" >"$logs/$name.ended"' EXIT
        "$@"
    ) >"$logs/$name.log" 2>&1 &
    step_pid[$name]=$!
    set +m
}
finish() {
    local name=$1 rc=0 ended=$SECONDS code pid
    pid=${step_pid[$name]}
    wait "$pid" 2>/dev/null || rc=$?
    while [ ! -s "$logs/$name.ended" ] && kill -0 "$pid" 2>/dev/null; do sleep 1; done
    unset "step_pid[$name]"
    if [ -s "$logs/$name.ended" ]; then
        read -r ended code <"$logs/$name.ended"
        rc=${code:-$rc}
    fi
    echo "== $name ($((ended - step_started[$name])) s, exit $rc)"
    cat "$logs/$name.log"
    return "$rc"
}

# --- installs, side by side -----------------------------------------------------------------
install_venv() {
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' \
        --config-settings editable_mode=compat
    # An editable install compiles nothing, and with PYTHONDONTWRITEBYTECODE set every process
    # the tests start (thousands of CLIs and runners) would compile pisub again: ~0.1 CPU-s each.
    .venv/bin/python -m compileall -q pisub tests scripts
}
# tmux drives `pisub top` in its tests, bindfs gives test_split_brain.py its second mount of
# the home, zsh sources scripts/env.sh in test_readme_try.py, cron ticks schedules in
# test_schedule_timer.py, slurm-wlm and munge the one-node cluster: one apt-get (dpkg takes one at a time).
install_packages() {
    local want=()
    command -v tmux >/dev/null 2>&1 || want+=(tmux)
    command -v bindfs >/dev/null 2>&1 || want+=(bindfs)
    command -v zsh >/dev/null 2>&1 || want+=(zsh)
    { command -v cron && command -v crontab; } >/dev/null 2>&1 || want+=(cron)
    if [ -n "$use_slurm" ] && ! { command -v slurmctld && command -v slurmd && command -v munged; } >/dev/null 2>&1; then
        want+=(slurm-wlm slurmctld slurmd slurm-client munge)
    fi
    [ "${#want[@]}" -gt 0 ] || return 0
    command -v apt-get >/dev/null 2>&1 || { echo "   no apt-get to install ${want[*]}"; return 0; }
    echo "apt-get install ${want[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 \
            && apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null 2>&1; } \
        || echo "   could not install ${want[*]}: the tests that need them skip (or fail under CI)"
}
packages_and_slurm() {
    install_packages
    cron_up
    if [ -n "$use_slurm" ]; then
        # The Slurm tests place runs on a one-node cluster started here and stopped before the
        # serial pass (left as it was when one was already up).
        bash scripts/slurm-up.sh
    fi
}
# The cron daemon that fires schedules in the tests (pisub schedule install writes a crontab line;
# nothing else ticks): started when none runs — $logs/cron-started records it for the cleanup,
# since this runs in a background step — and the tests then require it (PISUB_REQUIRE_CRON=1).
cron_running() {
    pgrep -x cron >/dev/null 2>&1 || pgrep -x crond >/dev/null 2>&1 \
        || { [ -s /var/run/crond.pid ] && kill -0 "$(cat /var/run/crond.pid)" 2>/dev/null; }
}
cron_up() {
    cron_running && return 0
    command -v cron >/dev/null 2>&1 || { echo "   no cron daemon: the cron tests skip (or fail under CI)"; return 0; }
    if cron; then
        echo started >"$logs/cron-started"
    else
        echo "   could not start cron: the cron tests skip (or fail under CI)"
    fi
}
cron_cleanup() {
    [ -e "$logs/cron-started" ] || return 0
    rm -f -- "$logs/cron-started"
    if [ -s /var/run/crond.pid ]; then kill -TERM "$(cat /var/run/crond.pid)" 2>/dev/null || true; fi
}
# shellcheck source=scripts/pi-pins.sh
. scripts/pi-pins.sh
default_pi=${PI_PINS[0]##*@}
case "${PISUB_PI_VERSIONS:-all}" in
    all) pi_versions=("${PI_PINS[@]##*@}") ;;
    default) pi_versions=("$default_pi") ;;
    *) read -r -a pi_versions <<<"$PISUB_PI_VERSIONS" ;;
esac
install_pis() {
    bash scripts/install_pi.sh "${pi_versions[@]}" >"$logs/pi-bins"
}
# Run "$@" as the unprivileged user, in the copy, with a clean environment (pip and proxy
# settings kept, for pip; CI, for the tests).
as_nonroot() {
    local keep=() var
    for var in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY \
        PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_CERT PIP_DEFAULT_TIMEOUT \
        SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE CI; do
        if [ -n "${!var:-}" ]; then keep+=("$var=${!var}"); fi
    done
    (
        cd "$nonroot_dir/src"
        exec setpriv --reuid="$(id -u "$NONROOT_USER")" --regid="$(id -g "$NONROOT_USER")" \
            --clear-groups -- \
            env -i PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 HOME="$nonroot_dir/home" \
            USER="$NONROOT_USER" LOGNAME="$NONROOT_USER" TMPDIR="$nonroot_dir/tmp" \
            PIP_CACHE_DIR="$nonroot_dir/pip-cache" PIP_DISABLE_PIP_VERSION_CHECK=1 "${keep[@]}" "$@"
    )
}
install_nonroot() {
    # The working tree as git sees it: uncommitted and new files in, ignored ones (.venv, .pi-cli)
    # out; a tracked file deleted in the tree is only warned about.
    { git ls-files -z --cached --others --exclude-standard 2>/dev/null \
        || printf '%s\0' pisub tests fixtures spec scripts pyproject.toml README.md; } \
        | tar -cf - --exclude=__pycache__ --ignore-failed-read --null -T - \
        | tar -xf - --no-same-owner -C "$nonroot_dir/src"
    chown -R "$NONROOT_USER:" "$nonroot_dir"
    chown root: "$nonroot_dir/shared"
    as_nonroot /usr/bin/python3 -m venv "$nonroot_dir/venv"
    as_nonroot "$nonroot_dir/venv/bin/python" -m pip install --quiet -e '.[dev]' \
        --config-settings editable_mode=compat
    as_nonroot "$nonroot_dir/venv/bin/python" -m compileall -q pisub tests scripts  # (as install_venv)
}

started=$SECONDS
echo "== installing: pip, pi ${pi_versions[*]}${is_root:+, distribution packages}${use_nonroot:+, the copy for $NONROOT_USER}"
start pip install_venv
start pi install_pis
if [ -n "$is_root" ]; then
    slurm_dir=${PISUB_SLURM_DIR:-/tmp/pisub-slurm}
    if [ -n "$use_slurm" ] \
        && ! { [ -s "$slurm_dir/run/slurmctld.pid" ] && kill -0 "$(cat "$slurm_dir/run/slurmctld.pid")" 2>/dev/null; }; then
        slurm_started=1
    fi
    start packages packages_and_slurm
fi
if [ -n "$use_nonroot" ]; then
    if ! getent passwd "$NONROOT_USER" >/dev/null; then
        useradd --system --no-create-home --shell /usr/sbin/nologin "$NONROOT_USER"
    fi
    nonroot_dir=$(mktemp -d /tmp/pisub-nonroot.XXXXXX)
    chmod 755 "$nonroot_dir"
    mkdir -m 700 "$nonroot_dir/home" "$nonroot_dir/tmp" "$nonroot_dir/pip-cache"
    mkdir -m 755 "$nonroot_dir/src" "$nonroot_dir/shared"  # shared: root's tests put users' dirs here
    start "copy for $NONROOT_USER" install_nonroot
fi
for name in pip pi packages "copy for $NONROOT_USER"; do
    [ -n "${step_pid[$name]:-}" ] || continue
    finish "$name" || { echo "   $name failed" >&2; exit 1; }
done
echo "   installed in $((SECONDS - started)) s"
mapfile -t pi_bins <"$logs/pi-bins"
PISUB_PI_BIN=${pi_bins[0]}
export PISUB_PI_BIN
slurm_env=()
if [ -n "$use_slurm" ]; then
    slurm_env=(SLURM_CONF="$slurm_dir/slurm.conf" PISUB_REQUIRE_SLURM=1)
fi
cron_env=()
if [ -n "$is_root" ] && cron_running; then
    cron_env=(PISUB_REQUIRE_CRON=1)  # a cron daemon runs: the cron tests must not skip
fi
if [ -n "$use_nonroot" ]; then
    # The pi CLI where the user can reach it: hard links (else a copy); the launchers name
    # absolute paths of this tree, so they are new files naming the copy.
    pi_cli=$(readlink -f .pi-cli)  # (a symlink in a worktree: copied, never changed)
    cp -al "$pi_cli" "$nonroot_dir/src/.pi-cli" 2>/dev/null \
        || { rm -rf "$nonroot_dir/src/.pi-cli" && cp -a "$pi_cli" "$nonroot_dir/src/.pi-cli"; }
    for launcher in "$nonroot_dir"/src/.pi-cli/*/bin/pi; do
        sed "s#$pi_cli/#$nonroot_dir/src/.pi-cli/#g" "$launcher" >"$launcher.new"
        rm -f "$launcher" && mv "$launcher.new" "$launcher" && chmod 755 "$launcher"
    done
    chown -R "$NONROOT_USER:" "$nonroot_dir/src/.pi-cli"
fi
# The launcher of pi version $1 for whoever runs the pass.
pi_for() {
    local bin=$1
    if [ -n "${2:-}" ]; then bin=$nonroot_dir/src/.pi-cli/${bin#"$(pwd -P)/.pi-cli/"}; fi
    printf '%s\n' "$bin"
}

# --- lint and tests --------------------------------------------------------------------------
lint() {
    .venv/bin/ruff check pisub tests scripts  # the project's files, never a stray one in the checkout
    .venv/bin/ruff format --check pisub tests scripts
    .venv/bin/mypy
}
# pytest_pass NAME AS_NONROOT PI_BIN MARKEXPR [xdist] -- ARGS: one pass; its report in $reports.
reports=$logs
nonroot_env=()  # for the root passes' tests that drive pisub as the user (tests/nonroot.py)
if [ -n "$use_nonroot" ]; then
    reports=$nonroot_dir/tmp
    nonroot_env=(PISUB_NONROOT_PYTHON="$nonroot_dir/venv/bin/python" PISUB_NONROOT_USER="$NONROOT_USER"
        PISUB_NONROOT_TMPDIR="$nonroot_dir/shared")
fi
pytest_pass() {
    local name=$1 nonroot=$2 pi=$3 marks=$4 workers=$5
    shift 5
    local opts=(-q -p no:cacheprovider --durations=15 -m "$marks" --junitxml="$reports/junit-$name.xml")
    [ "$workers" = 0 ] || opts+=(-n "$workers" --dist worksteal)
    if [ -n "$nonroot" ]; then
        as_nonroot "${slurm_env[@]}" "${cron_env[@]}" PISUB_PI_BIN="$(pi_for "$pi" 1)" \
            "$nonroot_dir/venv/bin/python" -m pytest "${opts[@]}" "$@"
    else
        env "${slurm_env[@]}" "${cron_env[@]}" "${nonroot_env[@]}" PISUB_PI_BIN="$pi" .venv/bin/python -m pytest "${opts[@]}" "$@"
    fi
}
rc=0
# Whether a pass's exit code fails the run: 5 (no tests selected) is fine when extra arguments
# narrowed the selection, or for a pass that may well be empty.
check() {
    local name=$1 code=$2 may_be_empty=$3
    if [ "$code" -eq 5 ] && { [ "$may_be_empty" = 1 ] || [ "$#" -gt 3 ]; }; then return 0; fi
    if [ "$code" -ne 0 ]; then
        echo "   $name failed (exit $code)"
        [ "$rc" -ne 0 ] || rc=$code
    fi
}

start lint lint
others=()
for ((i = 1; i < ${#pi_bins[@]}; i++)); do
    name="pi ${pi_versions[$i]}"
    others+=("$name")
    start "$name" pytest_pass "pi-${pi_versions[$i]}" "$use_nonroot" "${pi_bins[$i]}" \
        "pi_versions and not serial${use_nonroot:+ and not root}" 0 "$@"
done
start idle pytest_pass idle "$use_nonroot" "$PISUB_PI_BIN" "idle and not serial${use_nonroot:+ and not root}" 0 "$@"
if [ -n "$use_nonroot" ]; then
    start root pytest_pass root "" "$PISUB_PI_BIN" "root and not serial and not idle" 0 "$@"
    main_marks="not serial and not root and not idle"
    echo "== main pass as $NONROOT_USER ($WORKERS workers)"
else
    main_marks="not serial and not idle"
    echo "== main pass ($WORKERS workers)"
fi
started=$SECONDS
code=0
pytest_pass main "$use_nonroot" "$PISUB_PI_BIN" "$main_marks" "$WORKERS" "$@" || code=$?
echo "   main pass: $((SECONDS - started)) s"
check main "$code" 0 "$@"
for name in ${use_nonroot:+root} "${others[@]}" idle lint; do
    code=0
    finish "$name" || code=$?
    may_be_empty=0
    [ "$name" != idle ] || may_be_empty=1
    check "$name" "$code" "$may_be_empty" "$@"
done

# Alone: the serial tests, as the unprivileged user where they can (the Slurm cluster still up
# for theirs), then the root ones among them once it is stopped — they step the wall clock,
# which left slurmctld not scheduling for as long as the step when it ran beside a cluster.
started=$SECONDS
echo "== serial pass${use_nonroot:+ as $NONROOT_USER}"
code=0
pytest_pass serial "$use_nonroot" "$PISUB_PI_BIN" "serial${is_root:+ and not root}" 0 "$@" || code=$?
echo "   serial pass: $((SECONDS - started)) s"
check serial "$code" 1 "$@"
slurm_cleanup
if [ -n "$is_root" ]; then
    started=$SECONDS
    echo "== serial pass as root"
    code=0
    pytest_pass serial-root "" "$PISUB_PI_BIN" "serial and root" 0 "$@" || code=$?
    echo "   serial pass as root: $((SECONDS - started)) s"
    check "serial as root" "$code" 1 "$@"
fi
for ((i = 1; i < ${#pi_bins[@]}; i++)); do
    echo "== serial pass with pi ${pi_versions[$i]}"
    code=0
    pytest_pass "serial-pi-${pi_versions[$i]}" "$use_nonroot" "${pi_bins[$i]}" \
        "pi_versions and serial${use_nonroot:+ and not root}" 0 "$@" || code=$?
    check "serial with pi ${pi_versions[$i]}" "$code" 1 "$@"
done

echo "== the slowest tests of every pass"
.venv/bin/python scripts/durations.py "$reports"/junit-*.xml >"$logs/durations.txt" || true
head -n 25 "$logs/durations.txt"
if [ -n "${PISUB_DURATIONS:-}" ]; then cp "$logs/durations.txt" "$PISUB_DURATIONS"; fi
exit "$rc"
