# The target drops the session (LIO's target port group disabled for 6 s, then enabled) under verified
# writes, twice: the queues see the disconnect, hold I/O, reconnect once the TPG is back; 0 verify errors.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup   # nothing left over from an earlier test may count in the queue states below
trap 'echo 1 > $SRP_TPG/enable; show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 2 --reconnect-delay 2 --fast-io-fail-tmo 90 --dev-loss-tmo 300) || fail "srp-ublk add: $dev"
verify_start "$dev" 64m
sleep 5
r0=$(reconnects)
for i in 1 2; do
    echo 0 > "$SRP_TPG/enable"
    sleep 6
    echo "drop $i: states while the TPG is disabled: $(queue_states)"
    echo 1 > "$SRP_TPG/enable"
    t=$(now)
    r=$(wait_running 60) || fail "drop $i: queues not running 60 s after the TPG came back: $(queue_states)"
    d=$(wait_io "$dev" 60) || fail "drop $i: no I/O within 60 s of the TPG coming back"
    echo "drop $i: every queue running ${r} s after the TPG came back (reconnect_delay 2 s), a 4 KiB read took ${d} s"
    sleep 4
done
verify_stop
r1=$(reconnects)
[ "$r1" -gt "$r0" ] || fail "no reconnect was counted (before $r0, after $r1)"
ok "$((r1 - r0)) reconnects"
r=$(wait_running 120) || fail "queues not running 120 s after the last drop: $(queue_states)"
expect_eq "queue states" "$(queue_states)" "running running "
trap - EXIT
ublk_cleanup
