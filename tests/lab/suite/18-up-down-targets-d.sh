# `up` / `down` over a targets.d directory: a target file with two LUNs brings up two devices; `up`
# again leaves them alone; after `kill -9` of one device's daemon, `up` recovers that device (the
# same /dev/ublkbN, its data intact); `down` removes both. Under `up --supervise` (no periodic
# rescan), a target file with `lun = all` gets a device for a LUN mapped on the target at run time:
# LIO raises REPORTED LUNS DATA HAS CHANGED on the other LUNs, which the next I/O meets; the new
# LUN's device joins the daemon that serves the others.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh   # lab_map_lun
ublk_cleanup
export SRP_UBLK_CONF_DIR=/tmp/targets.d
trap 'show_logs; ublk_cleanup' EXIT
mkdir -p "$SRP_UBLK_CONF_DIR"
cat > "$SRP_UBLK_CONF_DIR/lab.conf" <<CONF
# the lab target, LUNs 1 and 2
target = $SRP_TARGET
lun = 1,2
queues = 1
fast_io_fail_tmo = 30
CONF
out=$(srp-ublk up lab) || fail "up: $out"
echo "$out"
expect_eq "devices after up" "$(srp-ublk list | grep -c '^/dev/ublkb')" 2
d1=$(srp-ublk list | grep 'lun 1 ' | cut -d' ' -f1)
d2=$(srp-ublk list | grep 'lun 2 ' | cut -d' ' -f1)
[ -b "$d1" ] && [ -b "$d2" ] || fail "no devices for LUNs 1 and 2: $(srp-ublk list)"
pattern /tmp/up1 2
dd if=/tmp/up1 of="$d1" bs=1M seek=4 oflag=direct conv=fsync 2>/dev/null || fail "write $d1"
out=$(srp-ublk up lab) || fail "second up: $out"
expect_contains "second up" "$out" "LUN 1 is up: $d1"
expect_eq "devices after the second up" "$(srp-ublk list | grep -c '^/dev/ublkb')" 2
id1=${d1#/dev/ublkb}
pid=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/ublkb$id1.json" | grep -o '[0-9]*$')
kill -9 "$pid"; sleep 2
expect_contains "list with a daemon dead" "$(srp-ublk list)" "DAEMON GONE"
out=$(srp-ublk up lab) || fail "up after kill -9: $out"
expect_contains "up after kill -9" "$out" "LUN 1: $d1 lost its daemon: recovering"
expect_eq "LUN 1's data after recovery" "$(sha_range "$d1" 4 2)" "$(sha256sum < /tmp/up1 | cut -c1-64)"
out=$(srp-ublk down lab) || fail "down: $out"
echo "$out"
i=0; while [ -n "$(ls /dev/ublkb* 2>/dev/null)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
expect_eq "devices after down" "$(ls /dev/ublkb* 2>/dev/null | wc -l)" 0
# lun = all under --supervise: a LUN mapped on the target at run time gets its device
cat > "$SRP_UBLK_CONF_DIR/all.conf" <<CONF
target = $SRP_TARGET
lun = all
queues = 1
CONF
srp-ublk up --supervise --rescan 0 all > /tmp/supervise.log 2>&1 & sup=$!
i=0; while [ "$(srp-ublk list | grep -c '^/dev/ublkb')" -lt 3 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
expect_eq "devices from lun = all" "$(srp-ublk list | grep -c '^/dev/ublkb')" 3
rd=/sys/kernel/config/target/core/rd_mcp_0/ramdisk3
mkdir -p $rd && echo rd_pages=2048 > $rd/control && echo 1 > $rd/enable &&
    lab_unit_serial $rd 3 && lab_map_lun "$SRP_TPG" $LAB_IP 3 $rd ||
    fail "mapping LUN 3 on the target"
t=$(now)
d0=$(srp-ublk list | grep 'lun 0 ' | cut -d' ' -f1)
dd if="$d0" of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null || fail "read from $d0"
i=0; while ! srp-ublk list | grep -q 'lun 3 ' && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
d3=$(srp-ublk list | grep 'lun 3 ' | cut -d' ' -f1)
[ -b "$d3" ] || { cat /tmp/supervise.log; fail "no device for LUN 3 within 60 s of mapping it and reading from $d0"; }
expect_contains "the supervisor's log" "$(cat /tmp/supervise.log)" "LUNs changed"
echo "LUN 3 mapped at run time: $d3 after $(since "$t") s (a read from LUN 0 met the unit attention)"
expect_eq "size of the new LUN" "$(blockdev --getsize64 "$d3")" $((8 << 20))
# it joined the daemon of the port's other LUNs (the same channels), not one of its own
expect_eq "daemons named by the state files" "$(cat /run/srp-ublk/ublkb*.json | grep -o '"pid": *[0-9]*' | sort -u | wc -l)" 1
expect_contains "the supervisor's log" "$(cat /tmp/supervise.log)" "joins the port's daemon"
expect_eq "LUN 0 reads after the join" "$(dd if="$d0" bs=4k count=1 iflag=direct 2>/dev/null | wc -c)" 4096
kill -0 $sup || fail "the supervisor exited: $(cat /tmp/supervise.log)"
kill $sup; wait $sup
srp-ublk down all >/dev/null || fail "down all"
lab_unmap_lun "$SRP_TPG" $LAB_IP 3 ramdisk3
rmdir $rd
echo "target = x" > "$SRP_UBLK_CONF_DIR/bad.conf"; echo "bogus = 1" >> "$SRP_UBLK_CONF_DIR/bad.conf"
out=$(srp-ublk up bad 2>&1) && fail "up of a bad target file succeeded"
expect_contains "up of a bad file" "$out" "bad.conf:2: unknown key 'bogus'"
echo "target = 000000fffe770001" > "$SRP_UBLK_CONF_DIR/guid.conf"
out=$(srp-ublk up guid 2>&1) && fail "up of a target file with a bare GUID succeeded"
expect_contains "up of a bare GUID" "$out" "needs the full target string"
trap - EXIT
ublk_cleanup
