#!/bin/sh
# Stop a pisub run without pisub (see steer.sh for the protocol).
#
#   scripts/stop.sh RUN_DIR
#
# Exit: 0 delivered, 1 the request could not be written, 2 failed/rejected (or the run has
# finished), 3 no answer within $PISUB_WAIT seconds (default 3).
[ $# -ge 1 ] || { printf 'usage: %s RUN_DIR\n' "$0" >&2; exit 64; }
run=$1
# Never write into another user's run as that user's superior: the run's owner controls its
# folders, and a symlink planted there would make root write anywhere. Re-run as the owner
# (the script is fed on stdin, so the owner need not be able to read this file).
owner=$(stat -c %u -- "$run" 2>/dev/null) || { printf 'not a run directory: %s\n' "$run" >&2; exit 1; }
if [ "$(id -u)" -eq 0 ] && [ "$owner" -ne 0 ]; then
    command -v setpriv >/dev/null 2>&1 || { printf 'setpriv is needed to write into uid %s'"'"'s run\n' "$owner" >&2; exit 1; }
    cd / && exec setpriv --reuid="$owner" --regid="$(stat -c %g -- "$run")" --clear-groups -- sh -s -- "$@" <"$0"
fi

closed() {
    printf '{"requestId": null, "type": "stop", "state": "failed", "reason": "%s"}\n' "$1"
    exit 2
}

[ -e "$run/inbox/closed" ] && closed "the run has finished; it takes no more requests"
# A fresh, time-sortable, unguessable name, created exclusively (mktemp: never an existing file).
tmp=$(mktemp "$run/inbox/tmp/sh-$(date +%s)-$$-XXXXXXXX") || exit 1
id=${tmp##*/}
printf '{"v":1,"id":"%s","type":"stop","source":"stop.sh"}\n' "$id" > "$tmp" || exit 1
mv "$tmp" "$run/inbox/new/$id.json" || exit 1
if [ -e "$run/inbox/closed" ] && mv "$run/inbox/new/$id.json" "$run/inbox/tmp/$id.withdrawn" 2>/dev/null; then
    closed "the run finished while the request was written; it was withdrawn"
fi

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
