# The hostile SRP target's IU-level cases (examples/hostile_target.rs), each on a fresh device: an
# answer for a tag never sent, for a tag already answered, a second answer, an SRP_RSP whose sense
# length runs past the IU, credits that would overflow req_lim, a flood of CRED_REQ / AER_REQ, an
# AER_REQ to an idle queue, SRP_T_LOGOUT right after every login, no answer at all. For each: the
# data read back is what was written (or `add` fails and says why), the daemon lives and runs, and
# its log says what happened in a bounded number of lines. (A target that stops answering under I/O
# is lab test 37's, with LIO.)
. /usr/lib/srp-lab/suite/lib.sh
hostile_setup
HPID=
trap 'srp-ublk del --all >/dev/null 2>&1; [ -n "$HPID" ] && kill $HPID 2>/dev/null' EXIT
pattern /tmp/p 4
want=$(sha256sum < /tmp/p | cut -c1-64)

start() {   # start CASE: the hostile target with CASE, listening
    hostile-target --listen "$HT_ADDR" --case "$1" --mib 16 2> /tmp/ht-$1.err &
    HPID=$!
    _i=0; while ! grep -q listening /tmp/ht-$1.err && [ $_i -lt 50 ]; do sleep 0.1; _i=$((_i + 1)); done
}
stop() {    # stop CASE: remove the devices, stop the target, keep its log
    srp-ublk del --all >/dev/null 2>&1
    kill $HPID 2>/dev/null; wait $HPID 2>/dev/null; HPID=
    cp /tmp/ht-$1.err "$LAB_OUT/"
}

# case CASE NEEDLE: the attack happens on the first 64 KiB read; the data must come back intact
# and the daemon's log must contain NEEDLE
case_io() {
    start "$1"
    dev=$(srp-ublk add --target "$HT_TARGET" --queues 1 --depth 2 --reconnect-delay 1) ||
        { cat /tmp/ht-$1.err; fail "$1: add"; }
    dd if=/tmp/p of="$dev" bs=64k oflag=direct 2>/dev/null || fail "$1: writing the pattern"
    got=$(timeout 60 dd if="$dev" bs=64k iflag=direct 2>/dev/null | head -c 4194304 | sha256sum | cut -c1-64)
    log=$(daemon_log "${dev#/dev/ublkb}")
    states=$(queue_states)
    grep "hostile: $1" /tmp/ht-$1.err | head -2
    lines=$(wc -l < "$log")
    echo "$1: queues '$states', daemon log $lines lines:"; tail -n 6 "$log"
    expect_eq "$1: data read back" "$got" "$want"
    grep -q "hostile: $1" /tmp/ht-$1.err || fail "$1: the target did not attack"
    expect_contains "$1: daemon log" "$(cat "$log")" "$2"
    # `list` reads the state the daemon publishes about once a second
    wait_running 5 >/dev/null || fail "$1: queue states '$(queue_states)' 5 s after the I/O"
    ok "$1: the queue runs"
    [ "$lines" -lt 60 ] || fail "$1: the daemon logged $lines lines"
    stop "$1"
}

case_io wrong-tag "which has no command outstanding: ignored"
case_io stale-tag "which has no command outstanding: ignored"
case_io twice "which has no command outstanding: ignored"
case_io overlong "malformed IU from the target"
case_io credits "kept at 1048576"
case_io flood "asynchronous event from the target"

# an SRP_AER_REQ to a queue with nothing out (a queue leaves its CQ unarmed for a while after its
# last command): the daemon must still take it, within a few seconds and without further I/O
start idle-aer
dev=$(srp-ublk add --target "$HT_TARGET" --queues 1 --depth 2) || { cat /tmp/ht-idle-aer.err; fail "idle-aer: add"; }
dd if=/tmp/p of="$dev" bs=64k oflag=direct 2>/dev/null || fail "idle-aer: writing the pattern"
got=$(dd if="$dev" bs=64k iflag=direct 2>/dev/null | head -c 4194304 | sha256sum | cut -c1-64)
expect_eq "idle-aer: data read back" "$got" "$want"
_i=0; while ! grep -q "hostile: idle-aer" /tmp/ht-idle-aer.err && [ $_i -lt 100 ]; do sleep 0.1; _i=$((_i + 1)); done
grep "hostile: idle-aer" /tmp/ht-idle-aer.err || fail "idle-aer: the target sent no event"
t0=$(now); log=$(daemon_log "${dev#/dev/ublkb}")
_i=0; while ! grep -q "asynchronous event from the target" "$log" && [ $_i -lt 50 ]; do sleep 0.1; _i=$((_i + 1)); done
expect_contains "idle-aer: daemon log, $(since "$t0") s after the event" "$(cat "$log")" "asynchronous event from the target"
stop idle-aer

# T_LOGOUT after every login: the login's first command finds the channel logged out; add fails
# and says so, nothing is left behind
start logout
out=$(srp-ublk add --target "$HT_TARGET" --queues 1 --depth 2 --timeout 5 2>&1) &&
    fail "logout: add succeeded against a target that logs every login out: $out"
echo "logout: $out"
expect_contains "logout: add's error" "$out" "logged the channel out"
expect_eq "logout: devices left" "$(ls /dev/ublkb* 2>/dev/null | wc -l)" 0
grep -q "hostile: logout" /tmp/ht-logout.err || fail "logout: the target did not log out"
stop logout

# a target that accepts the login and never answers: add gives up after the setup command timeout
# (30 s) and says which command went unanswered
start silent
t0=$(now)
out=$(srp-ublk add --target "$HT_TARGET" --queues 1 --depth 2 2>&1) &&
    fail "silent: add succeeded against a target that answers nothing: $out"
echo "silent: after $(since "$t0") s: $out"
expect_contains "silent: add's error" "$out" "TEST UNIT READY failed on LUN 0"
expect_contains "silent: add's error" "$out" "no response within 30s"
expect_eq "silent: devices left" "$(ls /dev/ublkb* 2>/dev/null | wc -l)" 0
stop silent
trap - EXIT
