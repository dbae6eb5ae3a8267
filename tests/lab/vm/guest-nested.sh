# In the lab guest (tests/lab/vm/nested.sh): a VM (QEMU, TCG) with two disks, LUN 5 (a dm-linear
# device LIO exports) served as vhost-user-blk and LUN 1 attached as /dev/ublkbN. While the VM's fio
# verifies the vhost-user-blk disk, memory is hot-plugged into the VM (QEMU sends the server a new
# memory table), the fabric's link flaps and the target port drops, then the dm device is
# suspended so that the target holds the writes the server sent, and the server is killed
# (kill -9) with them outstanding; the device resumes, a new server starts, QEMU reconnects and
# gives it the inflight region, and the new server takes the killed one's requests again; then
# `srp-ublk upgrade --export` re-executes the server under QEMU, and last LUN 5 grows and
# `srp-ublk resize --export` tells QEMU: the VM sees its disk grow, and its fio stops. Then the
# file systems and files the VM left: LUN 5's through the kernel's ib_srp, LUN 1's on /dev/ublkbN.
. /usr/lib/srp-lab/suite/lib.sh
. /usr/lib/srp-lab/setup.sh   # lab_export_lun
mkdir -p /mnt/nested /mnt/d
mount -t 9p -o trans=virtio,version=9p2000.L nested /mnt/nested || fail "mounting the nested share"
N=/mnt/nested
. $N/nested.env
modprobe loop 2>/dev/null; modprobe dm_mod 2>/dev/null
img=/tmp/vm-lun.img
rm -f $img; truncate -s 256M $img
loopdev=$(losetup -f) && losetup "$loopdev" $img || fail "losetup $loopdev $img"
lab_dm_create lab-vm "0 524288 linear $loopdev 0" || fail "dmsetup create lab-vm"
trap 'dmsetup resume lab-vm 2>/dev/null' EXIT
lab_export_lun 5 /dev/mapper/lab-vm || fail "exporting lab-vm as LUN 5"
# the server's ring starts and inflight region in its log too
export SRP_UBLK_LOG=info,libublk=warn,srp_ublk::frontend::vhost=debug
# its own initiator_ext: a second login of srp-ublk's nexus would end the ublk device's channels;
# the timers of the suite's link flap tests (a reconnect every 2 s, fast_io_fail after 90 s): with
# the defaults (10 s, 15 s) a first attempt that fails after the 8 s flap fails the guest's I/O
TMO="--reconnect-delay 2 --fast-io-fail-tmo 90 --dev-loss-tmo 300"
SERVE="$SRP_TARGET,initiator_ext=3 --queues 2 --lun 5 $TMO"
vhost_serve $SERVE
echo "lab guest: vhost-user-blk on /run/srp-ublk/vm0.sock over LUN 5 of $SRP_TARGET"
DEV=$(ublk_add --queues 2 --lun 1 $TMO) || fail "srp-ublk add --lun 1: $DEV"
echo "lab guest: $DEV over LUN 1"
# the documented memory size is a real VM's; this one has 256 MiB, and room for a 128 MiB DIMM
OPTS=$(sed "s|memory-backend-memfd,id=mem,size=[^,]*|memory-backend-memfd,id=mem,size=256M|" $N/qemu-disk-opts)
UBLK="$(sed "s|/dev/ublkb0|$DEV|" $N/qemu-ublk-opts) -device virtio-blk-pci,drive=ublk0,serial=ublk"
echo "lab guest: the VM's disks: $OPTS $UBLK"
TOOLS="-drive file=$N/tools.img,format=raw,if=none,id=tools,readonly=on -device virtio-blk-pci,drive=tools,serial=tools"
# QEMU reconnects to a restarted server (the option's name changed in QEMU 9.2)
qv=$($N/lib/ld-linux-x86-64.so.2 --library-path $N/lib $N/qemu-system-x86_64 --version | grep -o 'version [0-9]*\.[0-9]*' | grep -o '[0-9].*')
case $qv in [0-8].*|9.[01]) again=reconnect=1;; *) again=reconnect-ms=1000;; esac
OPTS=$(echo "$OPTS" | sed "s|\(-chardev socket,id=vhost0,[^ ]*\)|\1,$again|")
# the monitor on a pipe pair (QEMU's pipe: chardev), for the hot-plug
rm -f /tmp/mon.in /tmp/mon.out; mkfifo /tmp/mon.in /tmp/mon.out
: > /tmp/inner.log
t0=$(now)
timeout 900 $N/lib/ld-linux-x86-64.so.2 --library-path $N/lib $N/qemu-system-x86_64 \
    -L $N/firmware -accel tcg -cpu max -m 256M,slots=2,maxmem=512M -machine pc -nodefaults -no-reboot \
    -display none -monitor pipe:/tmp/mon -serial file:/tmp/inner.log -nic none \
    -kernel $N/vmlinuz -initrd $N/initrd.gz \
    -append "console=ttyS0 rdinit=/init panic=-1 loglevel=3 mitigations=off quiet srpjob=fs,fio" \
    $OPTS $UBLK $TOOLS > /tmp/inner-qemu.log 2>&1 &
