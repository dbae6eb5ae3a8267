# An export's unix socket opened to one group (serve --socket-group), as libvirt's QEMU, running
# as its own user, needs it:
#  - without it the socket is root's, 0600: a user in the group is refused (EACCES)
#  - with --socket-group disk it is 0660 and the disk group's from the start: that user reads the
#    export (nbdinfo as nobody:disk), and a user outside the group is still refused
#  - a vhost-user-blk socket is made the same way
#  - an export file in /etc/srp-ublk/exports.d served by srp-ublk-serve@NAME, logging to the journal
. /usr/lib/srp-lab/suite/lib.sh
trap 'kill ${SRV:-} ${VPID:-} 2>/dev/null; systemctl stop srp-ublk-serve@vm1 srp-ublk-serve@vm2 2>/dev/null; rm -f /etc/srp-ublk/exports.d/vm1.conf /etc/srp-ublk/exports.d/vm2.conf; ublk_cleanup' EXIT
S=/run/srp-ublk/grp.sock
URI="nbd+unix:///grp?socket=$S"
as() { _g=$1; shift; setpriv --reuid=nobody --regid="$_g" --clear-groups "$@"; }
nbd_serve $S grp --queues 1
expect_eq "socket without --socket-group" "$(stat -c '%a %U %G' $S)" "600 root root"
out=$(as disk nbdinfo --size "$URI" 2>&1) && fail "nobody:disk read a 0600 root socket: $out"
expect_contains "nobody:disk on a 0600 socket" "$out" "Permission denied"
kill $SRV; wait $SRV 2>/dev/null
nbd_serve $S grp --queues 1 --socket-group disk
expect_eq "socket with --socket-group disk" "$(stat -c '%a %U %G' $S)" "660 root disk"
expect_eq "export size as nobody:disk" "$(as disk nbdinfo --size "$URI" 2>&1)" "$SRP_LUN_BYTES"
out=$(as nogroup nbdinfo --size "$URI" 2>&1) && fail "nobody:nogroup read a 0660 root:disk socket: $out"
expect_contains "nobody:nogroup on a 0660 disk socket" "$out" "Permission denied"
kill $SRV; wait $SRV 2>/dev/null
out=$(srp-ublk serve --nbd unix:$S --target "$SRP_TARGET" --socket-group no-such-group 2>&1) &&
    fail "serve took an unknown group: $out"
expect_contains "an unknown group" "$out" "--socket-group no-such-group: no such group on this host"
vhost_serve "$SRP_TARGET" --queues 1 --socket-group disk
expect_eq "vhost-user-blk socket with --socket-group disk" "$(stat -c '%a %U %G' /run/srp-ublk/vm0.sock)" "660 root disk"
kill $VPID; wait $VPID 2>/dev/null
# the same export as a unit: an export file and srp-ublk-serve@NAME, its lines in the journal
mkdir -p /etc/srp-ublk/exports.d
printf 'target = %s\nqueues = 1\nsocket_group = disk\n' "$SRP_TARGET" > /etc/srp-ublk/exports.d/vm1.conf
systemctl start srp-ublk-serve@vm1 || fail "systemctl start srp-ublk-serve@vm1: $(journalctl -u srp-ublk-serve@vm1 --no-pager | tail)"
U1="nbd+unix:///vm1?socket=/run/srp-ublk/vm1.sock"
i=0; while ! as disk nbdinfo --size "$U1" >/dev/null 2>&1 && [ $i -lt 300 ]; do sleep 0.2; i=$((i + 1)); done
expect_eq "the unit's socket" "$(stat -c '%a %U %G' /run/srp-ublk/vm1.sock)" "660 root disk"
expect_eq "export size through the unit's socket as nobody:disk" "$(as disk nbdinfo --size "$U1" 2>&1)" "$SRP_LUN_BYTES"
journalctl -u srp-ublk-serve@vm1 -o cat --no-pager | grep -q "^export vm1: " ||
    fail "no 'export vm1: ' lines in the unit's journal: $(journalctl -u srp-ublk-serve@vm1 -o cat --no-pager | tail)"
list=$(srp-ublk list)
echo "$list"
expect_contains "list" "$list" "export vm1  nbd unix:/run/srp-ublk/vm1.sock"
expect_contains "list" "$list" "    unit srp-ublk-serve@vm1.service"
systemctl stop srp-ublk-serve@vm1 || fail "systemctl stop srp-ublk-serve@vm1"
expect_eq "the unit after stop" "$(systemctl is-active srp-ublk-serve@vm1)" inactive
expect_eq "exports listed after the unit stopped" "$(srp-ublk list | grep -c '^export')" 0
rm -f /etc/srp-ublk/exports.d/vm1.conf
ok "srp-ublk-serve@vm1 served exports.d/vm1.conf to the disk group and logged to its journal"
# a vhost-user-blk export as a unit: its socket, and its entry in `srp-ublk list` while it runs
printf 'target = %s\nqueues = 1\nvhost-user-blk = /run/srp-ublk/vm2.sock\n' "$SRP_TARGET" > /etc/srp-ublk/exports.d/vm2.conf
systemctl start srp-ublk-serve@vm2 || fail "systemctl start srp-ublk-serve@vm2: $(journalctl -u srp-ublk-serve@vm2 --no-pager | tail)"
i=0; while ! srp-ublk list | grep -q '^export vm2 ' && [ $i -lt 300 ]; do sleep 0.2; i=$((i + 1)); done
list=$(srp-ublk list)
echo "$list"
expect_contains "list" "$list" "export vm2  vhost-user-blk /run/srp-ublk/vm2.sock"
expect_contains "list" "$list" "    unit srp-ublk-serve@vm2.service"
[ -S /run/srp-ublk/vm2.sock ] || fail "no vhost-user socket /run/srp-ublk/vm2.sock"
systemctl stop srp-ublk-serve@vm2 || fail "systemctl stop srp-ublk-serve@vm2"
expect_eq "exports listed after the unit stopped" "$(srp-ublk list | grep -c '^export')" 0
rm -f /etc/srp-ublk/exports.d/vm2.conf
ok "srp-ublk-serve@vm2 served a vhost-user-blk export file, listed while it ran"
trap - EXIT
ublk_cleanup
