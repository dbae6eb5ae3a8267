# fio with crc32c verify through /dev/ublkb0: random read/write, block sizes 512 B to 1 MiB mixed,
# iodepth 32, 2 jobs, 1 GiB moved in total. 0 verify errors.
. /usr/lib/srp-lab/suite/lib.sh
trap 'show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 2) || fail "srp-ublk add: $dev"
half=$((SRP_LUN_BYTES / 2))
fio --name=verify --filename="$dev" --ioengine=libaio --direct=1 --rw=randrw \
    --bssplit=512/10:4k/40:64k/25:256k/15:1m/10 --iodepth=32 --numjobs=2 \
    --size=$half --offset_increment=$half --io_size=512m \
    --verify=crc32c --verify_backlog=1024 --verify_fatal=1 --do_verify=1 \
    --group_reporting --output=/tmp/fio.txt
rc=$?
cat /tmp/fio.txt
cp /tmp/fio.txt "$LAB_OUT/fio-verify.txt"
[ $rc = 0 ] || fail "fio exited $rc"
fio_verified /tmp/fio.txt
ok "fio verify passed"
trap - EXIT
ublk_cleanup
