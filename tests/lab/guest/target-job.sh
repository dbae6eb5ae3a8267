#!/bin/sh
# The job of the target guest of a pair (lab.sh pair): hand the target's environment (SRP_TARGET,
# the service GUID) to the host, which gives it to the initiator guest, then serve until the host
# says stop (a file in the share, once the initiator guest is done), copying its /proc/stat's CPU
# line to the share both guests mount (/lab-pair) as it goes, and answering the initiator guest's
# requests there (lab-target: a profile of this guest, a perftest server).
cp /tmp/lab-env "$LAB_OUT/target-env" || exit 1
echo "target guest: serving $(. /tmp/lab-env; echo "$SRP_TARGET") until the host says stop"
S=/lab-pair
# serve ID REQUEST...: one request, in the background; its status goes to $S/req.ID.done
serve() {
    _id=$1; shift
    case $1 in
        prof)
            lab-prof record "$2" "/tmp/prof.$_id" &
            _pp=$!
            # recording once perf has written its header: the initiator guest starts its run then
            while kill -0 $_pp 2>/dev/null && [ ! -s "/tmp/prof.$_id" ]; do sleep 0.1; done
            sleep 0.2; : > "$S/$3.recording"
            wait $_pp && lab-prof fold "/tmp/prof.$_id" > "$S/$3.samples" && [ -s "$S/$3.samples" ] &&
                lab-prof modules > "$S/$3.modules"
            _rc=$?; rm -f "/tmp/prof.$_id";;
        serve)
            _t=$2; shift 2
            case $_t in
                ib_write_bw|ib_read_bw|ib_send_lat)
                    "$_t" -d "${LAB_RDMA_DEV:-rxe0}" "$@" > "$S/serve.$_t.txt" 2>&1 &
                    sleep 1
                    kill -0 $! 2>/dev/null; _rc=$?;;
                *) _rc=2;;
            esac;;
        *) _rc=2;;
    esac
    rm -f "$S/req.$_id.run"
    echo "$_rc" > "$S/req.$_id.done"
}
# The loop forks nothing while idle (the shell's own read, echo and glob; a read with a timeout on a
# fifo nobody writes for its sleep): a fork and exec on this emulated CPU costs milliseconds, which
# would count in the target guest's CPU per I/O. A reader can find the stat file empty between the
# truncation and the write (counters.sh reads it again then).
mkfifo /tmp/tick && exec 3<> /tmp/tick || exit 1
while [ ! -e /lab/stop ]; do
    read -r line < /proc/stat
    echo "$line" > $S/stat
    for r in "$S"/req.*; do
        case $r in *.new|*.done|*.run|*"req.*") continue;; esac
        id=${r#"$S/req."}
        mv "$r" "$r.run" || continue
        read -r req < "$r.run"
        echo "target guest: request $id: $req"
        # shellcheck disable=SC2086 # the request's words are its arguments
        serve "$id" $req &
    done
    read -t 0.2 -u 3 _
done
echo "target guest: stopping"
