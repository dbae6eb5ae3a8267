# udev auto-attach (issue 23), nothing typed: with a target file in targets.d and no unit started,
# creating the RDMA port (`rdma link add`) runs 61-srp-ublk-port.rules -> srp-ublk-port@rxe0 ->
# srp-ublk@auto, and the target's devices come up. Removing and re-adding the port under I/O is
# survived: the port's daemon (one for both LUNs) hands its devices over to a new image of itself,
# the port unit runs again, the devices recover, and no second daemon or device appears.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh
U=srp-ublk@auto.service
ublk_cleanup
# this test's target file is the only one: the port unit starts a unit for every file there
mkdir -p /etc/srp-ublk/targets.d /tmp/targets.saved
for f in /etc/srp-ublk/targets.d/*.conf; do
    [ -e "$f" ] || continue
    systemctl stop "srp-ublk@$(basename "$f" .conf).service"
    mv "$f" /tmp/targets.saved/
done
trap 'lab_port_restore; show_logs; journalctl -u "$U" -u "srp-ublk-port@rxe0.service" --no-pager | tail -40; systemctl stop "$U"; rm -f /etc/srp-ublk/targets.d/auto.conf; ublk_cleanup' EXIT
live() { echo "$(srp-ublk list | grep -c '^/dev/ublkb') $(queue_states | wc -w)"; }
daemons() { pgrep -c -f -- ' add --' || true; }
# the port goes away first (nothing uses it yet), then the target file appears
rdma link delete rxe0 || fail "rdma link delete rxe0"
lab_target_port_remove "$SRP_TPG"
mkdir -p /etc/srp-ublk/targets.d
cat > /etc/srp-ublk/targets.d/auto.conf <<CONF
target = $SRP_TARGET
lun = 0,1
queues = 1
reconnect_delay = 2
fast_io_fail_tmo = 60
CONF
expect_eq "unit state before the port" "$(systemctl is-active "$U")" inactive
t=$(now)
rdma link add rxe0 type rxe netdev dummy0 || fail "rdma link add rxe0"
waitfor /sys/class/infiniband/rxe0/ports/1/gids/0 10 && lab_target_port >/dev/null || fail "LIO's port"
i=0; while [ "$(live)" != "2 2" ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i + 1)); done
expect_eq "devices after rdma link add" "$(live)" "2 2"
echo "rdma link add -> 2 devices live in $(since "$t") s, with nothing started by hand"
expect_eq "unit state" "$(systemctl is-active "$U")" active
journalctl -u srp-ublk-port@rxe0.service --no-pager | grep -q "Finished\|Started\|Deactivated" ||
    fail "srp-ublk-port@rxe0 did not run: $(journalctl -u srp-ublk-port@rxe0.service --no-pager | tail)"
d0=$(srp-ublk list | grep ' lun 0 ' | cut -d' ' -f1)
n0=$(daemons)
expect_eq "daemons (one for the target port's two LUNs)" "$n0" 1
pid0=$(pgrep -f -- ' add --')
verify_start "$d0" 32M
sleep 3
# the port removed and re-added under I/O
t=$(now)
rdma link delete rxe0 || fail "rdma link delete rxe0 under I/O"
echo "rdma link delete under I/O took $(since "$t") s"
lab_target_port_remove "$SRP_TPG"
sleep 3
lab_port_back || fail "bringing the port back"
r=$(wait_running 60) || fail "queues not running 60 s after the port came back: $(queue_states)"
echo "queues running $r s after the port came back"
sleep 3
verify_stop
expect_eq "devices after the port came back" "$(live)" "2 2"
expect_eq "daemons after the port came back (no duplicate)" "$(daemons)" "$n0"
expect_eq "the daemon's pid (handed over to a new image of itself)" "$(pgrep -f -- ' add --')" "$pid0"
journalctl -u "$U" -o cat --no-pager | grep -q "handing /dev/ublkb[0-9]*, /dev/ublkb[0-9]* over to a new image" ||
    fail "the daemon did not hand both devices over: $(journalctl -u "$U" -o cat --no-pager | tail -20)"
expect_eq "unit state after the port came back" "$(systemctl is-active "$U")" active
systemctl stop "$U" || fail "systemctl stop $U"
i=0; while [ -n "$(ls /dev/ublkb* 2>/dev/null)" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
expect_eq "devices after stop" "$(ls /dev/ublkb* 2>/dev/null | wc -l)" 0
rm -f /etc/srp-ublk/targets.d/auto.conf
trap - EXIT
ublk_cleanup
