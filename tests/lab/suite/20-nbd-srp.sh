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
# the data registrations one connection made (the state file is rewritten every 2 s)
regs() { memory | sed -n 's/.*, \([0-9]*\) data registration(s).*/\1/p'; }
sleep 2.5; r1=$(regs)
[ "${r1:-0}" -gt 0 ] || fail "no data registrations in 'srp-ublk list' after nbdinfo: '$(memory)'"
fio --name=nbdv --ioengine=nbd --uri="$URI" --rw=randrw --bs=4k --iodepth=32 --size=64m \
    --offset=64m --verify=crc32c --verify_fatal=1 --eta=never --output=/tmp/fio-nbd.txt
rc=$?
cat /tmp/fio-nbd.txt; cp /tmp/fio-nbd.txt "$LAB_OUT/fio-nbd.txt"
[ $rc = 0 ] && grep -q 'err= 0' /tmp/fio-nbd.txt || fail "fio over NBD"
ok "fio nbd verify over SRP"
# the export in `srp-ublk list`, and its counters in the Prometheus file: nbdcopy's 8 MiB are
# counted exactly once it is done (each connection publishes as it ends, the server writes its
# state file every 2 s)
list=$(srp-ublk list) || fail "srp-ublk list"
echo "$list"
expect_contains "list" "$list" "export lun0  nbd unix:/run/srp-ublk/lun0.sock"
written() {
    sleep 2.5
    srp-ublk stats --prometheus - |
        awk '/^srp_ublk_write_bytes_total[{]export="lun0",/ { s += $2 } END { printf "%d", s }'
}
w0=$(written)
pattern /tmp/n 8
nbdcopy /tmp/n "$URI" || fail "nbdcopy to NBD"
w1=$(written)
expect_eq "bytes written by nbdcopy, from the export's counters" "$((w1 - w0))" 8388608
total=$(srp-ublk list --json | grep -o '"connections_total": *[0-9]*' | grep -o '[0-9]*$')
[ "${total:-0}" -ge 3 ] || fail "connections since start: ${total:-none} (nbdinfo, fio, nbdcopy made at least 3)"
ok "the export's counters: nbdcopy's 8 MiB written, $total connection(s) since start"
# a channel keeps the buffers its last connection registered: the export's 2 channels registered
# at most twice what nbdinfo's connection did, however many connections came since
rn=$(regs)
[ "${rn:-0}" -le $((2 * r1)) ] ||
    fail "data registrations after $total connections: $rn (nbdinfo's connection made $r1; at most $((2 * r1)) over 2 channels)"
ok "data registrations: $r1 after the first connection, $rn after $total"
sd=$(lab-ref-attach) || fail "lab-ref-attach"
expect_eq "NBD -> ib_srp" "$(sha_range "$sd" 0 8)" "$(sha256sum < /tmp/n | cut -c1-64)"
kill $SRV; wait $SRV 2>/dev/null
[ ! -e "/run/srp-ublk/exports/$SRV.json" ] || fail "serve left its state file after SIGTERM"
expect_eq "list after the server stopped" "$(srp-ublk list | grep -c '^export')" 0
trap - EXIT
ublk_cleanup
