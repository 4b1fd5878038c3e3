#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, started by hand (no systemd needed), for pisub's
# Slurm backend and its tests: munged, slurmctld and slurmd on localhost with a generated
# slurm.conf (proctrack/cgroup, OverSubscribe so many idle agents fit on 2 cores,
# DefMemPerNode). Installs Debian's slurm-wlm and munge when missing (root). Idempotent: a
# cluster already up is left as it is. Stop it with scripts/slurm-down.sh.
#
#   scripts/slurm-up.sh            # prints the SLURM_CONF to export
#   PISUB_SLURM_DIR=/some/dir scripts/slurm-up.sh
set -euo pipefail

dir=${PISUB_SLURM_DIR:-/tmp/pisub-slurm}
conf=$dir/slurm.conf
started=$SECONDS

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    echo "== installing slurm-wlm and munge (Debian packages)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends slurm-wlm slurmctld slurmd slurm-client munge >/dev/null \
        || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends \
            slurm-wlm slurmctld slurmd slurm-client munge >/dev/null; }
fi

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

mkdir -p -m 700 "$dir/state" "$dir/spool" "$dir/log" "$dir/run"
# Every user that submits reads slurm.conf (as /etc/slurm on a real cluster): with this folder
# 0700 an unprivileged user's sbatch, squeue and scancel retried for 60 s and failed.
chmod 755 "$dir"
host=$(hostname -s)
cpus=$(nproc)
if [ ! -s "$conf" ]; then
    cat >"$conf" <<EOF
ClusterName=pisub
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ReturnToService=2
SlurmdParameters=config_overrides
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
JobAcctGatherType=jobacct_gather/cgroup
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MinJobAge=300
KillWait=30
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:64 DefMemPerNode=64
EOF
    printf 'CgroupPlugin=autodetect\nConstrainCores=no\nConstrainRAMSpace=no\n' >"$dir/cgroup.conf"
fi

# munged: the one already answering is used (a system's), else one started here (its pid goes
# to $dir/run/munged.pid, so that slurm-down.sh stops only what this script started).
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    install -d -o munge -g munge -m 755 /run/munge
    [ -s /etc/munge/munge.key ] || mungekey --create --force >/dev/null 2>&1 || /usr/sbin/create-munge-key -f
    runuser -u munge -- /usr/sbin/munged --force
    cp /run/munge/munged.pid "$dir/run/munged.pid"
fi
export SLURM_CONF=$conf
alive "$dir/run/slurmctld.pid" || slurmctld -f "$conf"
alive "$dir/run/slurmd.pid" || slurmd -f "$conf"

# Up when the node is idle (or mixed/allocated: jobs already run).
deadline=$((SECONDS + 60))
until state=$(sinfo -h -N -o %T 2>/dev/null | head -1) && [[ $state =~ ^(idle|mixed|allocated) ]]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "slurm-up: the node did not come up within 60 s (state: ${state:-none}); see $dir/log/" >&2
        exit 1
    fi
    [[ ${state:-} =~ ^(down|drained|unknown) ]] && scontrol update nodename="$host" state=resume 2>/dev/null || true
    sleep 0.2
done
echo "slurm-up: node $host $state in $((SECONDS - started)) s; export SLURM_CONF=$conf" >&2
echo "SLURM_CONF=$conf"
