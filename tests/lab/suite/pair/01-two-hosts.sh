# Initiator and target on two hosts (lab.sh pair: LIO in a guest of its own, RoCE over a virtio-net
# link): srp-ublk logs in across the link, bytes cross it both ways against the kernel's ib_srp,
# and fio verify through /dev/ublkb0 finds every block it wrote.
. /usr/lib/srp-lab/suite/lib.sh
trap 'show_logs; ublk_cleanup' EXIT
[ "${LAB_ROLE:-}" = initiator ] || fail "not the initiator guest of a pair (LAB_ROLE=${LAB_ROLE:-})"
# the target's address is the other guest's: not one of ours, and rxe0 runs on the link
/usr/bin/ip -4 addr show | grep -q ' 10\.77\.0\.1/' && fail "10.77.0.1 is local: the target is not in another guest"
rdma link show | grep -q 'rxe0/1 state ACTIVE .*netdev eth0' || fail "rxe0 is not active on eth0: $(rdma link show)"
ok "target at ${SRP_TARGET##*dest=}, across the link from $(/usr/bin/ip -4 addr show eth0 | grep -o '10\.77\.0\.[0-9]*/24')"
dev=$(ublk_add --queues 2) || fail "add: $dev"
sd=$(lab-ref-attach) || fail "lab-ref-attach"
ok "srp-ublk $dev and ib_srp $sd on the remote LUN"
cross_check "$dev" "$sd"
lab-ref-detach >/dev/null
fio --name=verify --filename="$dev" --ioengine=libaio --direct=1 --rw=randrw \
    --bssplit=512/10:4k/40:64k/25:256k/15:1m/10 --iodepth=32 --numjobs=2 \
    --size=64m --offset_increment=64m --io_size=96m \
    --verify=crc32c --verify_backlog=1024 --verify_fatal=1 --do_verify=1 \
    --group_reporting --output=/tmp/fio.txt
rc=$?
cat /tmp/fio.txt
[ $rc = 0 ] || fail "fio exited $rc"
fio_verified /tmp/fio.txt
ok "fio verify across the link passed"
trap - EXIT
ublk_cleanup
