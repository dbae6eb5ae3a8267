# SCSI errors a block device user expects to see as such, from LIO itself:
#  - a bad region: LUN 6 is a dm device whose 9th MiB is dm's "error" target, so LIO fails I/O there
#    with CHECK CONDITION (NOT READY, LOGICAL UNIT COMMUNICATION FAILURE). A read or write of that
#    MiB fails with EIO, that I/O alone: the rest of the LUN reads back what was written, nothing
#    reconnects, and verified writes around it carry on.
#  - a read-only LUN: LUN 7 mapped write-protected in the ACL (MODE SENSE's WP bit) becomes a
#    read-only ublk device: writes are refused by the kernel, reads return the LUN's data.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh   # lab_export_lun
ublk_cleanup
modprobe loop 2>/dev/null; modprobe dm_mod 2>/dev/null
bad=/tmp/bad.img; ro=/tmp/ro.img
rm -f $bad $ro; truncate -s 16M $bad
pattern $ro 8
loop_bad=$(losetup -f) && losetup "$loop_bad" $bad || fail "losetup $loop_bad $bad"
loop_ro=$(losetup -f) && losetup "$loop_ro" $ro || fail "losetup $loop_ro $ro"
printf '0 16384 linear %s 0\n16384 2048 error\n18432 14336 linear %s 18432\n' "$loop_bad" "$loop_bad" |
    lab_dm_create lab-bad || fail "dmsetup create lab-bad"
unmap() {
    lab_unexport_lun 6; lab_unexport_lun 7
    dmsetup remove lab-bad 2>/dev/null; losetup -d "$loop_bad" "$loop_ro" 2>/dev/null; rm -f $bad $ro
}
trap 'show_logs; ublk_cleanup; unmap' EXIT
lab_export_lun 6 /dev/mapper/lab-bad || fail "exporting lab-bad as LUN 6"
lab_export_lun 7 "$loop_ro" || fail "exporting $loop_ro as LUN 7"
echo 1 > "$SRP_TPG/acls/$LAB_IP/lun_7/write_protect" || fail "write-protecting LUN 7 in the ACL"

# --- the bad region
dev=$(ublk_add --queues 1 --lun 6) || fail "srp-ublk add --lun 6: $dev"
pattern /tmp/good 4
for off in 0 12; do
    dd if=/tmp/good of="$dev" bs=1M seek=$off oflag=direct conv=fsync 2>/dev/null || fail "write at $off MiB"
done
t=$(now)
out=$(dd if="$dev" of=/dev/null bs=4k skip=2048 count=1 iflag=direct 2>&1) &&
    fail "a read of the error region succeeded: $out"
echo "read of the error region failed after $(since "$t") s: $(echo "$out" | head -n 1)"
expect_contains "read of the error region" "$out" "Input/output error"
out=$(dd if=/tmp/good of="$dev" bs=4k seek=2100 count=1 oflag=direct 2>&1) &&
    fail "a write to the error region succeeded: $out"
expect_contains "write to the error region" "$out" "Input/output error"
want=$(sha256sum < /tmp/good | cut -c1-64)
expect_eq "data before the error region" "$(sha_range "$dev" 0 4)" "$want"
expect_eq "data after the error region" "$(sha_range "$dev" 12 4)" "$want"
expect_eq "reconnects after the errors" "$(reconnects)" 0
expect_eq "queue states after the errors" "$(queue_states)" "running "
# verified writes to the good part of the LUN go on as before
fio --name=after --filename="$dev" --rw=randwrite --bs=4k --size=8m --offset=0 --direct=1 \
    --ioengine=libaio --iodepth=8 --verify=crc32c --do_verify=1 --output=/tmp/fio-bad.txt ||
    fail "fio verify on the good part after the errors: $(cat /tmp/fio-bad.txt)"
expect_contains "fio after the errors" "$(cat /tmp/fio-bad.txt)" "err= 0"
srp-ublk del --all >/dev/null || fail "del"

# --- the read-only LUN
dev=$(ublk_add --queues 1 --lun 7) || fail "srp-ublk add --lun 7: $dev"
expect_eq "read-only flag of $dev" "$(blockdev --getro "$dev")" 1
srp-ublk list | grep -q "read-only" || fail "list does not say read-only: $(srp-ublk list)"
ok "list says read-only"
out=$(dd if=/tmp/good of="$dev" bs=4k count=1 oflag=direct 2>&1) && fail "a write to the read-only device succeeded"
echo "write to the read-only device: $(echo "$out" | head -n 1)"
expect_eq "data of the read-only LUN" "$(sha_range "$dev" 0 8)" "$(sha256sum < $ro | cut -c1-64)"
trap - EXIT
ublk_cleanup
unmap
