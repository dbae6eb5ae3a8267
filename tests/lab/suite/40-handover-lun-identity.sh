# The RDMA device goes away and comes back with the target's LUN mapping changed (issue 19): the
# daemon that took the device over without a login (the handover, see test 35) checks every new
# login against the LUN its state file names, so its channels refuse the other disk now mapped as
# LUN 1 (I/O held, nothing written there) and log in once LUN 1 is the device's LUN again.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh
ublk_cleanup
RD=/sys/kernel/config/target/core/rd_mcp_0
restore() {
    lab_port_restore
    if [ -e "$SRP_TPG/lun/lun_1/ramdisk9" ]; then
        lab_unmap_lun "$SRP_TPG" $LAB_IP 1 ramdisk9 && lab_map_lun "$SRP_TPG" $LAB_IP 1 $RD/ramdisk1
    fi
    rmdir $RD/ramdisk9 2>/dev/null
}
trap 'restore; show_logs; ublk_cleanup' EXIT
# reconnect_delay 20: the first attempt comes after the port and the other disk are in place
dev=$(ublk_add --lun 1 --queues 1 --reconnect-delay 20 --fast-io-fail-tmo 120 --dev-loss-tmo 300) ||
    fail "srp-ublk add: $dev"
id=${dev#/dev/ublkb}
pattern /tmp/p1 2
dd if=/tmp/p1 of="$dev" bs=1M oflag=direct conv=fsync 2>/dev/null || fail "write $dev"
t0=$(now)
rdma link delete rxe0 || fail "rdma link delete rxe0"
lab_target_port_remove "$SRP_TPG"
lab_port_back || fail "bringing rxe0 and the target port back"
lab_unmap_lun "$SRP_TPG" $LAB_IP 1 ramdisk1 || fail "unmapping LUN 1"
mkdir -p $RD/ramdisk9 && echo rd_pages=8192 > $RD/ramdisk9/control && echo 1 > $RD/ramdisk9/enable &&
    lab_unit_serial $RD/ramdisk9 9 && lab_map_lun "$SRP_TPG" $LAB_IP 1 $RD/ramdisk9 ||
    fail "mapping another disk (same size) as LUN 1"
echo "rxe0 back with another disk as LUN 1 $(since "$t0") s after the removal"
dd if="$dev" of=/tmp/held bs=4k count=1 iflag=direct 2>/dev/null & READER=$!
log=$(daemon_log "$id")
i=0; while ! grep -q "is not the LUN this device served" "$log" && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
grep -E "taking|reconnect failed" "$log" | sed 's/^/daemon: /'
grep -q "is not the LUN this device served: its WWID was" "$log" ||
    fail "no login was refused for the other disk within 60 s"
kill -0 $READER 2>/dev/null || fail "the read of $dev ended while LUN 1 was another disk"
expect_contains "list while LUN 1 is another disk" "$(srp-ublk list)" "blocked"
ok "the other disk was refused, the read held"
lab_unmap_lun "$SRP_TPG" $LAB_IP 1 ramdisk9 && rmdir $RD/ramdisk9 &&
    lab_map_lun "$SRP_TPG" $LAB_IP 1 $RD/ramdisk1 || fail "mapping LUN 1 back"
r=$(wait_running 60) || fail "the queue did not run within 60 s of LUN 1 coming back: $(queue_states)"
wait $READER || fail "the held read failed"
expect_eq "LUN 1's data" "$(sha_range "$dev" 0 2)" "$(sha256sum < /tmp/p1 | cut -c1-64)"
ok "running ${r} s after LUN 1 came back"
trap - EXIT
ublk_cleanup
