# Sourced by suite tests: small helpers. Tests assert on data, not only on exit codes.
set -u
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
ok() { echo "ok: $*"; }
# expect_eq WHAT GOT WANT
expect_eq() { [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"; ok "$1 = $3"; }
# expect_contains WHAT HAYSTACK NEEDLE
expect_contains() { case "$2" in *"$3"*) ok "$1 contains '$3'";; *) fail "$1 does not contain '$3': $2";; esac; }
# pattern FILE MIB: random bytes to write and compare
pattern() { dd if=/dev/urandom of="$1" bs=1M count="$2" 2>/dev/null; }
# nbd_serve SOCK NAME [ARGS...]: srp-ublk serve of the lab LUN (or of target $NBD_TARGET) on unix
# socket SOCK as export NAME in the background (pid in $SRV, stdout/stderr in /tmp/serve.out /
# /tmp/serve.err), once it listens
nbd_serve() {
    _sock=$1; _name=$2; shift 2
    # an earlier serve's output goes first (the redirection truncates it only once the job runs)
    rm -f /tmp/serve.out
    srp-ublk serve --nbd "unix:$_sock" --name "$_name" --target "${NBD_TARGET:-$SRP_TARGET}" "$@" \
        > /tmp/serve.out 2> /tmp/serve.err &
    SRV=$!
    _i=0; while ! grep -q serving /tmp/serve.out && [ $_i -lt 300 ]; do sleep 0.1; _i=$((_i + 1)); done
    grep -q "serving NBD export '$_name'" /tmp/serve.out || fail "serve did not start: $(cat /tmp/serve.err)"
}
# vhost_serve TARGET [ARGS...]: srp-ublk serve --vhost-user-blk of TARGET on /run/srp-ublk/vm0.sock
# in the background (pid in $VPID, its log in /tmp/vhost.log), once it listens
vhost_serve() {
    _t=$1; shift
    mkdir -p /run/srp-ublk
    srp-ublk serve --vhost-user-blk /run/srp-ublk/vm0.sock --target "$_t" "$@" > /tmp/vhost.log 2>&1 &
    VPID=$!
    _i=0; while ! grep -q "serving vhost-user-blk" /tmp/vhost.log && [ $_i -lt 600 ]; do sleep 0.1; _i=$((_i + 1)); done
    grep -q "serving vhost-user-blk" /tmp/vhost.log || { cat /tmp/vhost.log; fail "serve --vhost-user-blk did not start"; }
}
# package_gone HOW FILES: after the package's removal by HOW (purge, rpm -e): none of FILES (its
# files, one a line) left, no /etc/srp-ublk or /run/srp-ublk, no srp-ublk unit enabled or known to
# systemd, no srp-ublk process
package_gone() {
    _left=$(echo "$2" | while read -r f; do [ -e "$f" ] && echo "$f"; done)
    [ -z "$_left" ] || fail "$1 left files of the package: $_left"
    ok "$1 removed all $(echo "$2" | wc -l) files"
    [ -e /etc/srp-ublk ] && fail "$1 left /etc/srp-ublk: $(ls -R /etc/srp-ublk)"
    [ -e /run/srp-ublk ] && fail "$1 left /run/srp-ublk"
    _links=$(find /etc/systemd/system -name 'srp-ublk*' 2>/dev/null)
    [ -z "$_links" ] || fail "$1 left units enabled: $_links"
    _units=$(systemctl list-unit-files --no-legend 'srp-ublk*' 2>/dev/null)
    [ -z "$_units" ] || fail "systemd still knows srp-ublk units after $1: $_units"
    pidof srp-ublk >/dev/null && fail "srp-ublk processes run after $1: $(pidof srp-ublk)"
    ok "$1: no unit known or enabled, no process, no /etc/srp-ublk or /run/srp-ublk"
}
# srp-ublk helpers
# ublk_add [ARGS...]: srp-ublk add on the lab target; prints the device path
ublk_add() { srp-ublk add --target "$SRP_TARGET" "$@"; }
# ublk_cleanup: delete every srp-ublk device and the reference session (for traps)
ublk_cleanup() { srp-ublk del --all >/dev/null 2>&1; lab-ref-detach >/dev/null 2>&1; true; }
# show_logs: the daemon logs, for failure diagnosis
show_logs() { for f in /run/srp-ublk/logs/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done; }
# sha FILE-or-DEV [SKIP_MIB COUNT_MIB]: sha256 of a range read with O_DIRECT
sha_range() { dd if="$1" bs=1M skip="$2" count="$3" iflag=direct 2>/dev/null | sha256sum | cut -c1-64; }
# cross_check DEV OTHER: two initiators' devices on the same LUN: 16 MiB written through DEV read
# back identical through OTHER (at 32 MiB), and 16 MiB written through OTHER through DEV (at 64 MiB)
cross_check() {
    pattern /tmp/a 16
    dd if=/tmp/a of="$1" bs=1M seek=32 oflag=direct conv=fsync 2>/dev/null || fail "write via $1"
    expect_eq "$1 -> $2" "$(sha_range "$2" 32 16)" "$(sha256sum < /tmp/a | cut -c1-64)"
    pattern /tmp/b 16
    dd if=/tmp/b of="$2" bs=1M seek=64 oflag=direct conv=fsync 2>/dev/null || fail "write via $2"
    expect_eq "$2 -> $1" "$(sha_range "$1" 64 16)" "$(sha256sum < /tmp/b | cut -c1-64)"
}
# fio_verified OUT: fio's output OUT shows no verify failure and no I/O error
fio_verified() {
    grep -qi 'verify.*fail\|bad magic\|crc32c: verify failed\|bad header' "$1" && fail "verify failures"
    grep -q 'err= 0' "$1" || fail "fio reported I/O errors"
}
# reliability helpers (tests 30-3x)
now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN{printf "%.1f", a-b}'; }
# queue_states: the queues' link states of every srp-ublk device, e.g. "running running"
queue_states() { srp-ublk list 2>/dev/null | sed -n 's/^ *q[0-9]* channel \([a-z-]*\) via.*/\1/p' | tr '\n' ' '; }
# daemon_log ID: the log file of /dev/ublkbID's daemon (from its state file)
daemon_log() { grep -o '"log": *"[^"]*"' "/run/srp-ublk/ublkb$1.json" | cut -d'"' -f4; }
# memory: what the devices' daemons registered ("1 protection domain(s), 2 data registration(s), ...")
memory() { srp-ublk list 2>/dev/null | sed -n 's/^ *memory //p' | tr '\n' ' '; }
reconnects() { srp-ublk list 2>/dev/null | sed -n 's/.* reconnects \([0-9]*\)$/\1/p' | awk '{s+=$1} END{print s+0}'; }
# wait_running SECS: until every queue of every device is running; prints how long it took
wait_running() {
    _t=$(now); _i=0
    while [ $_i -lt $(($1 * 10)) ]; do
        case " $(queue_states)" in *" blocked"*|*" fail-fast"*|*" lost"*) ;; *) since "$_t"; return 0;; esac
        sleep 0.1; _i=$((_i + 1))
    done
    return 1
}
# wait_io DEV SECS: one 4 KiB O_DIRECT read; prints how long it took (it waits behind held I/O)
wait_io() { _t=$(now); timeout "$2" dd if="$1" of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null || return 1; since "$_t"; }
# fault_cycles N WHAT DEV IO_SECS: N times, fault_down I then fault_up I (functions the test defines:
# inject the fault and hold it; end it), then wait, bounded, for every queue to run (60 s) and for a
# 4 KiB read (IO_SECS), and say how long each took
fault_cycles() {
    _c=1
    while [ $_c -le "$1" ]; do
        fault_down $_c || fail "$2 $_c: injecting the fault"
        fault_up $_c || fail "$2 $_c: ending the fault"
        _r=$(wait_running 60) || { thread_dump; fail "$2 $_c: queues not running 60 s after the fault ended: $(queue_states)"; }
        _d=$(wait_io "$3" "$4") || fail "$2 $_c: no I/O within $4 s of the fault ending"
        echo "$2 $_c: every queue running ${_r} s after the fault ended (reconnect_delay 2 s), a 4 KiB read took ${_d} s; reconnects so far $(reconnects)"
        sleep 4
        _c=$((_c + 1))
    done
}
# fault_finish R0: stops the verifying fio (failing on any error), checks that reconnects were counted
# since R0 and that every queue runs again (waiting, bounded, for one still reconnecting: a queue idle
# through the fault may only now find its channel dead)
fault_finish() {
    verify_stop
    _r1=$(reconnects)
    [ "$_r1" -gt "$1" ] || fail "no reconnect was counted (before $1, after $_r1)"
    ok "$((_r1 - $1)) reconnects"
    wait_running 120 >/dev/null || fail "queues not running 120 s after the last fault: $(queue_states)"
    expect_eq "queue states after the faults" "$(queue_states)" "running running "
}
# verify_start DEV SIZE: fio writing and verifying (crc32c) in the background until verify_stop.
# io_uring, not libaio: twice (after link flaps, after a daemon kill and recover) a libaio fio sat in
# io_getevents for minutes with nothing in flight anywhere (blk-mq empty, tags free, the daemon idle
# with every credit back) until a signal interrupted the wait and it found its completion: the
# kernel's aio wakeup, not the device.
verify_start() {
    rm -f /tmp/fio-verify.done
    ( fio --name=v --filename="$1" --ioengine=io_uring --direct=1 --rw=randwrite --bsrange=4k-64k \
        --iodepth=16 --size="$2" --loops=1000 --time_based --runtime=3600 \
        --verify=crc32c --verify_backlog=256 --verify_fatal=1 --do_verify=1 \
        --output=/tmp/fio-verify.txt; echo $? > /tmp/fio-verify.done ) &
}
# thread_dump: every srp-ublk thread's user stack (eu-stack) and kernel stack, for a daemon that
# stopped making progress
thread_dump() {
    for p in $(pidof srp-ublk); do
        echo "--- srp-ublk pid $p: user stacks"; eu-stack -p "$p" 2>&1 | head -120
        for t in /proc/$p/task/*; do
            echo "== $t $(cat "$t/comm") $(cat "$t/wchan") syscall $(cut -d' ' -f1 "$t/syscall")"; head -8 "$t/stack"
        done
    done
}
# stuck_dump: where a writer that does not finish is waiting: blk-mq's view of every ublk disk (in
# flight, dispatch lists, requeue list, queue flags), fio's kernel stacks and srp-ublk's own state
stuck_dump() {
    echo "--- stuck: blk-mq state"
    for d in /sys/block/ublkb*; do
        n=$(basename "$d"); echo "== $n inflight $(cat "$d/inflight")"
        q=/sys/kernel/debug/block/$n
        for f in "$q/state" "$q/requeue_list" "$q"/hctx*/state "$q"/hctx*/dispatch "$q"/hctx*/busy \
                 "$q"/hctx*/flags "$q"/hctx*/tags "$q"/hctx*/ctx_map "$q"/hctx*/cpu*/*_rq_list; do
            [ -r "$f" ] && [ -n "$(cat "$f" 2>/dev/null)" ] && { echo "$f:"; sed 's/^/    /' "$f" | head -20; }
        done
    done
    stuck_tasks_dump
}
# nbd_stuck_dump FIO_OUTPUT: the same for an NBD client (fio's nbd engine) that does not finish: both
# ends' unix socket queues (bytes one side wrote and the other has not read), then the tasks, then
# fio's own status
nbd_stuck_dump() {
    echo "--- stuck: unix sockets (Recv-Q Send-Q, with their processes)"
    ss -xpn 2>&1 | grep -E 'fio|srp-ublk|Recv-Q'
    stuck_tasks_dump
    echo "--- fio status"; tail -n 40 "$1"
}
# stuck_tasks_dump: fio's kernel and user stacks (and SIGUSR1: its status), srp-ublk's threads, list,
# logs and dmesg
stuck_tasks_dump() {
    echo "--- stuck: fio tasks"
    for p in $(pidof fio); do
        for t in /proc/$p/task/*; do echo "== fio $t $(cat "$t/wchan")"; head -8 "$t/stack"; done
        echo "--- fio $p user stacks"; eu-stack -p "$p" 2>&1 | head -80
    done
    kill -USR1 $(pidof fio) 2>/dev/null; sleep 1
    thread_dump; srp-ublk list; show_logs; dmesg | tail -n 30
}
# verify_stop: stop the background fio; fails the test on any fio or verify error
verify_stop() {
    [ -f /tmp/fio-verify.done ] && { cat /tmp/fio-verify.txt; fail "fio stopped early (exit $(cat /tmp/fio-verify.done))"; }
    killall -INT fio 2>/dev/null
    # fio stops after its outstanding I/O completes; after a fault that can be a stalled channel's
    # 30 s limit plus a reconnect
    _i=0; while [ ! -f /tmp/fio-verify.done ] && [ $_i -lt 2400 ]; do sleep 0.1; _i=$((_i + 1)); done
    [ -f /tmp/fio-verify.done ] || stuck_dump
    cat /tmp/fio-verify.txt; cp /tmp/fio-verify.txt "$LAB_OUT/$(basename "$0" .sh)-fio.txt"
    [ -f /tmp/fio-verify.done ] || fail "fio did not stop within 240 s of SIGINT (I/O stuck?)"
    fio_verified /tmp/fio-verify.txt
    _w=$(grep -o 'WRITE: bw=[^,]*, [^,]*, io=[^ ,]*' /tmp/fio-verify.txt | sed 's/.*io=//')
    ok "fio verify: 0 errors, $_w written and verified"
}
# lab_dm_create NAME TABLE...: a device-mapper device with its /dev/mapper/NAME node (the busybox
# guest runs no udev, which dmsetup would otherwise leave the node to); the table is read from stdin
# when none is given
lab_dm_create() {
    _n=$1; shift
    if [ $# -gt 0 ]; then dmsetup create "$_n" --table "$*"; else dmsetup create "$_n"; fi &&
        dmsetup mknodes "$_n" && [ -b "/dev/mapper/$_n" ]
}
# hostile_setup: the hostile SRP target's address on rxe0 (port 5556) and a target string for it
# (HT_ADDR, HT_TARGET); fails when the guest has no hostile-target
hostile_setup() {
    command -v hostile-target >/dev/null ||
        fail "no hostile-target in the guest: build it (cargo build --release --features lab-target --example hostile_target; just build does)"
    HT_ADDR=$(echo "$SRP_TARGET" | sed "s/.*dest=\([0-9.]*\):.*/\1/"):5556
    HT_TARGET="id_ext=0000000000000001,ioc_guid=0000000000000001,dest=$HT_ADDR"
}
