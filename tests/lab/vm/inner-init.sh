#!/bin/sh
# /init of the VM inside the lab guest (tests/lab/vm/nested.sh). Its disks are told apart by their
# serial: "tools" is a read-only ext2 image holding fio and its libraries, "ublk" and "ibsrp" are
# virtio-blk disks on /dev/ublkbN and ib_srp's /dev/sdX, and the one whose serial is the LUN's
# (GET_ID) is the vhost-user-blk disk. The job comes from the kernel command line (srpjob=):
#   fs       on each data disk (vhost-user-blk, then ublk): make ext4, write files, print their
#            checksums between markers naming the disk
#   fs,fio   the same, and fio with verify on a file of the vhost-user-blk disk's ext4 (4-64 KiB
#            random writes, QD8), run again until the disk grows (the lab guest's last fault: it
#            grows the LUN), then the new size
#   bench    tests/lab/bench/vm-guest.sh's rounds: the same fio job on each data disk in turn,
#            its I/O between BENCH-BEGIN and BENCH-END lines (the lab guest samples its CPU at
#            each), then a BENCH-RESULT line with fio's terse output
# Unmounts and powers off when done.
export PATH=/bin:/sbin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in crc16 mbcache jbd2 crc32c_generic ext4 virtio_blk; do
    [ -e /mods/$m.ko ] && insmod /mods/$m.ko
done
JOB=fs; ROUNDS=3; SECS=10
for a in $(cat /proc/cmdline); do
    case $a in
        srpjob=*) JOB=${a#srpjob=};;
        srprounds=*) ROUNDS=${a#srprounds=};;
        srpsecs=*) SECS=${a#srpsecs=};;
    esac
done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
sleep 1
# disk NAME: the /dev node of the disk whose serial is NAME ("" when none); "vhost" is the one whose
# serial is none of the others' (the LUN's, from GET_ID)
disk() {
    for d in /sys/block/vd*; do
        [ -e "$d" ] || continue
        s=$(cat "$d/serial" 2>/dev/null)
        case $1 in
            vhost) case $s in tools|ublk|ibsrp) ;; *) echo "/dev/${d##*/}"; return;; esac;;
            *) [ "$s" = "$1" ] && { echo "/dev/${d##*/}"; return; };;
        esac
    done
}
FIO=
tools=$(disk tools)
if [ -n "$tools" ]; then
    mkdir -p /tools && mount -t ext4 -o ro "$tools" /tools &&
        FIO="/tools/lib/ld-linux-x86-64.so.2 --library-path /tools/lib /tools/fio"
fi
case $JOB in
bench)
    [ -n "$FIO" ] || echo "inner: no fio (no tools disk)"
    names=""
    for n in vhost ublk ibsrp; do
        d=$(disk $n); [ -n "$d" ] && names="$names $n:$d"
    done
    echo "inner: bench disks$names, $ROUNDS rounds of $SECS s"
    r=1
    while [ $r -le "$ROUNDS" ]; do
        # the disks' order turns each round, so no disk always runs first or last
        set -- $names; k=1; while [ $k -lt $r ]; do x=$1; shift; set -- "$@" "$x"; k=$((k + 1)); done
        for nd in "$@"; do
            n=${nd%%:*}; d=${nd#*:}
            for c in randread:1 randwrite:1 randread:32 randwrite:32; do
                rw=${c%:*}; qd=${c#*:}
                # the markers come from fio itself, around the job's I/O (its start-up, slow
                # here, left out); fio sends a prerun's output to a file, hence the inner sh
                out=$($FIO --name=b --filename="$d" --direct=1 --ioengine=libaio --rw="$rw" --bs=4k \
                    --iodepth="$qd" --size=256M --time_based --runtime="$SECS" --randrepeat=0 \
                    --exec_prerun="sh -c 'echo BENCH-BEGIN > /dev/console'" \
                    --exec_postrun="sh -c 'echo BENCH-END > /dev/console'" \
                    --output-format=terse --terse-version=3 2>&1 | tail -1)
                echo "BENCH-RESULT $r $n $rw $qd $out"
            done
        done
        r=$((r + 1))
    done
    echo "inner: bench done";;
fs*)
    # each data disk in turn: the vhost-user-blk one, then the one on /dev/ublkbN
    n=0
    for name in vhost ublk; do
        D=$(disk $name); [ -n "$D" ] || continue
        n=$((n + 1))
        size0=$(cat /sys/block/${D#/dev/}/size)
        echo "inner: $name disk $D is $size0 sectors, uptime $(cut -d' ' -f1 /proc/uptime)"
        /sbin/mke2fs -q -t ext4 -F -L srpvm "$D" && mount -t ext4 "$D" /mnt && {
            dd if=/dev/urandom of=/mnt/data.bin bs=1M count=8 2>/dev/null
            echo "written by the VM inside the lab guest" > /mnt/hello.txt
            mkdir /mnt/dir
            for i in $(seq 1 20); do echo "file $i" > /mnt/dir/f$i; done
            echo "inner: SUMS-BEGIN $name"
            (cd /mnt && sha256sum data.bin hello.txt dir/f1 dir/f20)
            echo "inner: SUMS-END $name"
            case $JOB,$name in *fio*,vhost)
                if [ -n "$FIO" ]; then
                    # fio with verify again and again until the disk grows: the lab guest's
                    # faults come while it runs, the LUN's growth the last of them (8 runs at most)
                    echo "inner: FIO-BEGIN"
                    rc=0; runs=0
                    while [ "$(cat /sys/block/${D#/dev/}/size)" = "$size0" ] && [ $runs -lt 8 ]; do
                        $FIO --name=verify --filename=/mnt/fio.dat --size=12M --direct=1 \
                            --ioengine=libaio --rw=randwrite --bsrange=4k-64k --iodepth=8 \
                            --verify=crc32c --do_verify=1 --verify_fatal=1 2>&1 || rc=$?
                        runs=$((runs + 1))
                    done
                    echo "inner: FIO-END exit $rc after $runs run(s)"
                    echo "inner: RESIZED $name $size0 -> $(cat /sys/block/${D#/dev/}/size) sectors"
                else
                    echo "inner: FIO-END no fio"
                fi;;
            esac
            sync; umount /mnt && echo "inner: unmounted $name, uptime $(cut -d' ' -f1 /proc/uptime)"
        }
    done
    [ $n -gt 0 ] || echo "inner: no data disk";;
esac
[ -n "$tools" ] && umount /tools
poweroff -f
