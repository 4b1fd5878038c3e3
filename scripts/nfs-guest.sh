#!/bin/bash
# Runs INSIDE the QEMU guest (booted by nfs-test.sh through virtme-ng).
# Usage: guest.sh CHECKOUT WORKDIR
#   CHECKOUT: the pisub checkout (its .venv is used), seen over the 9p root
#   WORKDIR:  writable dir shared with the host (vng --rwdir); results go there
# Writes WORKDIR/results.txt (PASS/FAIL/INFO lines) and WORKDIR/guest.done.
set -u
CHECKOUT=${1:?the pisub checkout}
W=${2:?the work dir shared with the host}
PY="$CHECKOUT/.venv/bin/python"
RES="$W/results.txt"
: > "$RES"
T0=$(date +%s)

log()  { echo "[guest +$(( $(date +%s) - T0 ))s] $*"; }
rec()  { echo "$*" >> "$RES"; log "RESULT: $*"; }
pass() { rec "PASS $*"; }
fail() { rec "FAIL $*"; }
info() { rec "INFO $*"; }
phase(){ rec "TIME $1 $(( $(date +%s) - T0 ))s"; }

finish() { phase guest-end; touch "$W/guest.done"; sync; }
trap finish EXIT

log "kernel $(uname -r), hostname $(hostname), cpus $(nproc)"

# ---------------------------------------------------------------- server
for m in veth nfsd nfsv4 nfs rpcsec_gss_krb5; do
  modprobe "$m" 2>&1 | sed 's/^/  modprobe: /' || true
done
mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd || { fail "mount nfsd fs"; exit 1; }
# private writable state for nfs-utils (the root fs is the host's, read-only)
mount -t tmpfs tmpfs /var/lib/nfs
mkdir -p /var/lib/nfs/rpc_pipefs /var/lib/nfs/v4recovery /var/lib/nfs/sm
mount -t rpc_pipefs sunrpc /var/lib/nfs/rpc_pipefs 2>/dev/null || true
touch /var/lib/nfs/etab /var/lib/nfs/rmtab
# the root fs is read-only: mount points live on a tmpfs over /mnt
mount -t tmpfs -o mode=0755 tmpfs /mnt
mkdir -p /run/netns /mnt/export /mnt/a /mnt/b
mount -t tmpfs -o size=512m,mode=0755 tmpfs /mnt/export

echo 10 > /proc/fs/nfsd/nfsv4leasetime || fail "set nfsv4leasetime"
echo 10 > /proc/fs/nfsd/nfsv4gracetime || fail "set nfsv4gracetime"
info "leasetime=$(cat /proc/fs/nfsd/nfsv4leasetime) gracetime=$(cat /proc/fs/nfsd/nfsv4gracetime)"

# /etc is read-only: empty exports file via -f, export from the command line
exportfs -o rw,sync,no_root_squash,no_subtree_check,insecure,fsid=0 '*:/mnt/export' 2>&1 | sed 's/^/  exportfs: /'
exportfs -v 2>&1 | sed 's/^/  exportfs -v: /'
rpcbind -w 2>/dev/null || rpcbind 2>/dev/null || log "rpcbind not started (ok for v4-only)"
rpc.mountd -N 2 -N 3 2>&1 | sed 's/^/  mountd: /'
rpc.nfsd -N 3 4 2>&1 | sed 's/^/  nfsd: /'
info "nfsd versions: $(cat /proc/fs/nfsd/versions) threads: $(cat /proc/fs/nfsd/threads)"
phase server-started

# ---------------------------------------------------------------- clients
# two network namespaces, each a veth pair to the guest's own (server) namespace
for i in 1 2; do
  ip netns add c$i
  ip link add v${i}h type veth peer name v${i}c
  ip link set v${i}c netns c$i
  ip addr add 10.9.$i.1/24 dev v${i}h
  ip link set v${i}h up
  ip -n c$i addr add 10.9.$i.2/24 dev v${i}c
  ip -n c$i link set v${i}c up
  ip -n c$i link set lo up
done
ip -n c1 addr show v1c | sed 's/^/  c1: /'

# run CMD as client N: its own net namespace and its own hostname (client$N)
as_client() { # N CMD...
  local n=$1; shift
  nsenter --net=/run/netns/c$n unshare --uts sh -c "hostname client$n; exec \"\$@\"" sh "$@"
}

