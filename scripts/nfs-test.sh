#!/bin/bash
# Opt-in NFSv4.2 harness for pisub: boots a QEMU (TCG) guest with virtme-ng, runs an
# NFSv4.2 server and two NFS clients (two net namespaces + hostnames) inside it, and checks
# that a local run started on client 1 is never repaired by a reader on client 2.
#
# Usage: scripts/nfs-test.sh [PISUB_CHECKOUT (default: this checkout)] [WORKDIR (default: a new temp dir)]
#        (the pytest mode: scripts/test.sh --nfs runs tests/integration/test_nfs.py, which calls this)
# Needs root (apt-get, the VM's 9p root) and about 6 minutes; installs qemu-system-x86,
# linux-image-amd64, nfs-kernel-server, nfs-common, busybox-static (Debian) and virtme-ng 1.42
# (into PISUB_NFS_VENV, default ~/.cache/pisub-nfs/venv) when missing.
# Env:   SKIP_PARTITION=1  skip scenario 2 (client 1's network cut during a run)
#        GUEST_TIMEOUT=secs  (default 1200) hard limit on the VM
# Exit:  0 only if every check passed.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
CHECKOUT=$(readlink -f "${1:-$HERE/..}")
WORK=${2:-$(mktemp -d /tmp/pisub-nfs.XXXXXX)}
VENV=${PISUB_NFS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/pisub-nfs/venv}
T0=$(date +%s)
ts() { echo "$(( $(date +%s) - T0 ))s"; }
say() { echo "[host +$(ts)] $*"; }

[ -x "$CHECKOUT/.venv/bin/python" ] || { echo "FAIL no $CHECKOUT/.venv/bin/python"; exit 2; }
mkdir -p "$WORK"; WORK=$(readlink -f "$WORK")

# ------------------------------------------------------------ install (idempotent)
need=()
for p in qemu-system-x86 linux-image-amd64 nfs-kernel-server nfs-common busybox-static iproute2 util-linux kmod rpcbind; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  say "apt-get install ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >"$WORK/apt.log" 2>&1 \
    || { echo "FAIL apt-get install (see $WORK/apt.log)"; exit 2; }
fi
if ! "$VENV/bin/vng" --version >/dev/null 2>&1; then
  say "pip install virtme-ng==1.42 into $VENV"
  mkdir -p "$(dirname "$VENV")" && python3 -m venv "$VENV" && "$VENV/bin/pip" install -q virtme-ng==1.42 >"$WORK/pip.log" 2>&1 \
    || { echo "FAIL pip install virtme-ng (see $WORK/pip.log)"; exit 2; }
fi
KERNEL=$(ls -1 /boot/vmlinuz-*-amd64 2>/dev/null | sort -V | tail -1)
[ -n "$KERNEL" ] || { echo "FAIL no /boot/vmlinuz-*-amd64"; exit 2; }
KVER=${KERNEL#/boot/vmlinuz-}
[ -d "/lib/modules/$KVER" ] || { echo "FAIL no /lib/modules/$KVER"; exit 2; }
echo "TIME install $(ts)"

# ------------------------------------------------------------ boot guest + scenario
cp "$HERE/nfs-guest.sh" "$WORK/guest.sh"; chmod +x "$WORK/guest.sh"
rm -f "$WORK/results.txt" "$WORK/guest.done"
say "booting $KERNEL (TCG) ; guest log: $WORK/guest.log"
tb=$(date +%s); export PATH="$VENV/bin:$PATH"
timeout "${GUEST_TIMEOUT:-1200}" "$VENV/bin/vng" --run "$KERNEL" --disable-kvm --force-9p \
  --memory 3G --cpus 2 --rwdir "$WORK" \
  --exec "SKIP_PARTITION=${SKIP_PARTITION:-0} bash $WORK/guest.sh $CHECKOUT $WORK" \
  >"$WORK/guest.log" 2>&1 </dev/null
vrc=$?
say "vng exited rc=$vrc after $(( $(date +%s) - tb ))s"
echo "TIME vm-total $(( $(date +%s) - tb ))s"

# ------------------------------------------------------------ verdict
if [ ! -f "$WORK/guest.done" ]; then
  echo "FAIL guest did not finish (timeout or crash); tail of $WORK/guest.log:"; tail -20 "$WORK/guest.log"
fi
if [ -f "$WORK/results.txt" ]; then cat "$WORK/results.txt"; fi
npass=$(grep -c '^PASS' "$WORK/results.txt" 2>/dev/null); npass=${npass:-0}
nfail=$(grep -c '^FAIL' "$WORK/results.txt" 2>/dev/null); nfail=${nfail:-0}
echo "TIME total $(ts)"
if [ -f "$WORK/guest.done" ] && [ "$nfail" -eq 0 ] && [ "$npass" -gt 0 ] \
   && grep -q '^PASS s1: no run.repaired' "$WORK/results.txt"; then
  echo "ALL PASS ($npass checks)"; exit 0
fi
echo "NOT ALL PASSED ($npass passed, $nfail failed)"; exit 1
