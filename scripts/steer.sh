#!/bin/sh
# Steer a pisub run without pisub: the reference for writing control files by hand.
#
#   scripts/steer.sh RUN_DIR MESSAGE [MODE]      MODE: steer (default) | follow_up | auto
#
# POSIX sh with printf, mv, cat, date and mktemp (and sleep between looks at the outbox; stat
# and setpriv when root steers another user's run). The request is created with mktemp in
# inbox/tmp/ and renamed into inbox/new/ (same filesystem: atomic), then the
# script waits up to $PISUB_WAIT seconds (default 3) for outbox/<id>.json to leave "pending"
# and prints it. A run that has finished (inbox/closed exists) takes no request.
# Exit: 0 delivered/queued/scheduled/recovered, 1 the request could not be written,
# 2 failed/rejected/partial (or the run has finished), 3 no answer in time.
[ $# -ge 2 ] || { printf 'usage: %s RUN_DIR MESSAGE [MODE]\n' "$0" >&2; exit 64; }
run=$1 msg=$2 mode=${3:-steer}
# Never write into another user's run as that user's superior: the run's owner controls its
# folders, and a symlink planted there would make root write anywhere. Re-run as the owner
# (the script is fed on stdin, so the owner need not be able to read this file).
owner=$(stat -c %u -- "$run" 2>/dev/null) || { printf 'not a run directory: %s\n' "$run" >&2; exit 1; }
if [ "$(id -u)" -eq 0 ] && [ "$owner" -ne 0 ]; then
    command -v setpriv >/dev/null 2>&1 || { printf 'setpriv is needed to write into uid %s'"'"'s run\n' "$owner" >&2; exit 1; }
    cd / && exec setpriv --reuid="$owner" --regid="$(stat -c %g -- "$run")" --clear-groups -- sh -s -- "$@" <"$0"
fi
case $mode in steer | follow_up | auto) ;; *) printf 'unknown mode: %s\n' "$mode" >&2; exit 64 ;; esac

# JSON string escaping: copy runs of plain characters at once, escape the rest.
nl='
'
ctl=$(printf '\001\002\003\004\005\006\007\010\011\013\014\015\016\017\020\021\022\023\024\025\026\027\030\031\032\033\034\035\036\037')
escape() {
    s=$1 out=
    while [ -n "$s" ]; do
        plain=${s%%[\\\"$ctl$nl]*}
        out=$out$plain
        s=${s#"$plain"}
        [ -n "$s" ] || break
        c=${s%"${s#?}"}
        s=${s#?}
        case $c in
            \\) out="$out\\\\" ;;
            \") out="$out\\\"" ;;
            "$nl") out="$out\\n" ;;
            *) out="$out$(printf '\\u%04x' "'$c")" ;;
        esac
    done
    printf '%s' "$out"
}

closed() {
    printf '{"requestId": null, "type": "steer", "state": "failed", "reason": "%s"}\n' "$1"
    exit 2
}

[ -e "$run/inbox/closed" ] && closed "the run has finished; it takes no more requests"
# A fresh, time-sortable, unguessable name, created exclusively (mktemp: never an existing file).
tmp=$(mktemp "$run/inbox/tmp/sh-$(date +%s)-$$-XXXXXXXX") || exit 1
id=${tmp##*/}
printf '{"v":1,"id":"%s","type":"steer","mode":"%s","message":"%s","source":"steer.sh"}\n' \
    "$id" "$mode" "$(escape "$msg")" > "$tmp" || exit 1
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
            *'"state": "delivered"'* | *'"state": "queued"'* | *'"state": "scheduled"'* | *'"state": "recovered"'*)
                printf '%s\n' "$body"; exit 0 ;;
            *) printf '%s\n' "$body"; exit 2 ;;
        esac
    fi
    [ "$(date +%s)" -le "$end" ] || { printf 'no receipt for %s in time\n' "$id" >&2; exit 3; }
    sleep 0.05 2>/dev/null || sleep 1
done
