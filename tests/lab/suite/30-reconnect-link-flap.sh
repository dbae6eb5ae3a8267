# The rxe netdev goes down and up 5 times under verified writes: each time I/O is held (not failed),
# the queues reconnect when the link is back, and fio's crc32c verify finds nothing wrong.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup   # nothing left over from an earlier test may count in the queue states below
trap 'ip link set dummy0 up; show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 2 --reconnect-delay 2 --fast-io-fail-tmo 90 --dev-loss-tmo 300) || fail "srp-ublk add: $dev"
verify_start "$dev" 64m
sleep 5
for i in 1 2 3 4 5; do
    ip link set dummy0 down
    sleep 8
    ip link set dummy0 up
    t=$(now)
    r=$(wait_running 60) || fail "flap $i: queues not running 60 s after the link came back: $(queue_states)"
    d=$(wait_io "$dev" 120) || fail "flap $i: no I/O within 120 s of the link coming back"
    echo "flap $i: link down 8 s; every queue running ${r} s after up (reconnect_delay 2 s), a 4 KiB read took ${d} s; reconnects so far $(reconnects)"
    sleep 4
done
verify_stop
n=$(reconnects)
echo "reconnects: $n"
# a queue idle through a flap may only now find its channel dead (30 s stall rule) and reconnect
r=$(wait_running 120) || fail "queues not running 120 s after the last flap: $(queue_states)"
expect_eq "queue states after the flaps" "$(queue_states)" "running running "
trap - EXIT
ublk_cleanup
