# The target goes away for good (TPG disabled): a read is held, then fails with an error once
# fast_io_fail_tmo (6 s) has passed -- not before -- and the device disappears after dev_loss_tmo
# (20 s). Nothing hangs.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup   # nothing left over from an earlier test may count in the queue states below
trap 'echo 1 > $SRP_TPG/enable; show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 1 --reconnect-delay 2 --fast-io-fail-tmo 6 --dev-loss-tmo 20) || fail "srp-ublk add: $dev"
srp-ublk list | grep -q "fast_io_fail_tmo 6 dev_loss_tmo 20" || fail "list does not show the timers: $(srp-ublk list)"
t=$(now)
echo 0 > "$SRP_TPG/enable"
if dd if="$dev" of=/dev/null bs=4k count=1 iflag=direct 2>/tmp/dd.err; then fail "a read succeeded with the target gone"; fi
el=$(since "$t")
echo "read failed after ${el} s: $(cat /tmp/dd.err | head -1); states: $(queue_states)"
awk -v e="$el" 'BEGIN{exit !(e >= 5.5)}' || fail "I/O failed after ${el} s, before fast_io_fail_tmo (6 s)"
ok "I/O failed after ${el} s (fast_io_fail_tmo 6 s)"
i=0; while [ "$(queue_states)" != "fail-fast " ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done   # state file: every 2 s
expect_eq "queue state" "$(queue_states)" "fail-fast "
i=0; while [ -b "$dev" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
el=$(since "$t")
[ -b "$dev" ] && fail "$dev still exists ${el} s after the target went away (dev_loss_tmo 20 s)"
awk -v e="$el" 'BEGIN{exit !(e >= 19.5)}' || fail "the device went away after ${el} s, before dev_loss_tmo (20 s)"
ok "$dev removed after ${el} s (dev_loss_tmo 20 s)"
i=0; while [ -n "$(srp-ublk list --json | grep bdev)" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
expect_eq "srp-ublk list" "$(srp-ublk list)" "no srp-ublk devices or exports"
echo 1 > "$SRP_TPG/enable"
trap - EXIT
ublk_cleanup
