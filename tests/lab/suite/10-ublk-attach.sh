# srp-ublk add creates /dev/ublkb0 with the LUN's size and block size; list shows it; del removes it,
# leaves no daemon and LIO no session.
. /usr/lib/srp-lab/suite/lib.sh
trap 'show_logs; ublk_cleanup' EXIT
dev=$(ublk_add) || fail "srp-ublk add failed: $dev"
expect_eq "device path" "$dev" /dev/ublkb0
[ -b /dev/ublkb0 ] || fail "/dev/ublkb0 is not a block device"
expect_eq "size in bytes" "$(($(cat /sys/block/ublkb0/size) * 512))" "$SRP_LUN_BYTES"
expect_eq "logical block size" "$(cat /sys/block/ublkb0/queue/logical_block_size)" 512
pattern /tmp/p 8
dd if=/tmp/p of=/dev/ublkb0 bs=1M seek=5 oflag=direct conv=fsync 2>/dev/null || fail "write"
expect_eq "8 MiB read back" "$(sha_range /dev/ublkb0 5 8)" "$(sha256sum < /tmp/p | cut -c1-64)"
out=$(srp-ublk list) || fail "list"
echo "$out"
expect_contains "list" "$out" "/dev/ublkb0"
expect_contains "list" "$out" "LIO-ORG"
expect_contains "list" "$out" "dest=10.77.0.1:5555"
# the daemon says which build serves the device (a mixed state after an upgrade is visible)
expect_contains "list" "$out" "daemon version $(srp-ublk -V | cut -d' ' -f2-)"
json=$(srp-ublk list --json) || fail "list --json"
expect_contains "list --json" "$json" '"req_lim_login": 128'
pid=$(pidof srp-ublk) || fail "no daemon running"
# the daemon leads a session of its own (field 6 of /proc/PID/stat): no controlling terminal, and a
# scheduler autogroup apart from the applications it serves
sid=$(sed 's/.*) //' /proc/$pid/stat | cut -d' ' -f4)
expect_eq "daemon's session id" "$sid" "$pid"
# a queue registers (pins) a pool of 6 MiB for the login, not a buffer of the largest I/O per tag
# (ublk's NEED_GET_DATA: each command names its buffer): with the channel's IUs, under 8 MiB
expect_eq "largest I/O (KiB) at depth 64" "$(cat /sys/block/ublkb0/queue/max_hw_sectors_kb)" 128
nq=$(ls -d /sys/block/ublkb0/mq/* | wc -l)
pin=$(awk '/^VmPin/{print $2}' /proc/$pid/status)
echo "VmPin ${pin} kB for $nq queue(s)"
[ "$pin" -gt $((nq * 6144)) ] || fail "VmPin $pin kB: less than the pools ($nq x 6 MiB): is it still counted?"
[ "$pin" -le $((nq * 8192)) ] || fail "VmPin $pin kB for $nq queue(s): more than 8 MiB per queue"
ok "pinned per queue: $((pin / nq)) kB"
/usr/bin/rdma res show qp | grep -q srp-ublk || fail "no QP owned by srp-ublk"
srp-ublk del -n 0 || fail "del"
[ ! -e /dev/ublkb0 ] || fail "/dev/ublkb0 still present after del"
! pidof srp-ublk >/dev/null || fail "daemon still running after del: $(pidof srp-ublk)"
ok "device and daemon gone"
# max_sect in the target string raises the largest I/O past the budget (and the pinned memory with it)
dev=$(srp-ublk add --target "$SRP_TARGET,max_sect=1024" --queues 1) || fail "add with max_sect=1024: $dev"
expect_eq "largest I/O (KiB) with max_sect=1024" "$(cat /sys/block/ublkb0/queue/max_hw_sectors_kb)" 512
pin=$(awk '/^VmPin/{print $2}' /proc/$(pidof srp-ublk)/status)
# not depth x 512 KiB (32 MiB): the same 6 MiB pool, twelve 512 KiB commands at a time
[ "$pin" -gt 6144 ] || fail "VmPin $pin kB with 512 KiB commands: less than the 6 MiB pool: is it still counted?"
[ "$pin" -le 8192 ] || fail "VmPin $pin kB with 512 KiB commands: more than 8 MiB for one queue"
ok "pinned with 512 KiB commands: $pin kB"
# 1 MiB requests (two 512 KiB commands each); then sixteen 512 KiB writes at a time for room for
# twelve: the others wait for room, in order, under fio's verify
pattern /tmp/p2 8
dd if=/tmp/p2 of=/dev/ublkb0 bs=1M seek=20 oflag=direct conv=fsync 2>/dev/null || fail "write 512 KiB commands"
fio --name=big --filename=/dev/ublkb0 --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite \
    --bs=512k --offset=64M --size=16M --verify=crc32c --verify_fatal=1 --output-format=terse \
    >/tmp/fio-big.txt 2>&1 || { cat /tmp/fio-big.txt; fail "fio verify with 512 KiB commands at depth 16"; }
expect_eq "8 MiB read back in 512 KiB commands" "$(sha_range /dev/ublkb0 20 8)" "$(sha256sum < /tmp/p2 | cut -c1-64)"
# the writes beyond the twelve waited, and stats says so (the queue publishes its counters as it
# goes idle, the daemon writes them every 2 s)
sleep 3
srp-ublk stats --prometheus /tmp/big.prom || fail "srp-ublk stats --prometheus"
stalls=$(sed -n 's/^srp_ublk_buffer_stalls_total{[^}]*} //p' /tmp/big.prom | awk '{s += $1} END {print s + 0}')
[ "$stalls" -gt 0 ] || fail "no buffer stalls counted after 512 KiB writes at depth 16 into a pool of twelve: $(grep buffer_stalls /tmp/big.prom)"
ok "commands that waited for room in the pool (srp_ublk_buffer_stalls_total): $stalls"
srp-ublk del -n 0 || fail "del"
# LIO closes its side once we disconnect: no target QP left for our session
i=0; while /usr/bin/rdma res show qp | grep -q 'comm \[ib_srpt\]' && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
/usr/bin/rdma res show qp | grep 'ib_srpt' && fail "LIO still has a channel QP after del"
ok "LIO shows no session"
trap - EXIT
