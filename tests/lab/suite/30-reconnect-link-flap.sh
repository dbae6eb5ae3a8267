# The rxe netdev goes down and up 5 times under verified writes: each time I/O is held (not failed),
# the queues reconnect when the link is back, and fio's crc32c verify finds nothing wrong. The
# daemon registered its buffers once, on one protection domain: the reconnects register nothing.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup   # nothing left over from an earlier test may count in the queue states below
trap 'ip link set dummy0 up; show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 2 --reconnect-delay 2 --fast-io-fail-tmo 90 --dev-loss-tmo 300) || fail "srp-ublk add: $dev"
verify_start "$dev" 64m
sleep 5
mem0=$(memory)
case "$mem0" in "1 protection domain(s), 2 data registration(s), "*) ok "memory: $mem0" ;;
    *) fail "memory after add: '$mem0' (want one protection domain and one pool per queue)" ;; esac
fault_down() { ip link set dummy0 down && sleep 8; }   # link down 8 s
fault_up() { ip link set dummy0 up; }
fault_cycles 5 flap "$dev" 120
fault_finish 0
expect_eq "memory after the reconnects" "$(memory)" "$mem0"
trap - EXIT
ublk_cleanup
