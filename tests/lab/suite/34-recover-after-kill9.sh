# kill -9 of the daemon during verified writes, then `srp-ublk recover`: the device waits (quiesced)
# with the writer's I/O queued, the new daemon logs in and takes it over, the writer sees no error and
# fio's crc32c verify passes.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup   # nothing left over from an earlier test may count in the queue states below
trap 'show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 2) || fail "srp-ublk add: $dev"
id=${dev#/dev/ublkb}
verify_start "$dev" 64m
sleep 6
pid=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/ublkb$id.json" | grep -o '[0-9]*$')
kill -9 "$pid" || fail "cannot kill the daemon $pid"
t=$(now)
sleep 3
[ -b "$dev" ] || fail "$dev disappeared with its daemon"
[ -f /tmp/fio-verify.done ] && fail "the writer stopped while the daemon was dead: $(cat /tmp/fio-verify.txt)"
expect_contains "list with the daemon dead" "$(srp-ublk list)" "DAEMON GONE"
out=$(srp-ublk recover -n "$id") || fail "srp-ublk recover: $out"
expect_eq "recover prints the device" "$out" "$dev"
d=$(wait_io "$dev" 60) || fail "no I/O within 60 s of the recovery"
echo "recovered: a 4 KiB read done $(since "$t") s after the kill (it waited ${d} s)"
expect_contains "list after recovery" "$(srp-ublk list)" "running  pid"
sleep 6
verify_stop
out=$(srp-ublk recover -n "$id" 2>&1) && fail "recover of a live device succeeded: $out"
expect_contains "recover of a live device" "$out" "nothing to recover"
trap - EXIT
ublk_cleanup
