# The reference initiator: the kernel ib_srp attaches to the LIO LUN and a data round trip compares equal.
. /usr/lib/srp-lab/suite/lib.sh
trap 'lab-ref-detach' EXIT
dev=$(lab-ref-attach) || fail "lab-ref-attach failed"
ok "ib_srp attached as $dev"
expect_eq "LUN size in bytes" "$(($(cat /sys/block/${dev#/dev/}/size) * 512))" "$SRP_LUN_BYTES"
pattern /tmp/pat 8
dd if=/tmp/pat of="$dev" bs=1M seek=3 oflag=direct conv=fsync 2>/dev/null || fail "write to $dev"
dd if="$dev" of=/tmp/rb bs=1M skip=3 count=8 iflag=direct 2>/dev/null || fail "read from $dev"
want=$(sha256sum < /tmp/pat | cut -c1-64); got=$(sha256sum < /tmp/rb | cut -c1-64)
expect_eq "sha256 of 8 MiB read back through $dev" "$got" "$want"
lab-ref-detach || fail "lab-ref-detach left a session behind"
trap - EXIT
[ ! -b "$dev" ] || fail "$dev still present after detach"
ok "detached"