QPID=$!
cat /tmp/mon.out > /tmp/mon.log &
# the hot-plug: once fio runs, a DIMM backed by a shared memfd (as the VM's memory must be)
i=0; while ! grep -q "inner: FIO-BEGIN" /tmp/inner.log && kill -0 $QPID 2>/dev/null && [ $i -lt 6000 ]; do
    sleep 0.1; i=$((i + 1))
done
tables0=$(grep -c "the VMM's memory table:" /tmp/vhost.log)
if grep -q "inner: FIO-BEGIN" /tmp/inner.log; then
    sleep 3
    echo "object_add memory-backend-memfd,id=hp1,size=128M,share=on" > /tmp/mon.in
    echo "device_add pc-dimm,id=dimm1,memdev=hp1" > /tmp/mon.in
    echo "info memory_size_summary" > /tmp/mon.in
    # the faults, each once the guest's writes flow (fio's layout goes to the page cache first,
    # and a fault must find writes under way): counters prints "WRITES ERRORS", the server's
    # completed writes and I/O errors for the export, from its queues' counters (a new image
    # counts from 0: successive samples are compared; a failed request counts as a write too: the
    # errors must stay 0, as no fault here lasts to fast_io_fail_tmo, 90 s)
    counters() {
        srp-ublk stats --prometheus - 2>/dev/null | awk '
            $1 ~ /^srp_ublk_write_ops_total[{]export="srp",/ { w += $2 }
            $1 ~ /^srp_ublk_io_errors_total[{]export="srp",/ { e += $2 }
            END { printf "%d %d", w, e }'
    }
    writes() { c=$(counters); echo "${c% *}"; }
    flowing() {
        i=0; w0=$(writes); bad="the guest's writes did not flow within 300 s"
        while [ $i -lt 120 ]; do
            sleep 2.5; c=$(counters); w1=${c% *}; e=${c#* }
            [ "$e" = 0 ] || { bad="the server answered $e request(s) with an I/O error"; break; }
            [ "$w1" -gt "$w0" ] && return 0
            w0=$w1; i=$((i + 1))
        done
        for f in /tmp/vhost-killed*.log; do
            echo "---- $f, the last 40 lines"; tail -40 "$f"
        done
        echo "---- the server's log"; cat /tmp/vhost.log
        echo "---- the VM's kernel errors"; grep -aE 'I/O error|EXT4-fs|virtio|blk_|Buffer I/O' /tmp/inner.log | head -40
        echo "---- the VM's console"; tail -40 /tmp/inner.log
        echo "---- QEMU's messages"; cat /tmp/inner-qemu.log
        srp-ublk list
        echo "---- the server's threads"; eu-stack -p "$VPID" 2>&1 | head -150
        for t in /proc/$VPID/task/*; do
            echo "== $t $(cat "$t/comm") $(cat "$t/wchan") syscall $(cut -d' ' -f1 "$t/syscall")"
        done
        echo "---- QEMU's threads"; eu-stack -p "$QPID" 2>&1 | grep -A12 "^TID" | head -120
        fail "$1: $bad"
    }
    # a link flap (the fabric's netdev down 8 s: the channels reconnect, I/O is held) and a
    # target drop (LIO's target port disabled 6 s)
    flowing "before the link flap"
    ip link set dummy0 down; sleep 8; ip link set dummy0 up
    flowing "after the link flap"
    echo "lab guest: link flap under fio (dummy0 down 8 s): the guest's writes flow again"
    echo 0 > "$SRP_TPG/enable"; sleep 6; echo 1 > "$SRP_TPG/enable"
    flowing "after the target drop"
    echo "lab guest: target drop under fio (the target port disabled 6 s): the guest's writes flow again"
    # the LUN's device suspended: the target holds what the server sends, and the server is
    # killed with it outstanding; a new server starts on the socket, QEMU reconnects and gives
    # it the inflight region, and what the killed one had taken is taken again
    # (VM_KILLS in nested.env: that many kills in a row, to hunt a rare failure)
    k=1
    while [ $k -le "${VM_KILLS:-1}" ]; do
        dmsetup suspend lab-vm || fail "dmsetup suspend lab-vm"
        # the kill must find writes with the target (the guest's writes come in bursts): wait
        # until queue 0 has commands out, its credits below the login's req_lim
        lim=$(grep -o 'req_lim [0-9]*' /tmp/vhost.log | tail -1 | grep -o '[0-9]*')
        i=0; out=0
        while [ $i -lt 60 ]; do
            sleep 1; i=$((i + 1))
            c=$(srp-ublk list | awk '/^export srp /{e=1; next} e && / q0 channel / {
                for (j = 1; j < NF; j++) if ($j == "credits") print $(j + 1); exit }')
            [ -n "$c" ] && [ "$c" -lt "${lim:-128}" ] && { out=$((${lim:-128} - c)); break; }
        done
        echo "lab guest: LUN 5 suspended under fio, $out command(s) with the target: killing the server ($k of ${VM_KILLS:-1})"
        kill -9 $VPID; wait $VPID 2>/dev/null
        dmsetup resume lab-vm || fail "dmsetup resume lab-vm"
        # the first server's log has the hot-plug's memory table
        if [ $k = 1 ]; then mv /tmp/vhost.log /tmp/vhost-killed.log; else mv /tmp/vhost.log /tmp/vhost-killed-$k.log; fi
        sleep 2
        vhost_serve $SERVE
        echo "lab guest: the server was killed (kill -9) under fio and started again"
        i=0; while ! grep -q "ring starts" /tmp/vhost.log && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
        flowing "after kill $k"
        k=$((k + 1))
    done
    # the server upgraded in place (the same binary here): the new image serves, QEMU
    # reconnects to it and gives it the inflight region; the new image holds the guest's memory
    # files QEMU gave it, not the old image's too
    memfds() { ls -l /proc/$VPID/fd | grep -c 'memfd:'; }
    before=$(memfds)
    srp-ublk upgrade --export srp > /tmp/upgrade.txt 2>&1 ||
        { cat /tmp/upgrade.txt /tmp/vhost.log; fail "srp-ublk upgrade --export srp failed"; }
    echo "lab guest: $(cat /tmp/upgrade.txt)"
    flowing "after the upgrade"
    [ "$(memfds)" = "$before" ] ||
        fail "the upgraded server holds $(memfds) memfd descriptors, the image before it $before: $(ls -l /proc/$VPID/fd)"
    # last, LUN 5 grows by 64 MiB (the file, the loop device, the dm table; LIO reads the new
    # size) and `srp-ublk resize --export` has the server read it and tell QEMU; the VM's fio
    # ends its run when its disk has grown
    truncate -s 320M $img && losetup -c "$loopdev" &&
        dmsetup reload lab-vm --table "0 655360 linear $loopdev 0" && dmsetup resume lab-vm ||
        fail "growing lab-vm to 320 MiB"
    srp-ublk resize --export srp > /tmp/resize.txt 2>&1 ||
        { cat /tmp/resize.txt /tmp/vhost.log; fail "srp-ublk resize --export srp failed"; }
    echo "lab guest: $(cat /tmp/resize.txt)"
fi
wait $QPID
rc=$?
took=$(since "$t0")
cat /tmp/inner.log
echo "lab guest: the inner VM ran ${took} s (qemu exit $rc)"
echo "the inner VM (TCG under TCG) on vhost-user-blk and $DEV booted, made ext4 on each, wrote 8 MiB + 21 files on each, ran fio verify through a memory hot-plug, a link flap, a target drop, the server's kill, upgrade and a resize, and powered off in ${took} s" > "$LAB_OUT/nested-time.txt"
[ "$rc" = 0 ] || { cat /tmp/vhost.log; fail "inner qemu: $(cat /tmp/inner-qemu.log)"; }
# the guest saw LUN 5 grow while its fio ran
grep -q "export 'srp': resized from 268435456 to 335544320 bytes" /tmp/resize.txt ||
    fail "srp-ublk resize --export: $(cat /tmp/resize.txt)"
grep -q "inner: RESIZED vhost 524288 -> 655360 sectors" /tmp/inner.log ||
    fail "the VM's vhost-user-blk disk did not grow with LUN 5: $(grep RESIZED /tmp/inner.log)"
grep -q "export srp: server pid $VPID runs the installed binary again" /tmp/upgrade.txt ||
    fail "srp-ublk upgrade --export: $(cat /tmp/upgrade.txt)"
grep -q "upgrade: the export goes over to the binary at" /tmp/vhost.log ||
    fail "the server's log does not say it was upgraded"
[ "$(grep -c "serving vhost-user-blk" /tmp/vhost.log)" = 2 ] ||
    fail "the upgraded server did not serve again: $(grep "serving vhost-user-blk" /tmp/vhost.log)"
ok "srp-ublk upgrade --export under fio: the server (pid $VPID) serves from a new image, QEMU reconnected, $before memfd descriptors before and after"
ok "LUN 5 grown by 64 MiB under fio: srp-ublk resize --export told QEMU, the VM's disk went from 524288 to 655360 sectors"

[ "$(grep -c "inner: unmounted" /tmp/inner.log)" = 2 ] ||
    { cat /tmp/vhost.log; fail "the inner VM did not finish its job on both disks"; }
# the hot-plug reached the server as a memory table with the DIMM, taken while fio ran
tr -d '\r' < /tmp/mon.log | grep -a "memory: " | sed 's/^/monitor: /'
grep -a -q "plugged memory: 134217728" /tmp/mon.log || fail "the DIMM was not plugged: $(cat /tmp/mon.log)"
grep -E "memory table|inflight|ring starts" /tmp/vhost-killed.log | sed 's/^/vhost (killed): /'
tables=$(grep -c "the VMM's memory table:" /tmp/vhost-killed.log)
[ "$tables" -gt "$tables0" ] || fail "no new memory table reached the server after the hot-plug"
mib() { grep -o "the VMM's memory table: .*" /tmp/vhost-killed.log | sed -n "$1" | grep -o '[0-9]* MiB' | grep -o '[0-9]*'; }
first=$(mib 1p); last=$(mib '$p')
expect_eq "the last memory table's MiB beyond the first's (the DIMM)" "$(( ${last:-0} - ${first:-0} ))" 128
ok "memory hot-plugged while fio ran: the server took the new table ($first -> $last MiB)"
# the new server got QEMU's inflight region back and took again what the killed one had taken
grep -E "inflight|taken again|memory table|ring starts" /tmp/vhost.log | sed 's/^/vhost (new): /'
grep -q "the VMM's inflight region: 2 queue(s)" /tmp/vhost.log ||
    fail "QEMU did not give the new server its inflight region"
grep -q "request(s) the last backend took and did not answer are taken again" /tmp/vhost.log ||
    fail "the new server took nothing again: nothing was in flight when the server was killed?"
ok "the server killed under fio: QEMU reconnected, $(grep -o '[0-9]* request(s) the last backend took' /tmp/vhost.log | awk '{ n += $1 } END { print n }') request(s) taken again"
# `srp-ublk list` and the Prometheus file show the export and what went without a copy
sleep 2.5
srp-ublk list | tee /tmp/list.txt
grep -q "^export srp  vhost-user-blk /run/srp-ublk/vm0.sock" /tmp/list.txt ||
    fail "the vhost-user-blk export is not in srp-ublk list"
zc=$(srp-ublk stats --prometheus - |
    awk '/^srp_ublk_zero_copy_bytes_total[{]export="srp",lun="5",queue="0"[}]/ { printf "%d", $2 }')
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
# every run's error count, not only one
grep -E 'err= *[1-9]' /tmp/fio.txt && fail "a fio run in the VM reported I/O errors"
runs=$(grep -o 'FIO-END exit 0 after [0-9]* run' /tmp/fio.txt | grep -o '[0-9]* run')
[ "$(grep -c 'err= 0' /tmp/fio.txt)" -ge "${runs% run}" ] || fail "fewer fio results than its $runs(s)"
ok "fio verify in the VM, $runs(s) through the link flap, the target drop, the kill, the upgrade and the resize: $(grep -o 'WRITE: bw=[^,]*' /tmp/fio.txt | head -1), 0 errors"
# check DISK DEV: the file system and the files the VM left on disk DISK, read through DEV
check() {
    sed -n "/SUMS-BEGIN $1/,/SUMS-END $1/p" /tmp/inner.log | grep -v SUMS | sed 's/\r$//' > /tmp/sums.txt
    [ "$(wc -l < /tmp/sums.txt)" = 4 ] || fail "the inner VM printed no checksums for its $1 disk"
    e2fsck -fn "$2" > /tmp/fsck.log 2>&1 || { cat /tmp/fsck.log; fail "e2fsck of $2 after the VM"; }
    ok "e2fsck of $2 (the VM's $1 disk): clean"
    mount -t ext4 -o ro "$2" /mnt/d || fail "mounting $2"
    (cd /mnt/d && sha256sum -c /tmp/sums.txt) || fail "files on $2 differ from what the VM wrote"
    ok "4 files on $2 match the VM's checksums"
    umount /mnt/d
}
check ublk "$DEV"
srp-ublk del --all
# the bytes the target holds for LUN 5, read through the kernel's initiator
SD=$(REF_LUN=5 lab-ref-attach) || fail "lab-ref-attach after the VM"
echo "lab guest: checking LUN 5 through ib_srp's $SD"
check vhost "$SD"
lab-ref-detach >/dev/null 2>&1 || true
lab_unexport_lun 5
dmsetup remove lab-vm; losetup -d "$loopdev"; rm -f $img
