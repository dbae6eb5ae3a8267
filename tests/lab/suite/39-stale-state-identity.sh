# A stale state file and a changed target (issue 19): no command believes alive, or signals, a
# process that is not the device's daemon; `del` of a device whose daemon is dead removes it at once;
# `recover` refuses a LUN whose identity changed, leaving the device quiesced with its I/O held;
# `down NAME` removes only NAME's devices.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh   # lab_map_lun, lab_unmap_lun, lab_unit_serial
ublk_cleanup
export SRP_UBLK_CONF_DIR=/tmp/targets.d
RD=/sys/kernel/config/target/core/rd_mcp_0
trap 'show_logs; kill $SLEEPER 2>/dev/null; ublk_cleanup' EXIT
pid_of() { grep -o '"pid": *[0-9]*' "/run/srp-ublk/ublkb$1.json" | grep -o '[0-9]*$'; }

# 1. a reused pid: the state file names an unrelated process
dev=$(ublk_add --lun 2 --queues 1) || fail "add LUN 2"
id=${dev#/dev/ublkb}
pattern /tmp/p2 2
dd if=/tmp/p2 of="$dev" bs=1M oflag=direct conv=fsync 2>/dev/null || fail "write $dev"
kill -9 "$(pid_of $id)"; sleep 1
sleep 1000 & SLEEPER=$!
sed -i "s/\"pid\": *[0-9]*/\"pid\": $SLEEPER/" /run/srp-ublk/ublkb$id.json
out=$(srp-ublk list)
echo "$out"
expect_contains "list with the daemon's pid reused" "$out" "DAEMON GONE (pid $SLEEPER started at tick"
out=$(srp-ublk resize -n $id 2>&1) && fail "resize signalled a reused pid: $out"
expect_contains "resize with the pid reused" "$out" "has no daemon"
kill -0 $SLEEPER || fail "the unrelated process was killed"
# recover believes the daemon dead and takes the device over; data intact
srp-ublk recover -n $id || fail "recover with the pid reused"
expect_eq "LUN 2 after recover" "$(sha_range "$dev" 0 2)" "$(sha256sum < /tmp/p2 | cut -c1-64)"
# an older state file (no start time): the process name decides
kill -9 "$(pid_of $id)"; sleep 1
sed -i -e "s/\"pid\": *[0-9]*/\"pid\": $SLEEPER/" -e '/"pid_start"/d' /run/srp-ublk/ublkb$id.json
expect_contains "list, older state file" "$(srp-ublk list)" "DAEMON GONE (pid $SLEEPER is 'sleep', not srp-ublk)"
t=$(now)
srp-ublk del -n $id || fail "del with the daemon dead"
took=$(since "$t")
echo "del of a device whose daemon is dead took $took s"
awk -v t="$took" 'BEGIN{exit !(t < 5)}' || fail "del took $took s (it waited out its timeout)"
[ -e "$dev" ] && fail "$dev still exists after del"
kill -0 $SLEEPER || fail "del killed the unrelated process"
ok "del left pid $SLEEPER alone and removed $dev at once"

# 2. the target's LUN mapping changed while the daemon was dead: recover refuses
dev=$(ublk_add --lun 1 --queues 1) || fail "add LUN 1"
id=${dev#/dev/ublkb}
pattern /tmp/p1 2
dd if=/tmp/p1 of="$dev" bs=1M oflag=direct conv=fsync 2>/dev/null || fail "write $dev"
kill -9 "$(pid_of $id)"; sleep 1
lab_unmap_lun "$SRP_TPG" $LAB_IP 1 ramdisk1 || fail "unmapping LUN 1"
mkdir -p $RD/ramdisk9 && echo rd_pages=4096 > $RD/ramdisk9/control && echo 1 > $RD/ramdisk9/enable &&
    lab_unit_serial $RD/ramdisk9 9 && lab_map_lun "$SRP_TPG" $LAB_IP 1 $RD/ramdisk9 ||
    fail "mapping another disk as LUN 1"
dd if="$dev" of=/tmp/held bs=4k count=1 iflag=direct 2>/dev/null & READER=$!
out=$(srp-ublk recover -n $id 2>&1) && fail "recover took a changed LUN over: $out"
echo "$out"
expect_contains "recover of a changed LUN" "$out" "is not the LUN it served"
expect_contains "recover of a changed LUN" "$out" "its WWID was"
sleep 2
kill -0 $READER 2>/dev/null || fail "a read of the quiesced device ended (it must wait for recovery)"
ok "the device stays quiesced, its read held"
lab_unmap_lun "$SRP_TPG" $LAB_IP 1 ramdisk9 && rmdir $RD/ramdisk9 &&
    lab_map_lun "$SRP_TPG" $LAB_IP 1 $RD/ramdisk1 || fail "mapping LUN 1 back"
srp-ublk recover -n $id || fail "recover once LUN 1 is back"
wait $READER || fail "the held read failed after recovery"
expect_eq "LUN 1 after recover" "$(sha_range "$dev" 0 2)" "$(sha256sum < /tmp/p1 | cut -c1-64)"
srp-ublk del -n $id >/dev/null || fail "del LUN 1"

# 3. down NAME removes NAME's devices only
mkdir -p "$SRP_UBLK_CONF_DIR"
printf 'target = %s\nlun = 1\nqueues = 1\n' "$SRP_TARGET" > "$SRP_UBLK_CONF_DIR/a.conf"
printf 'target = %s\nlun = 2\nqueues = 1\n' "$SRP_TARGET" > "$SRP_UBLK_CONF_DIR/b.conf"
srp-ublk up a b || fail "up a b"
hand=$(ublk_add --lun 0 --queues 1) || fail "add LUN 0 by hand"
expect_eq "devices before down" "$(srp-ublk list | grep -c '^/dev/ublkb')" 3
out=$(srp-ublk down a) || fail "down a: $out"
echo "$out"
expect_contains "down a" "$out" "attached by 'b'"
expect_contains "down a" "$out" "added by hand"
left=$(srp-ublk list | grep '^/dev/ublkb' | sed 's/.* lun \([0-9]*\) .*/\1/' | sort | tr '\n' ' ')
expect_eq "LUNs left after down a" "$left" "0 2 "
srp-ublk down b >/dev/null || fail "down b"
expect_eq "LUNs left after down b" "$(srp-ublk list | grep -c '^/dev/ublkb')" 1
[ -b "$hand" ] || fail "the device added by hand went away"
trap - EXIT
kill $SLEEPER
ublk_cleanup
