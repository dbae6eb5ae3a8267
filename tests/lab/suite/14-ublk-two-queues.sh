# --queues 2: two channels (two QPs, two logins at the target), each queue thread pinned where list
# says (by default on the next queue's CPUs, off the CPU that submits to it; --cpus overrides), and
# I/O runs on both. A second LUN added to the port joins the daemon and its 2 channels.
. /usr/lib/srp-lab/suite/lib.sh
trap 'show_logs; ublk_cleanup' EXIT
# check_pinning WANT0 WANT1: each queue thread's allowed CPUs, from /proc and from list --json
check_pinning() {
    pid=$(pidof srp-ublk)
    json=$(srp-ublk list --json)
    echo "$json"
    for q in 0 1; do
        tid=$(echo "$json" | awk -v q=$q '/"qid":/{cur=$2+0} /"tid":/{ if (cur==q) {gsub(/[^0-9]/,"",$2); print $2} }' | head -1)
        if [ $q = 0 ]; then want=$1; else want=$2; fi
        got=$(grep Cpus_allowed_list /proc/$pid/task/$tid/status | awk '{print $2}')
        expect_eq "queue $q thread $tid CPUs" "$got" "$want"
        expect_contains "list --json cpus for queue $q" "$json" "\"cpus\": \"$want\""
    done
}
n0=$(dmesg | grep -c 'Received SRP_LOGIN_REQ')
dev=$(ublk_add --queues 2) || fail "add: $dev"
expect_eq "logins seen by ib_srpt" "$(($(dmesg | grep -c 'Received SRP_LOGIN_REQ') - n0))" 2
expect_eq "QPs owned by srp-ublk" "$(/usr/bin/rdma res show qp | grep -c srp-ublk)" 2
expect_eq "ublk hardware queues" "$(ls /sys/block/ublkb0/mq | wc -l)" 2
# blk-mq sends CPU q's I/O to queue q; its thread runs on the other CPU
expect_eq "queue 0's CPUs (blk-mq)" "$(cat /sys/block/ublkb0/mq/0/cpu_list)" 0
check_pinning 1 0
# one fio job per CPU: blk-mq maps each CPU to its own hardware queue
fio --name=q0 --cpus_allowed=0 --filename="$dev" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
    --iodepth=8 --io_size=8m --name=q1 --cpus_allowed=1 --filename="$dev" --ioengine=libaio \
    --direct=1 --rw=randread --bs=4k --iodepth=8 --io_size=8m --output=/tmp/fio2.txt || fail "fio"
sleep 3   # the daemon refreshes its counters every 2 s
json=$(srp-ublk list --json)
cmds=$(echo "$json" | grep '"cmds"' | tr -dc '0-9\n')
echo "per-queue SRP_CMDs: $(echo $cmds)"
for c in $cmds; do [ "$c" -gt 1000 ] || fail "a queue carried only $c commands"; done
ok "I/O ran on both queues"
srp-ublk del --all || fail "del"
dev=$(ublk_add --queues 2 --cpus 0,1) || fail "add --cpus 0,1: $dev"
check_pinning 0 1
# a second LUN of the port joins the daemon: one daemon, the same 2 channels, LUN 0's data intact
# and its queues where --cpus put them
pattern /tmp/l0 2
dd if=/tmp/l0 of="$dev" bs=1M oflag=direct conv=fsync 2>/dev/null || fail "write $dev"
pid=$(pidof srp-ublk)
t=$(now)
dev1=$(ublk_add --lun 1) || fail "add --lun 1 to the running daemon: $dev1"
echo "LUN 1 joined as $dev1 in $(since "$t") s"
expect_eq "daemon after the join (same pid)" "$(pidof srp-ublk)" "$pid"
expect_eq "QPs owned by srp-ublk after the join" "$(/usr/bin/rdma res show qp | grep -c srp-ublk)" 2
expect_eq "size of LUN 1 ($dev1)" "$(blockdev --getsize64 "$dev1")" $((32 << 20))
expect_eq "LUN 0 after the join" "$(sha_range "$dev" 0 2)" "$(sha256sum < /tmp/l0 | cut -c1-64)"
dd if=/tmp/l0 of="$dev1" bs=1M oflag=direct conv=fsync 2>/dev/null || fail "write $dev1"
expect_eq "LUN 1 reads back" "$(sha_range "$dev1" 0 2)" "$(sha256sum < /tmp/l0 | cut -c1-64)"
check_pinning 0 1
trap - EXIT
ublk_cleanup
