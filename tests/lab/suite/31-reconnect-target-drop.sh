# The target drops the session (LIO's target port group disabled for 6 s, then enabled) under verified
# writes, twice: the queues see the disconnect, hold I/O, reconnect once the TPG is back; 0 verify errors.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup   # nothing left over from an earlier test may count in the queue states below
trap 'echo 1 > $SRP_TPG/enable; show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 2 --reconnect-delay 2 --fast-io-fail-tmo 90 --dev-loss-tmo 300) || fail "srp-ublk add: $dev"
verify_start "$dev" 64m
sleep 5
r0=$(reconnects)
fault_down() {   # the TPG disabled for 6 s
    echo 0 > "$SRP_TPG/enable" && sleep 6 && echo "drop $1: states while the TPG is disabled: $(queue_states)"
}
fault_up() { echo 1 > "$SRP_TPG/enable"; }
fault_cycles 2 drop "$dev" 60
fault_finish "$r0"
trap - EXIT
ublk_cleanup
