# NBD over the SRP LUN: fio's nbd engine with crc32c verify passes, and data written through NBD
# reads back identical through the kernel ib_srp device.
. /usr/lib/srp-lab/suite/lib.sh
trap 'kill $SRV 2>/dev/null; ublk_cleanup' EXIT
nbd_serve /run/srp-ublk/lun0.sock lun0 --queues 2
cat /tmp/serve.out /tmp/serve.err
[ "$(stat -c %a /run/srp-ublk/lun0.sock)" = 600 ] || fail "socket is not 0600"
URI="nbd+unix:///lun0?socket=/run/srp-ublk/lun0.sock"
info=$(nbdinfo "$URI") || fail "nbdinfo"
echo "$info"
expect_contains "nbdinfo" "$info" "export-size: $SRP_LUN_BYTES"
expect_contains "nbdinfo" "$info" "can_multi_conn: true"
fio --name=nbdv --ioengine=nbd --uri="$URI" --rw=randrw --bs=4k --iodepth=32 --size=64m \
    --offset=64m --verify=crc32c --verify_fatal=1 --eta=never --output=/tmp/fio-nbd.txt
rc=$?
cat /tmp/fio-nbd.txt; cp /tmp/fio-nbd.txt "$LAB_OUT/fio-nbd.txt"
[ $rc = 0 ] && grep -q 'err= 0' /tmp/fio-nbd.txt || fail "fio over NBD"
ok "fio nbd verify over SRP"
pattern /tmp/n 8
nbdcopy /tmp/n "$URI" || fail "nbdcopy to NBD"
sd=$(lab-ref-attach) || fail "lab-ref-attach"
expect_eq "NBD -> ib_srp" "$(sha_range "$sd" 0 8)" "$(sha256sum < /tmp/n | cut -c1-64)"
kill $SRV; wait $SRV 2>/dev/null
trap - EXIT
ublk_cleanup
