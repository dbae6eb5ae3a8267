#!/bin/sh
# The lab half of `just bench vm` (tests/lab/vm/nested.sh with NESTED_MODE=bench): one VM (QEMU,
# TCG under TCG) with the same LIO LUN three times: (a) `srp-ublk serve --vhost-user-blk`, (b)
# virtio-blk on /dev/ublkb0, (c) virtio-blk on ib_srp's /dev/sdX, the QEMU options docs/vm-hosts.md
# gives for each. The VM's /init (tests/lab/vm/inner-init.sh, srpjob=bench) runs the same fio job
# on each disk in turn, in rounds whose disk order turns; fio prints BENCH-BEGIN and BENCH-END on
# the console around its I/O, and this script samples, at each, the lab guest's CPU: all of it, the
# inner QEMU's vCPU thread (the guest's own work, left out of the host's cost), QEMU's other threads
# (its I/O work), srp-ublk's processes, and the stats of the two srp-ublk front ends (bytes copied).
# One line per run goes to $LAB_OUT/vm-bench.txt; tests/lab/bench/vm.py reports the ratios.
. /usr/lib/srp-lab/suite/lib.sh
mkdir -p /mnt/nested
mount -t 9p -o trans=virtio,version=9p2000.L nested /mnt/nested || fail "mounting the nested share"
N=/mnt/nested
ROUNDS=3; SECS=10
. $N/bench.env
OUT=$LAB_OUT/vm-bench.txt
# the vhost-user-blk server logs in with an initiator_ext of its own, beside the ublk device's (two
# queues, as docs/vm-hosts.md's num-queues=2; the VM's one vCPU uses queue 0)
vhost_serve "$SRP_TARGET,initiator_ext=3" --queues 2
DEV=$(ublk_add --queues 1) || fail "srp-ublk add"
SD=$(lab-ref-attach) || fail "lab-ref-attach"
echo "vm-bench: vhost-user-blk, $DEV and ib_srp's $SD on $SRP_TARGET; $ROUNDS rounds of ${SECS} s"
OPTS=$(sed "s|memory-backend-memfd,id=mem,size=[^,]*|memory-backend-memfd,id=mem,size=256M|" $N/qemu-disk-opts)
UBLK=$(sed "s|/dev/ublkb0|$DEV|" $N/qemu-ublk-opts)
REF=$(sed "s|/dev/ublkb0|$SD|" $N/qemu-ref-opts)
: > /tmp/inner.log
$N/lib/ld-linux-x86-64.so.2 --library-path $N/lib $N/qemu-system-x86_64 \
    -name vm,debug-threads=on -L $N/firmware -accel tcg -cpu max -m 256M -machine pc -nodefaults -no-reboot \
    -display none -monitor none -serial file:/tmp/inner.log -nic none \
    -kernel $N/vmlinuz -initrd $N/initrd.gz \
    -append "console=ttyS0 rdinit=/init panic=-1 loglevel=3 mitigations=off quiet srpjob=bench srprounds=$ROUNDS srpsecs=$SECS" \
    $OPTS $UBLK -device virtio-blk-pci,drive=ublk0,serial=ublk $REF -device virtio-blk-pci,drive=ref0,serial=ibsrp \
    -drive file=$N/tools.img,format=raw,if=none,id=tools,readonly=on -device virtio-blk-pci,drive=tools,serial=tools \
    > /tmp/inner-qemu.log 2>&1 &
QPID=$!

# The samplers fork nothing (read, not cat/awk), so that sampling costs the guest next to nothing.
# _busy: busy jiffies of the whole lab guest (user nice system irq softirq steal)
busy() {
    read -r _ u n sy _ _ irq sirq st _ < /proc/stat
    _busy=$((u + n + sy + irq + sirq + st))
}
# _in, _out: utime+stime of a process's threads named like PATTERN, and of the others
threads() {
    _in=0; _out=0; _pat=$2
    for t in /proc/$1/task/*; do
        read -r s < "$t/stat" 2>/dev/null || continue
        c=${s#*(}; c=${c%%)*}; set -- ${s##*) }
        case $c in $_pat) _in=$((_in + ${12} + ${13}));; *) _out=$((_out + ${12} + ${13}));; esac
    done
}
# _s: utime+stime of every srp-ublk process
srp_cpu() {
    _s=0
    for c in /proc/[0-9]*/comm; do
        read -r name < "$c" 2>/dev/null || continue
        [ "$name" = srp-ublk ] || continue
        read -r s < "${c%comm}stat" 2>/dev/null || continue
        set -- ${s##*) }; _s=$((_s + ${12} + ${13}))
    done
}
# S: the four counters now
snap() { busy; threads $QPID 'CPU */TCG'; srp_cpu; S="$_busy $_in $_out $_s"; }

# follow the VM's console: a sample at each BEGIN and END (a line may arrive in pieces)
exec 3< /tmp/inner.log
part=; cr=$(printf '\r')
while :; do
    if IFS= read -r l <&3; then
        l=$part${l%"$cr"}; part=
        case $l in
            BENCH-BEGIN*) snap; B=$S; E=;;
            BENCH-END*) snap; E=$S;;
            BENCH-RESULT*) set -- $l
                if [ -n "${B:-}" ] && [ -n "${E:-}" ]; then
                    echo "run $2 $3 $4 $5 cpu $B $E fio ${6:-none}" >> "$OUT"
                else
                    echo "vm-bench: round $2 $3 $4 QD$5: no BENCH-BEGIN/END around it: ${6:-no output}"
                fi
                B=; E=;;
        esac
    else
        part=$part$l
        kill -0 $QPID 2>/dev/null || break
        sleep 0.2
    fi
done
exec 3<&-
wait $QPID; rc=$?
grep -v "^BENCH" /tmp/inner.log | sed 's/^/inner: /' | tail -5
[ "$rc" = 0 ] || fail "inner qemu exit $rc: $(cat /tmp/inner-qemu.log)"
grep -q "inner: bench done" /tmp/inner.log || fail "the VM did not finish its bench"
n=$(grep -c '^run ' "$OUT" 2>/dev/null || echo 0)
[ "$n" -gt 0 ] || fail "no bench run recorded"
echo "vm-bench: $n runs recorded"
kill $VPID; wait $VPID 2>/dev/null
grep "queue 0:" /tmp/vhost.log | tail -1 | sed 's/^/vhost: /' | tee -a "$OUT"
echo "ticks 100" >> "$OUT"
lab-ref-detach >/dev/null 2>&1
srp-ublk del --all
