# An export's unix socket opened to one group (serve --socket-group), as libvirt's QEMU, running
# as its own user, needs it:
#  - without it the socket is root's, 0600: a user in the group is refused (EACCES)
#  - with --socket-group disk it is 0660 and the disk group's from the start: that user reads the
#    export (nbdinfo as nobody:disk), and a user outside the group is still refused
#  - a vhost-user-blk socket is made the same way
. /usr/lib/srp-lab/suite/lib.sh
trap 'kill ${SRV:-} ${VPID:-} 2>/dev/null; ublk_cleanup' EXIT
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
trap - EXIT
ublk_cleanup
