# In the lab guest (tests/lab/vm/nested.sh): attach LIO's LUN 0 with srp-ublk and boot a VM (QEMU,
# TCG) on /dev/ublkb0; then check the file system and files the VM left there. In vhost mode the
# VM's disk is `serve --vhost-user-blk`, the VM also runs fio with verify on it, and the file
# system and files are checked through the kernel's ib_srp afterwards.
. /usr/lib/srp-lab/suite/lib.sh
mkdir -p /mnt/nested /mnt/d
mount -t 9p -o trans=virtio,version=9p2000.L nested /mnt/nested || fail "mounting the nested share"
N=/mnt/nested
MODE=$(cat $N/mode)
if [ "$MODE" = vhost ]; then
    # the disk is served as vhost-user-blk; the files are checked through ib_srp afterwards
    vhost_serve "$SRP_TARGET" --queues 2
    DEV=/dev/ublkb0
    echo "lab guest: vhost-user-blk on /run/srp-ublk/vm0.sock over $SRP_TARGET"
else
    DEV=$(ublk_add --queues 2) || fail "srp-ublk add"
    echo "lab guest: $DEV over $SRP_TARGET"
fi
echo "lab guest: the VM's disk: $(sed "s|/dev/ublkb0|$DEV|" $N/qemu-disk-opts)"
t0=$(now)
# the documented memory size is a real VM's; this one has 256 MiB
OPTS=$(sed -e "s|/dev/ublkb0|$DEV|" -e "s|memory-backend-memfd,id=mem,size=[^,]*|memory-backend-memfd,id=mem,size=256M|" $N/qemu-disk-opts)
TMO=1200; JOB=fs; TOOLS=
if [ "$MODE" = vhost ]; then
    # and fio with verify, from the read-only tools disk
    TMO=600; JOB=fs,fio
    TOOLS="-drive file=$N/tools.img,format=raw,if=none,id=tools,readonly=on -device virtio-blk-pci,drive=tools,serial=tools"
fi
timeout $TMO $N/lib/ld-linux-x86-64.so.2 --library-path $N/lib $N/qemu-system-x86_64 \
    -L $N/firmware -accel tcg -cpu max -m 256M -machine pc -nodefaults -no-reboot \
    -display none -monitor none -serial file:/tmp/inner.log -nic none \
    -kernel $N/vmlinuz -initrd $N/initrd.gz \
    -append "console=ttyS0 rdinit=/init panic=-1 loglevel=3 mitigations=off quiet srpjob=$JOB" \
    $OPTS $TOOLS > /tmp/inner-qemu.log 2>&1
rc=$?
took=$(since "$t0")
cat /tmp/inner.log
echo "lab guest: the inner VM ran ${took} s (qemu exit $rc)"
echo "the inner VM (TCG under TCG) on $([ "$MODE" = vhost ] && echo vhost-user-blk || echo "$DEV") booted, made ext4, wrote 8 MiB + 21 files and powered off in ${took} s" > "$LAB_OUT/nested-time.txt"
[ "$rc" = 0 ] || { [ "$MODE" = vhost ] && cat /tmp/vhost.log; fail "inner qemu: $(cat /tmp/inner-qemu.log)"; }
grep -q "inner: unmounted" /tmp/inner.log || { [ "$MODE" = vhost ] && cat /tmp/vhost.log; fail "the inner VM did not finish its job"; }
if [ "$MODE" = vhost ]; then
    # `srp-ublk list` and the Prometheus file show the export and what went without a copy
    sleep 2.5
    srp-ublk list | tee /tmp/list.txt
    grep -q "^export srp  vhost-user-blk /run/srp-ublk/vm0.sock" /tmp/list.txt ||
        fail "the vhost-user-blk export is not in srp-ublk list"
    zc=$(srp-ublk stats --prometheus - |
        awk '/^srp_ublk_zero_copy_bytes_total[{]export="srp",lun="0",queue="0"[}]/ { printf "%d", $2 }')
    # the served disk's log says how the data went: the target moved it to and from guest memory
    kill $VPID; wait $VPID 2>/dev/null
    sed 's/^/vhost: /' /tmp/vhost.log | grep -v "^vhost: *$" | tail -20
    grep -q "queue 0: [1-9][0-9]* requests, [1-9][0-9]* MiB zero copy" /tmp/vhost.log ||
        fail "no zero-copy request on queue 0 in the server's log"
    # some requests had several guest buffers: indirect descriptors the target executed
    grep -q "queue 0: .* [1-9][0-9]* in several segments" /tmp/vhost.log ||
        fail "no request went as several segments on queue 0"
    ok "vhost-user-blk: $(grep -o 'queue 0: .*' /tmp/vhost.log | tail -1)"
    logged=$(grep -o 'queue 0: [0-9]* requests, [0-9]* MiB zero copy' /tmp/vhost.log | tail -1 |
        grep -o '[0-9]* MiB' | grep -o '[0-9]*')
    expect_eq "queue 0's zero-copy MiB, Prometheus file against the log" "$(( ${zc:-0} >> 20 ))" "$logged"
    # fio's verify in the VM read back every block it wrote through the served disk
    sed -n '/FIO-BEGIN/,/FIO-END/p' /tmp/inner.log | tr -d '\r' > /tmp/fio.txt
    grep -q "FIO-END exit 0" /tmp/fio.txt || { cat /tmp/fio.txt; fail "fio with verify in the VM failed"; }
    fio_verified /tmp/fio.txt
    ok "fio verify in the VM: $(grep -o 'WRITE: bw=[^,]*' /tmp/fio.txt | head -1), 0 errors"
    # the bytes the target holds, read through the kernel's initiator
    DEV=$(lab-ref-attach) || fail "lab-ref-attach after the VM"
    echo "lab guest: checking through ib_srp's $DEV"
fi
sed -n '/SUMS-BEGIN/,/SUMS-END/p' /tmp/inner.log | grep -v SUMS | sed 's/\r$//' > /tmp/sums.txt
[ "$(wc -l < /tmp/sums.txt)" = 4 ] || fail "the inner VM printed no checksums"
e2fsck -fn "$DEV" > /tmp/fsck.log 2>&1 || { cat /tmp/fsck.log; fail "e2fsck of $DEV after the VM"; }
ok "e2fsck of $DEV: clean"
mount -t ext4 -o ro "$DEV" /mnt/d || fail "mounting $DEV"
(cd /mnt/d && sha256sum -c /tmp/sums.txt) || fail "files on $DEV differ from what the VM wrote"
ok "4 files on $DEV match the VM's checksums"
umount /mnt/d
srp-ublk del --all
lab-ref-detach >/dev/null 2>&1 || true