mount_client() { # N MOUNTPOINT
  local n=$1 mp=$2 try
  for try in 1 2 3 4 5 6; do
    if as_client "$n" timeout 120 mount -t nfs4 -o vers=4.2,lookupcache=positive,timeo=50,retrans=2 \
         "10.9.$n.1:/" "$mp" 2>&1 | sed "s/^/  mount c$n: /"; mountpoint -q "$mp"; then
      return 0
    fi
    sleep 3
  done
  return 1
}
mount_client 1 /mnt/a && pass "client1 mounted 10.9.1.1:/ on /mnt/a" || { fail "client1 mount"; exit 1; }
mount_client 2 /mnt/b && pass "client2 mounted 10.9.2.1:/ on /mnt/b" || { fail "client2 mount"; exit 1; }
grep ' /mnt/[ab] ' /proc/mounts | sed 's/^/  mounts: /'
phase clients-mounted

# both mounts really see the same export, through different superblocks
echo hello-from-a > /mnt/a/probe
if [ "$(cat /mnt/b/probe 2>&1)" = hello-from-a ]; then pass "mount B sees a file written through mount A"
else fail "mount B does not see mount A's file"; fi
if [ "$(stat -c %d /mnt/a)" != "$(stat -c %d /mnt/b)" ]; then pass "mounts A and B are separate superblocks (dev $(stat -c %d /mnt/a) / $(stat -c %d /mnt/b))"
else fail "mounts A and B share one superblock (one NFS client)"; fi
# the server must see two NFSv4 clients
if [ -d /proc/fs/nfsd/clients ]; then
  ncl=$(ls /proc/fs/nfsd/clients | wc -l)
  for c in /proc/fs/nfsd/clients/*/info; do sed 's/^/  nfsd client: /' "$c" | grep -E "name|address|minor" ; done
  [ "$ncl" -ge 2 ] && pass "server sees $ncl NFSv4 client ids" || fail "server sees only $ncl NFSv4 client id(s)"
fi

# ---------------------------------------------------------------- pisub setup
HOME_A=/mnt/a/home; HOME_B=/mnt/b/home
mkdir -p "$HOME_A/agents"
cat > "$HOME_A/agents/ticker.md" <<'EOF'
---
name: ticker
runner: external-cli
command: sh
args: ["-c", "for i in $(seq 40); do echo tick $i; sleep 1; done"]
---
EOF
cat > "$HOME_A/agents/longticker.md" <<'EOF'
---
name: longticker
runner: external-cli
command: sh
args: ["-c", "for i in $(seq 150); do echo tick $i; sleep 1; done"]
---
EOF

pisub_c() { # N HOME ARGS...  -> pisub as client N, stdout+stderr to stdout
  local n=$1 h=$2; shift 2
  as_client "$n" env PISUB_HOME="$h" timeout 300 "$PY" -m pisub "$@" 2>&1
}
state_of() { # JSON text on stdin -> state
  "$PY" -c 'import json,sys
t=sys.stdin.read(); i=t.find("{")
try: print(json.loads(t[i:])["state"])
except Exception as e: print("UNPARSEABLE")' 2>/dev/null
}
repaired_in() { # RUNDIR -> prints matching lines of events files
  cat "$1"/events.jsonl "$1"/events.repair.jsonl 2>/dev/null | grep -F 'run.repaired'
}

# ---------------------------------------------------------------- scenario 1
log "scenario 1: local run on client1, status from client2"
t=$(date +%s)
out=$(pisub_c 1 "$HOME_A" run --agent ticker go); rc=$?
echo "$out" | sed 's/^/  run c1: /'
RUN=$(echo "$out" | grep -Eo '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' | head -1)
info "pisub run on client1 took $(( $(date +%s) - t ))s rc=$rc run=$RUN"
phase s1-run-started
if [ -z "$RUN" ] || [ $rc -ne 0 ]; then fail "s1: pisub run on client1 (rc=$rc)"; exit 1; fi
pass "s1: pisub run on client1 started run $RUN"
RD_B="$HOME_B/runs/$RUN"

t=$(date +%s)
js=$(pisub_c 2 "$HOME_B" status "$RUN" --json); rc=$?
st=$(echo "$js" | state_of)
info "s1: status --json on client2 took $(( $(date +%s) - t ))s rc=$rc state=$st host=$(echo "$js" | grep -Eo '"host": *"[^"]*"')"
[ "$st" = UNPARSEABLE ] && echo "$js" | sed 's/^/  status c2: /'
if [ "$st" = running ]; then pass "s1: client2 status --json says running"
else fail "s1: client2 status --json says '$st' (expected running)"; fi
txt=$(pisub_c 2 "$HOME_B" status "$RUN"); echo "$txt" | sed 's/^/  status c2 (text): /'
phase s1-status-client2

# wait for the ticker to end, polling status.json through mount A (cheap, no python)
for i in $(seq 150); do
  grep -q '"state": *"\(complete\|failed\|cancelled\)"' /mnt/a/home/runs/"$RUN"/status.json 2>/dev/null && break
  sleep 2
done
phase s1-ticker-ended
js=$(pisub_c 1 "$HOME_A" status "$RUN" --json); st=$(echo "$js" | state_of)
if [ "$st" = complete ]; then pass "s1: client1 status says complete"
else fail "s1: client1 status says '$st' (expected complete)"; echo "$js" | sed 's/^/  status c1: /'; fi
js=$(pisub_c 2 "$HOME_B" status "$RUN" --json); st=$(echo "$js" | state_of)
[ "$st" = complete ] && pass "s1: client2 status says complete" || fail "s1: client2 status says '$st'"
r=$(repaired_in "$RD_B")
if [ -z "$r" ]; then pass "s1: no run.repaired in events.jsonl / events.repair.jsonl"
else fail "s1: run.repaired found: $r"; fi
ticks=$(grep -c '^tick' "$RD_B"/output-0.log 2>/dev/null)
info "s1: output-0.log has $ticks tick lines"
phase s1-done

# ---------------------------------------------------------------- scenario 2
[ "${SKIP_PARTITION:-0}" = 1 ] && exit 0
log "scenario 2: cut client1's network while its run runs"
out=$(pisub_c 1 "$HOME_A" run --agent longticker go); rc=$?
RUN2=$(echo "$out" | grep -Eo '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' | head -1)
if [ -z "$RUN2" ] || [ $rc -ne 0 ]; then fail "s2: pisub run on client1 (rc=$rc): $out"; exit 1; fi
pass "s2: pisub run on client1 started run $RUN2"
phase s2-run-started
RD2_B="$HOME_B/runs/$RUN2"
ip -n c1 link set v1c down
tdown=$(date +%s)
info "s2: client1 link down"
sleep 15   # > nfsv4leasetime (10 s)
t=$(date +%s)
js=$(pisub_c 2 "$HOME_B" status "$RUN2" --json); rc=$?
st=$(echo "$js" | state_of)
info "s2: client2 status --json $(( t - tdown ))s after link down took $(( $(date +%s) - t ))s rc=$rc state=$st"
[ "$st" = UNPARSEABLE ] && echo "$js" | sed 's/^/  status c2: /'
if [ "$st" = running ]; then pass "s2: partitioned run still 'running' from client2 ($(( $(date +%s) - tdown ))s after link down)"
else fail "s2: partitioned run says '$st' from client2 (expected running)"; fi
txt=$(pisub_c 2 "$HOME_B" status "$RUN2"); echo "$txt" | sed 's/^/  status c2 (text): /'
r=$(repaired_in "$RD2_B")
if [ -z "$r" ]; then pass "s2: no run.repaired after client2's status during the partition"
else fail "s2: run.repaired found: $r"; fi
[ -e "$RD2_B/result.json" ] && fail "s2: result.json exists after client2's status: $(cat "$RD2_B/result.json")" \
  || pass "s2: no result.json written by client2"
phase s2-partition-checked

# informational: heal the partition and see how the run ends
ip -n c1 link set v1c up
info "s2: client1 link up again after $(( $(date +%s) - tdown ))s"
for i in $(seq 120); do
  grep -q '"state": *"\(complete\|failed\|cancelled\)"' "$RD2_B"/status.json 2>/dev/null && break
  sleep 3
done
js=$(pisub_c 1 "$HOME_A" status "$RUN2" --json); st=$(echo "$js" | state_of)
info "s2: after healing, client1 status says '$st'; ticks=$(grep -c '^tick' "$RD2_B"/output-0.log 2>/dev/null); repaired=$(repaired_in "$RD2_B" | wc -l)"
echo "$js" | grep -Eo '"error": *(null|"[^"]*"|\{[^}]*\})' | sed 's/^/  /'
tail -12 "$RD2_B/runner.log" 2>/dev/null | sed 's/^/  runner.log: /'
dmesg | grep -iE "nfs|lock|lease" | tail -25 | sed 's/^/  dmesg: /'
phase s2-done
