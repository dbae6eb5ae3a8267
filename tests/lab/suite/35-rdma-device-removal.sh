# The RDMA device is removed and comes back (rdma link delete rxe0 / rdma link add) under verified
# writes, three times. The daemon releases its channels at once; librdmacm keeps a handle of its own on every
# device it has used until the process image ends, and the kernel finishes a removal only when every
# handle is closed, so the daemon then replaces its image (execve: same pid, every descriptor closed)
# with one that takes the ublk device over by user recovery, its channels down, and logs them in when
# the device is back. The delete must finish, the writer sees no error, fio's crc32c verify passes.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh
ublk_cleanup   # nothing left over from an earlier test may count in the queue states below
trap 'lab_port_restore; show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 2 --reconnect-delay 2 --fast-io-fail-tmo 90 --dev-loss-tmo 300) || fail "srp-ublk add: $dev"
id=${dev#/dev/ublkb}
pid=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/ublkb$id.json" | grep -o '[0-9]*$')
verify_start "$dev" 64m
sleep 5
r0=$(reconnects)
fault_down() {   # rxe0 deleted (bounded: the delete waits for every user of the device), gone 5 s
    _t=$(now)
    rdma link delete rxe0 & _p=$!
    _i=0; while kill -0 $_p 2>/dev/null && [ $_i -lt 600 ]; do sleep 0.1; _i=$((_i + 1)); done
    kill -0 $_p 2>/dev/null && { thread_dump; fail "removal $1: rdma link delete rxe0 did not finish within 60 s (a user kept the device)"; }
    wait $_p || fail "removal $1: rdma link delete rxe0 failed"
    echo "removal $1: rdma link delete took $(since "$_t") s; states: $(queue_states)"
    lab_target_port_remove "$SRP_TPG"
    sleep 5
    [ -f /tmp/fio-verify.done ] && fail "removal $1: the writer stopped: $(cat /tmp/fio-verify.txt)"
    expect_contains "removal $1: list while the device is gone" "$(srp-ublk list)" "blocked"
}
fault_up() {   # rxe0 back (same MAC: same GID), the LIO port configured again
    lab_port_back
}
fault_cycles 3 removal "$dev" 60
fault_finish "$r0"
log=$(daemon_log "$id")
expect_eq "the daemon's pid after the handovers" \
    "$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/ublkb$id.json" | grep -o '[0-9]*$')" "$pid"
grep -E "removed|handing|taking|holding|reconnected" "$log" | sed 's/^/daemon: /'
expect_eq "handovers in the daemon's log" "$(grep -c "handing $dev over" "$log")" 3
expect_eq "takeovers in the daemon's log" "$(grep -c "taking $dev over" "$log")" 3
trap - EXIT
ublk_cleanup
