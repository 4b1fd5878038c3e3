#!/usr/bin/env bash
# Install pisub with its development tools into .venv, then lint, type-check and test.
# Extra arguments go to pytest (e.g. scripts/test.sh --stress, scripts/test.sh -k crash).
#
# pi: every pinned version (scripts/pi-pins.sh) is installed; the suite runs against the default
# pin, then the pi tests (-m pi) run again against each other version. PISUB_PI_VERSIONS=default
# (the fast path) runs the default only; PISUB_PI_VERSIONS="1.6.0 0.85.1" picks versions.
#
# As root, the security and control tests also run as the ordinary user pisub-ci (created if
# missing) from a copy of the project in a world-traversable temp dir, since root's
# CAP_FOWNER, CAP_DAC_OVERRIDE and protected_hardlinks exemption hide real failures; the main
# run gets PISUB_NONROOT_PYTHON / PISUB_NONROOT_USER / PISUB_NONROOT_TMPDIR for the tests that
# drive pisub as that user (tests/nonroot.py). PISUB_NONROOT=0 skips all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' --config-settings editable_mode=compat
# tmux drives `pisub top` in its test: installed from the distribution when missing (as root).
if ! command -v tmux >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== tmux (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null 2>&1; } \
        || echo "   tmux could not be installed: the pisub top test is skipped"
fi
# bindfs gives tests/integration/test_split_brain.py its second mount of the home (as root).
if ! command -v bindfs >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== bindfs (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bindfs >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bindfs >/dev/null 2>&1; } \
        || echo "   bindfs could not be installed: the split-brain test is skipped"
fi
echo "== pi CLI (pinned, into .pi-cli/)"
# shellcheck source=scripts/pi-pins.sh
. scripts/pi-pins.sh
default_pi=${PI_PINS[0]##*@}
case "${PISUB_PI_VERSIONS:-all}" in
    all) pi_versions=("${PI_PINS[@]##*@}") ;;
    default) pi_versions=("$default_pi") ;;
    *) read -r -a pi_versions <<<"$PISUB_PI_VERSIONS" ;;
esac
mapfile -t pi_bins < <(bash scripts/install_pi.sh "${pi_versions[@]}")
PISUB_PI_BIN=${pi_bins[0]}
export PISUB_PI_BIN

NONROOT_USER=pisub-ci
nonroot_dir=
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
    rm -rf -- "$nonroot_dir"
}
# Run "$@" as the unprivileged user, in the copy, with a clean environment (pip and proxy
# settings kept, for pip).
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
if [ "$(id -u)" -eq 0 ] && [ "${PISUB_NONROOT:-1}" != 0 ]; then
    echo "== unprivileged copy (user $NONROOT_USER)"
    started=$SECONDS
    trap nonroot_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    if ! getent passwd "$NONROOT_USER" >/dev/null; then
        useradd --system --no-create-home --shell /usr/sbin/nologin "$NONROOT_USER"
    fi
    nonroot_dir=$(mktemp -d /tmp/pisub-nonroot.XXXXXX)
    chmod 755 "$nonroot_dir"
    mkdir -m 700 "$nonroot_dir/home" "$nonroot_dir/tmp" "$nonroot_dir/pip-cache"
    mkdir -m 755 "$nonroot_dir/src" "$nonroot_dir/shared"  # shared: root's tests put users' dirs here
    # The working tree as git sees it: uncommitted and new files in, ignored ones (.venv, .pi-cli)
    # out; a tracked file deleted in the tree is only warned about.
    { git ls-files -z --cached --others --exclude-standard 2>/dev/null \
        || printf '%s\0' pisub tests fixtures spec scripts .pisub pyproject.toml README.md; } \
        | tar -cf - --exclude=__pycache__ --ignore-failed-read --null -T - \
        | tar -xf - --no-same-owner -C "$nonroot_dir/src"
    chown -R "$NONROOT_USER:" "$nonroot_dir"
    chown root: "$nonroot_dir/shared"
    as_nonroot /usr/bin/python3 -m venv "$nonroot_dir/venv"
    as_nonroot "$nonroot_dir/venv/bin/python" -m pip install --quiet -e '.[dev]' \
        --config-settings editable_mode=compat
    echo "   ready in $((SECONDS - started)) s: $nonroot_dir"
