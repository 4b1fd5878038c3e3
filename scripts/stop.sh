#!/bin/sh
# Stop a pisub run without pisub (see steer.sh for the protocol).
#
#   scripts/stop.sh RUN_DIR
#
# Exit: 0 delivered, 2 failed/rejected, 3 no answer within $PISUB_WAIT seconds (default 3).
set -eu
[ $# -ge 1 ] || { printf 'usage: %s RUN_DIR\n' "$0" >&2; exit 64; }
run=$1
id="sh-$(date +%s)-$$"
printf '{"v":1,"id":"%s","type":"stop","source":"stop.sh"}\n' "$id" > "$run/inbox/tmp/$id.json"
mv "$run/inbox/tmp/$id.json" "$run/inbox/new/$id.json"

receipt="$run/outbox/$id.json"
end=$(( $(date +%s) + ${PISUB_WAIT:-3} ))
while :; do
    if [ -f "$receipt" ]; then
        body=$(cat "$receipt")
        case $body in
            *'"state": "pending"'*) ;;
            *'"state": "delivered"'*) printf '%s\n' "$body"; exit 0 ;;
            *) printf '%s\n' "$body"; exit 2 ;;
        esac
    fi
    [ "$(date +%s)" -le "$end" ] || { printf 'no receipt for %s in time\n' "$id" >&2; exit 3; }
    sleep 0.05 2>/dev/null || sleep 1
done
