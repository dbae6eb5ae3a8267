# A target that stops answering: LUN 5 is a dm-linear device over a loop file, suspended (`dmsetup
# suspend`) under verified writes, so LIO holds the commands without an answer. Each stall ends on
# the daemon's own log, not after a fixed time (the emulated guest is too noisy for a 1-2 s margin):
#  1. resumed 1 s after srp-ublk sent ABORT TASK (the oldest command unanswered for 30 s): LIO
#     answers the abort once the device resumes, the command is sent again -- no reconnect;
#  2. held until the channel went down: ABORT TASK unanswered for 5 s -> LOGICAL UNIT RESET,
#     unanswered for 5 s -> down -> reconnect, and what it held is sent again.
# fio's crc32c verify runs through both and must find nothing wrong.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh   # lab_export_lun
ublk_cleanup
modprobe loop 2>/dev/null; modprobe dm_mod 2>/dev/null
img=/tmp/slow.img
rm -f $img; truncate -s 64M $img
loopdev=$(losetup -f) && losetup "$loopdev" $img || fail "losetup $loopdev $img"
lab_dm_create lab-slow "0 131072 linear $loopdev 0" || fail "dmsetup create lab-slow"
unmap() {
    dmsetup resume lab-slow 2>/dev/null; lab_unexport_lun 5
    dmsetup remove lab-slow 2>/dev/null; losetup -d "$loopdev" 2>/dev/null; rm -f $img
}
trap 'dmsetup resume lab-slow 2>/dev/null; show_logs; ublk_cleanup; unmap' EXIT
lab_export_lun 5 /dev/mapper/lab-slow || fail "exporting lab-slow as LUN 5"
dev=$(ublk_add --queues 1 --lun 5 --reconnect-delay 2 --fast-io-fail-tmo 120 --dev-loss-tmo off) ||
    fail "srp-ublk add: $dev"
id=${dev#/dev/ublkb}
log=$(daemon_log "$id")
verify_start "$dev" 32m
sleep 5
# stall WHAT PATTERN: the LUN's device suspended under the writer until the daemon's log gets a new
# line matching PATTERN (bounded: 90 s), then 1 s more; says how long it held and when I/O came back
stall() {
    _n=$(wc -l < "$log")
    dmsetup suspend lab-slow || fail "dmsetup suspend"
    _t=$(now); _i=0
    until tail -n +$((_n + 1)) "$log" | grep -q "$2"; do
        [ $_i -ge 900 ] && { dmsetup resume lab-slow; fail "$1: no '$2' in the daemon's log within 90 s"; }
        sleep 0.1; _i=$((_i + 1))
    done
    _e=$(since "$_t"); sleep 1
    dmsetup resume lab-slow || fail "dmsetup resume"
    [ -f /tmp/fio-verify.done ] && fail "the writer stopped during the stall ($1): $(cat /tmp/fio-verify.txt)"
    _d=$(wait_io "$dev" 60) || fail "$1: no I/O within 60 s of the device resuming"
    _r=$(wait_running 60) || fail "$1: the queue not running 60 s after the resume: $(queue_states)"
    echo "$1: '$2' ${_e} s into the stall, resumed 1 s later; a 4 KiB read done ${_d} s after the resume, the queue running (state file: every 2 s) ${_r} s after that"
    sleep 5
}
stall "stall 1" "unanswered for 30 s: ABORT TASK"
expect_contains "the daemon's log after stall 1" "$(cat "$log")" "AbortTask done: tag"
expect_eq "reconnects after stall 1" "$(reconnects)" 0
stall "stall 2" "SRP channel down"
expect_contains "the daemon's log after stall 2" "$(cat "$log")" "ABORT TASK unanswered: LOGICAL UNIT RESET"
expect_contains "the daemon's log after stall 2" "$(cat "$log")" "LOGICAL UNIT RESET was unanswered"
i=0; while [ "$(reconnects)" = 0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done   # state file: every 2 s
expect_eq "reconnects after stall 2" "$(reconnects)" 1
verify_stop
grep -E "ABORT|RESET|AbortTask|LunReset|channel down|reconnected" "$log" | sed 's/^/daemon: /'
trap - EXIT
ublk_cleanup
unmap