fi

# Slurm: the backend's tests place runs on a one-node cluster started here and stopped at the
# end (left as it was when one was already up). PISUB_SLURM=0 skips it (the tests then skip).
slurm_started=
slurm_cleanup() {
    [ -z "$slurm_started" ] || bash scripts/slurm-down.sh >/dev/null 2>&1 || true
}
if [ "$(id -u)" -eq 0 ] && [ "${PISUB_SLURM:-1}" != 0 ]; then
    echo "== Slurm (one-node cluster: scripts/slurm-up.sh)"
    slurm_dir=${PISUB_SLURM_DIR:-/tmp/pisub-slurm}
    if ! { [ -s "$slurm_dir/run/slurmctld.pid" ] && kill -0 "$(cat "$slurm_dir/run/slurmctld.pid")" 2>/dev/null; }; then
        slurm_started=1
    fi
    trap 'nonroot_cleanup; slurm_cleanup' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    bash scripts/slurm-up.sh >/dev/null
fi

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check pisub tests scripts
echo "== mypy --strict"
.venv/bin/mypy
rc_slurm=0
if [ -n "${slurm_dir:-}" ]; then
    # On a cluster of its own, before the main run: once, a long main run left this one-node
    # slurmctld no longer scheduling (jobs PENDING, reason None/Priority) — see CHANGELOG.
    echo "== pytest: the Slurm backend (contract suite and tests/integration/test_slurm.py)"
    SLURM_CONF=$slurm_dir/slurm.conf PISUB_REQUIRE_SLURM=1 .venv/bin/python -m pytest -q -p no:randomly \
        tests/contract tests/integration/test_slurm.py || rc_slurm=$?
    if [ -n "$nonroot_dir" ]; then
        # The same as the unprivileged user: its own jobs, its own home (pi-marked tests aside:
        # the pi CLI is copied where that user can reach it only for the later pass).
        echo "== pytest: the Slurm backend as $NONROOT_USER"
        rc_slurm_nonroot=0
        as_nonroot SLURM_CONF="$slurm_dir/slurm.conf" PISUB_REQUIRE_SLURM=1 \
            "$nonroot_dir/venv/bin/python" -m pytest -q -p no:cacheprovider -p no:randomly -m "not pi" \
            tests/contract tests/integration/test_slurm.py || rc_slurm_nonroot=$?
        [ "$rc_slurm" -ne 0 ] || rc_slurm=$rc_slurm_nonroot
    fi
    slurm_cleanup
    slurm_started=
fi
echo "== pytest"
rc_main=0
if [ -n "$nonroot_dir" ]; then
    PISUB_NONROOT_PYTHON=$nonroot_dir/venv/bin/python PISUB_NONROOT_USER=$NONROOT_USER \
        PISUB_NONROOT_TMPDIR=$nonroot_dir/shared .venv/bin/python -m pytest -q --durations=10 "$@" || rc_main=$?
else
    .venv/bin/python -m pytest -q "$@" || rc_main=$?
fi

