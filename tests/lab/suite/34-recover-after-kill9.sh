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
ublk_cleanup
# a device whose requests are larger than today's default largest I/O (made with max_sect=1024, as an
# older srp-ublk made every device: 512 KiB), recovered from a state file that no longer says so: the
# new daemon's tag buffers must hold what the device sends (the device's own size), else the kernel
# copies 512 KiB requests into 128 KiB buffers
dev=$(srp-ublk add --target "$SRP_TARGET,max_sect=1024" --queues 1) || fail "add with max_sect=1024: $dev"
id=${dev#/dev/ublkb}
expect_eq "largest I/O (KiB)" "$(cat /sys/block/ublkb$id/queue/max_hw_sectors_kb)" 512
pid=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/ublkb$id.json" | grep -o '[0-9]*$')
kill -9 "$pid" || fail "cannot kill the daemon $pid"
sed -i 's/,max_sect=1024//' "/run/srp-ublk/ublkb$id.json"
grep -q max_sect "/run/srp-ublk/ublkb$id.json" && fail "the state file still names max_sect"
sleep 2
out=$(srp-ublk recover -n "$id") || fail "srp-ublk recover: $out"
pattern /tmp/p34 8
dd if=/tmp/p34 of="$dev" bs=512k seek=2 oflag=direct conv=fsync 2>/tmp/dd34 || fail "512 KiB writes after recovery: $(cat /tmp/dd34)"
expect_eq "8 MiB in 512 KiB requests read back" "$(dd if="$dev" bs=512k skip=2 count=16 iflag=direct 2>/dev/null | sha256sum | cut -c1-64)" \
    "$(sha256sum < /tmp/p34 | cut -c1-64)"
pidof srp-ublk >/dev/null || fail "the recovered daemon is gone"
trap - EXIT
ublk_cleanup
