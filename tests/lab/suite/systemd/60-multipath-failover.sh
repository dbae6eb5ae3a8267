# dm-multipath over two srp-ublk paths to one LUN, in the systemd guest with multipath-tools:
#   path A: rxe0 on dummy0 (10.77.0.1), the lab's target port;
#   path B: rxeB -> rxeA over the veth pair vethB/vethA (lab_path_b: LIO's second target port,
#           src=10.77.1.2, initiator_ext 0x11).
# Both devices carry the LUN's WWID; with docs/multipath-srp-ublk.conf (as shipped, and the LUN's
# multipaths entry it describes) multipathd groups them into one map; `multipath -t` shows that the
# defaults' grouping is untouched. With fio verify (crc32c) running on /dev/mapper/<WWID> throughout:
#   1. path B's session logged out (its target port group disabled) until dm-multipath has failed the
#      path, then logged in again (enabled) until the path is reinstated: 10 times;
#   2. vethB down for 2 x fast_io_fail_tmo, then up, until the path is reinstated;
#   3. the same two for path A (its target port group; dummy0), with 3 logouts (each takes ~13 s:
#      the ten that issue 9 asks for are path B's).
# Then both paths active again, 0 verify errors. Timers: fast_io_fail_tmo 5, reconnect_delay 1.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh
TMO=5
ublk_cleanup
cleanup() {
    show_logs; multipath -ll 2>&1 | tail -20
    killall -INT fio 2>/dev/null; sleep 1
    rm -f /etc/multipath/conf.d/srp-ublk.conf /etc/multipath/conf.d/srp-ublk-luns.conf; multipath -F >/dev/null 2>&1; systemctl restart multipathd
    echo 1 > "$SRP_TPG/enable"; [ -n "${TPG_B:-}" ] && echo 1 > "$TPG_B/enable"
    ip link set dummy0 up; ip link set vethB up 2>/dev/null
    ublk_cleanup
}
trap cleanup EXIT
lab_path_b > /tmp/path-b.log 2>&1 || { cat /tmp/path-b.log; fail "setting up path B"; }
install -D -m 644 /usr/share/doc/srp-ublk/examples/multipath-srp-ublk.conf /etc/multipath/conf.d/srp-ublk.conf
a=$(ublk_add --lun 0 --queues 2 --fast-io-fail-tmo $TMO --reconnect-delay 1) || fail "add path A: $a"
b=$(srp-ublk add --target "$SRP_TARGET_B" --lun 0 --queues 2 --fast-io-fail-tmo $TMO --reconnect-delay 1) ||
    fail "add path B: $b"
A=${a#/dev/}; B=${b#/dev/}
udevadm settle
wwid=$(udevadm info -q property -n "$a" | sed -n 's/^ID_SERIAL=//p')
expect_eq "path B's WWID (udev)" "$(udevadm info -q property -n "$b" | sed -n 's/^ID_SERIAL=//p')" "$wwid"
# the LUN's grouping, as the snippet says: one multipaths entry for its WWID
printf 'multipaths {\n    multipath {\n        wwid %s\n        path_grouping_policy multibus\n    }\n}\n' "$wwid" \
    > /etc/multipath/conf.d/srp-ublk-luns.conf
# the snippet reaches no other array: the defaults' grouping is still multipath-tools' own
cfg=$(multipath -t 2>/dev/null)
defaults=$(echo "$cfg" | sed -n '/^defaults {/,/^}/p')
expect_contains "multipath -t defaults" "$defaults" "path_checker \"directio\""
expect_contains "multipath -t defaults" "$defaults" "path_grouping_policy \"failover\""
expect_contains "multipath -t multipaths" "$(echo "$cfg" | sed -n '/^multipaths {/,/^}/p')" "wwid \"$wwid\""
systemctl restart multipathd
multipath -a "$a" >/dev/null && multipath -a "$b" >/dev/null || fail "multipath -a"
multipath -r >/dev/null 2>&1

# dm_state DEV: the path's state in the map (active / failed); paths: "A-state B-state"
dm_state() { multipathd show paths raw format "%d %t" 2>/dev/null | sed -n "s/^$1 //p" | tr -d ' '; }
paths() { echo "$(dm_state $A) $(dm_state $B)"; }
# wait_paths WANT SECS: until paths = WANT; prints how long it took
wait_paths() {
    _t=$(now); _i=0
    while [ "$(paths)" != "$1" ] && [ $_i -lt $(($2 * 5)) ]; do sleep 0.2; _i=$((_i + 1)); done
    [ "$(paths)" = "$1" ] && since "$_t"
}
wait_paths "active active" 60 >/dev/null || fail "multipathd did not make a map of both paths: $(multipath -ll 2>&1)"
dm=/dev/mapper/$wwid
udevadm settle
i=0; while [ ! -b "$dm" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -b "$dm" ] || fail "no $dm: $(ls /dev/mapper)"
multipath -ll
expect_eq "map size" "$(blockdev --getsize64 "$dm")" "$SRP_LUN_BYTES"
verify_start "$dm" 64M
sleep 5

# session_cycles NAME TPG N WHILE_DOWN: N times, log the path's session out (disable its target
# port group) until dm-multipath fails it, then in again until it is reinstated
session_cycles() {
    _c=1
    while [ $_c -le "$3" ]; do
        echo 0 > "$2/enable"
        _f=$(wait_paths "$4" $((TMO + 60))) || fail "path $1 logout $_c: dm-multipath did not fail it: $(paths)"
        echo 1 > "$2/enable"
        _r=$(wait_paths "active active" 60) || fail "path $1 login $_c: not reinstated within 60 s: $(paths)"
        [ -f /tmp/fio-verify.done ] && fail "fio stopped during path $1 logout $_c"
        echo "path $1 logout $_c: failed in dm after ${_f} s (fast_io_fail_tmo $TMO), reinstated ${_r} s after the login"
        _c=$((_c + 1))
    done
}
# link_down NAME NETDEV WHILE_DOWN: the path's netdev down for 2 x fast_io_fail_tmo (longer, bounded,
# if dm-multipath has not failed the path by then: how soon the channel notices a dead link depends
# on the fabric's retries), then up
link_down() {
    _t0=$(now)   # not _t: wait_paths sets that one
    ip link set "$2" down
    sleep $((2 * TMO))
    wait_paths "$3" 30 >/dev/null || { ip link set "$2" up; fail "path $1: $2 down for $(since "$_t0") s, yet dm-multipath shows '$(paths)'"; }
    _d=$(since "$_t0")
    ip link set "$2" up
    _r=$(wait_paths "active active" 90) || fail "path $1: not reinstated within 90 s of $2 up: $(paths)"
    [ -f /tmp/fio-verify.done ] && fail "fio stopped during path $1's link down"
    echo "path $1: $2 down ${_d} s (failed in dm), reinstated ${_r} s after up"
}
session_cycles B "$TPG_B" 10 "active failed"
link_down B vethB "active failed"
session_cycles A "$SRP_TPG" 3 "failed active"
link_down A dummy0 "failed active"
sleep 3
verify_stop
multipath -ll
expect_eq "paths at the end" "$(paths)" "active active"
expect_eq "ready paths in multipath -ll" "$(multipath -ll | grep -c 'active ready running')" 2