# The pi tests against every other selected pi version, in the background while the
# unprivileged pass runs (both mostly wait on child processes; CI has 2 cores); their output
# is printed once they are done.
other_pis() {
    local rc=0 rc_pi
    for ((i = 1; i < ${#pi_bins[@]}; i++)); do
        echo "== pytest -m pi with pi ${pi_versions[$i]}"
        rc_pi=0
        # (the benchmark once is enough: it runs in the main pass)
        PISUB_PI_BIN=${pi_bins[$i]} .venv/bin/python -m pytest -q -m pi -p no:cacheprovider \
            --deselect tests/test_bench.py::test_bench_quick_runs "$@" || rc_pi=$?
        [ "$rc" -ne 0 ] || [ "$rc_pi" -eq 5 ] || rc=$rc_pi  # 5: extra arguments selected none
    done
    return "$rc"
}
pi_log=$(mktemp /tmp/pisub-pi-pass.XXXXXX)
other_pis "$@" >"$pi_log" 2>&1 &
pi_pid=$!

# After a failed main run too: its failures and the unprivileged ones are often different.
if [ -n "$nonroot_dir" ]; then
    echo "== pytest as $NONROOT_USER (security and control tests, unprivileged)"
    started=$SECONDS
    shopt -s nullglob
    nonroot_tests=(tests/integration/test_security.py tests/integration/test_control.py
        tests/integration/test_bad_input.py tests/integration/test_crash.py
        tests/integration/test_hardening*.py tests/integration/test_repros.py
        tests/integration/test_hostile_entries.py tests/integration/test_symlinked_dirs.py tests/integration/test_no_traceback.py
        tests/integration/test_faults.py tests/integration/test_outside_attack.py
        tests/integration/test_nonroot.py tests/integration/test_workflows.py tests/integration/test_workflow_attacks.py
        tests/integration/test_lanes.py tests/integration/test_worktree_git.py tests/integration/test_worktree_runs.py
        tests/integration/test_lane_worktree_attacks.py tests/integration/test_lane_evidence.py tests/integration/test_worktree_repo_attacks.py
        tests/integration/test_review_gate_attacks.py tests/integration/test_one_line_fields.py
        tests/integration/test_run_mode_contract.py tests/integration/test_lineage.py
        tests/integration/test_acceptance.py tests/integration/test_review_and_inference.py
        tests/integration/test_acceptance_attacks.py tests/integration/test_agent_admin.py
        tests/integration/test_live_index.py tests/integration/test_warm_launch.py
        tests/integration/test_wait_and_list.py tests/integration/test_tree_budget.py
        tests/integration/test_script_output.py tests/integration/test_unwritten_end.py
        tests/integration/test_launch_kill_points.py tests/integration/test_terminal_output.py
        tests/integration/test_slurm_client.py)
    shopt -u nullglob
    pi_env=()
    if grep -qE '\bpi_(home|bin)\b|mark\.pi\b' "${nonroot_tests[@]}"; then
        # Some of them need the pi CLI: hard links (else a copy) where the user can reach them.
        cp -al .pi-cli "$nonroot_dir/src/" 2>/dev/null \
            || { rm -rf "$nonroot_dir/src/.pi-cli" && cp -a .pi-cli "$nonroot_dir/src/"; }
        # The launchers name absolute paths of this tree: new files (not the hard links) naming the copy.
        for launcher in "$nonroot_dir"/src/.pi-cli/*/bin/pi; do
            sed "s#$PWD/#$nonroot_dir/src/#g" "$launcher" >"$launcher.new"
            rm -f "$launcher" && mv "$launcher.new" "$launcher" && chmod 755 "$launcher"
        done
        pi_env=(PISUB_PI_BIN="$nonroot_dir/src/.pi-cli/${PISUB_PI_BIN#"$PWD/.pi-cli/"}")
    fi
    rc_nonroot=0
    as_nonroot "${pi_env[@]}" "$nonroot_dir/venv/bin/python" -m pytest -q -p no:cacheprovider \
        "${nonroot_tests[@]}" "$@" || rc_nonroot=$?
    echo "   as $NONROOT_USER: $((SECONDS - started)) s"
    [ "$rc_main" -ne 0 ] || [ "$rc_nonroot" -eq 5 ] || rc_main=$rc_nonroot  # 5: extra arguments selected none
fi
rc_pis=0
wait "$pi_pid" || rc_pis=$?
cat "$pi_log" && rm -f "$pi_log"
[ "$rc_main" -ne 0 ] || rc_main=$rc_pis
[ "$rc_main" -ne 0 ] || rc_main=$rc_slurm
exit "$rc_main"
