#!/bin/sh
# Steer a pisub run without pisub: the reference for writing control files by hand.
#
#   scripts/steer.sh RUN_DIR MESSAGE [MODE]      MODE: steer (default) | follow_up | auto
#
# POSIX sh with printf, mv, cat and date (and sleep between looks at the outbox). The request
# is written in inbox/tmp/ and renamed into inbox/new/ (same filesystem: atomic), then the
# script waits up to $PISUB_WAIT seconds (default 3) for outbox/<id>.json to leave "pending"
# and prints it. Exit: 0 delivered/queued/scheduled/recovered, 2 failed/rejected/partial,
# 3 no answer in time.
set -eu
[ $# -ge 2 ] || { printf 'usage: %s RUN_DIR MESSAGE [MODE]\n' "$0" >&2; exit 64; }
run=$1 msg=$2 mode=${3:-steer}

nl='
'
tab=$(printf '\t')
cr=$(printf '\r')
escape() {  # JSON string body: backslash, quote, newline, tab, carriage return
    s=$1 out=
    while [ -n "$s" ]; do
        c=${s%"${s#?}"}
        s=${s#?}
        case $c in
            \\) out="$out\\\\" ;;
            \") out="$out\\\"" ;;
            "$nl") out="$out\\n" ;;
            "$tab") out="$out\\t" ;;
            "$cr") out="$out\\r" ;;
            *) out="$out$c" ;;
        esac
    done
    printf '%s' "$out"
}

id="sh-$(date +%s)-$$"
printf '{"v":1,"id":"%s","type":"steer","mode":"%s","message":"%s","source":"steer.sh"}\n' \
    "$id" "$mode" "$(escape "$msg")" > "$run/inbox/tmp/$id.json"
mv "$run/inbox/tmp/$id.json" "$run/inbox/new/$id.json"

receipt="$run/outbox/$id.json"
end=$(( $(date +%s) + ${PISUB_WAIT:-3} ))
while :; do
    if [ -f "$receipt" ]; then
        body=$(cat "$receipt")
        case $body in
            *'"state": "pending"'*) ;;
            *'"state": "delivered"'* | *'"state": "queued"'* | *'"state": "scheduled"'* | *'"state": "recovered"'*)
                printf '%s\n' "$body"; exit 0 ;;
            *) printf '%s\n' "$body"; exit 2 ;;
        esac
    fi
    [ "$(date +%s)" -le "$end" ] || { printf 'no receipt for %s in time\n' "$id" >&2; exit 3; }
    sleep 0.05 2>/dev/null || sleep 1
done
