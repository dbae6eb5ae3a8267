# add --backend mem:SIZE / null:SIZE: the ublk front end alone, without SRP (for benchmarks and demos).
. /usr/lib/srp-lab/suite/lib.sh
trap 'show_logs; ublk_cleanup' EXIT
dev=$(srp-ublk add --backend mem:64M --queues 2) || fail "add --backend mem: $dev"
expect_eq "mem size" "$(($(cat /sys/block/${dev#/dev/}/size) * 512))" $((64 << 20))
pattern /tmp/m 4
dd if=/tmp/m of="$dev" bs=1M seek=10 oflag=direct conv=fsync 2>/dev/null || fail "write"
expect_eq "mem read back" "$(sha_range "$dev" 10 4)" "$(sha256sum < /tmp/m | cut -c1-64)"
expect_contains "list" "$(srp-ublk list)" "demo, not storage"
srp-ublk del -n ${dev#/dev/ublkb} || fail "del"
dev=$(srp-ublk add --backend null:64M) || fail "add --backend null: $dev"
dd if=/tmp/m of="$dev" bs=1M oflag=direct 2>/dev/null || fail "write to null"
expect_eq "null reads zeros" "$(sha_range "$dev" 0 4)" "$(dd if=/dev/zero bs=1M count=4 2>/dev/null | sha256sum | cut -c1-64)"
srp-ublk del -n ${dev#/dev/ublkb} || fail "del"
# --ublk-batch: ublk's batch I/O commands where the kernel has them, else a refusal that says so
if srp-ublk features | grep -q 'batch I/O commands: yes'; then
    dev=$(srp-ublk add --backend mem:64M --ublk-batch) || fail "add --ublk-batch: $dev"
    dd if=/tmp/m of="$dev" bs=1M seek=10 oflag=direct conv=fsync 2>/dev/null || fail "write (batch)"
    expect_eq "mem read back (batch)" "$(sha_range "$dev" 10 4)" "$(sha256sum < /tmp/m | cut -c1-64)"
else
    out=$(srp-ublk add --backend null:64M --ublk-batch 2>&1) && fail "--ublk-batch accepted on $(uname -r): $out"
    expect_contains "--ublk-batch refused" "$out" "no batch I/O commands (UBLK_F_BATCH_IO"
    expect_eq "no device left" "$(ls /dev/ublkb* 2>/dev/null)" ""
fi
trap - EXIT
ublk_cleanup
