# A LUN grown on the target: LIO exports a loop device (iblock) as LUN 4, the file behind it grows
# and `losetup -c` makes the loop device bigger, so LIO's READ CAPACITY says so (it sends no unit
# attention for it). `srp-ublk resize` has the daemon re-read the capacity: on a kernel whose ublk
# has UPDATE_SIZE (6.16) the device grows, keeps its data, and the new blocks read back what is
# written to them; on an older one the command fails, naming the new size and what to do, `list`
# shows the size waiting, and the device keeps serving its old size.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh   # lab_export_lun
ublk_cleanup
modprobe loop 2>/dev/null
img=/tmp/grow.img
rm -f $img; truncate -s 16M $img
loopdev=$(losetup -f) && losetup "$loopdev" $img || fail "losetup $loopdev $img"
unmap() { lab_unexport_lun 4; losetup -d "$loopdev" 2>/dev/null; rm -f $img; }
trap 'show_logs; ublk_cleanup; unmap' EXIT
lab_export_lun 4 "$loopdev" || fail "exporting $loopdev as LUN 4"
dev=$(ublk_add --queues 2 --lun 4) || fail "srp-ublk add: $dev"
id=${dev#/dev/ublkb}
expect_eq "size before" "$(blockdev --getsize64 "$dev")" $((16 << 20))
dd if=/dev/urandom of=/tmp/first bs=1M count=4 2>/dev/null; dd if=/tmp/first of="$dev" bs=1M oflag=direct 2>/dev/null || fail "write"
out=$(srp-ublk resize -n "$id") || fail "resize with the LUN unchanged: $out"
expect_eq "resize with the LUN unchanged" "$out" "$dev: capacity unchanged, $((16 << 20)) bytes"
truncate -s 32M $img && losetup -c "$loopdev" || fail "growing $loopdev"
expect_eq "the loop device behind LUN 4" "$(blockdev --getsize64 "$loopdev")" $((32 << 20))
kv=$(uname -r | cut -d- -f1); major=${kv%%.*}; minor=$(echo "$kv" | cut -d. -f2)
echo "kernel $kv; $(srp-ublk features | grep '^ublk')"
if [ "$major" -gt 6 ] || { [ "$major" -eq 6 ] && [ "$minor" -ge 16 ]; }; then
    out=$(srp-ublk resize -n "$id") || fail "resize: $out"
    expect_eq "resize" "$out" "$dev: resized from $((16 << 20)) to $((32 << 20)) bytes"
    expect_eq "size after" "$(blockdev --getsize64 "$dev")" $((32 << 20))
    dd if=/dev/urandom of=/tmp/tail bs=1M count=4 2>/dev/null
    dd if=/tmp/tail of="$dev" bs=1M seek=28 oflag=direct 2>/dev/null || fail "writing the new blocks"
    expect_eq "the new blocks read back" "$(dd if="$dev" bs=1M skip=28 count=4 iflag=direct 2>/dev/null | sha256sum)" "$(sha256sum < /tmp/tail)"
    expect_eq "the new blocks on the target" "$(dd if=$img bs=1M skip=28 count=4 2>/dev/null | sha256sum)" "$(sha256sum < /tmp/tail)"
    expect_contains "list" "$(srp-ublk list)" "32 MiB"
else
    out=$(srp-ublk resize -n "$id" 2>&1) && fail "resize succeeded on a kernel without UPDATE_SIZE: $out"
    expect_contains "resize without UPDATE_SIZE" "$out" "now has $((32 << 20)) bytes, but this kernel's ublk cannot resize a live device"
    expect_contains "list" "$(srp-ublk list)" "capacity now 32 MiB on the target"
    expect_eq "size after" "$(blockdev --getsize64 "$dev")" $((16 << 20))
fi
expect_eq "the data before the resize" "$(dd if="$dev" bs=1M count=4 iflag=direct 2>/dev/null | sha256sum)" "$(sha256sum < /tmp/first)"
trap - EXIT
ublk_cleanup
unmap
