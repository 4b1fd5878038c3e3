#!/usr/bin/env bash
# Stop the one-node Slurm cluster scripts/slurm-up.sh started (by the pids it recorded).
# PISUB_SLURM_DIR as for slurm-up.sh; --purge also removes its directory (state, logs).
set -euo pipefail

dir=${PISUB_SLURM_DIR:-/tmp/pisub-slurm}
stop() {
    local pidfile=$dir/run/$1.pid pid
    [ -s "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}
stop slurmd
stop slurmctld
stop munged
if [ "${1:-}" = "--purge" ]; then rm -rf "$dir"; fi
echo "slurm-down: stopped" >&2
