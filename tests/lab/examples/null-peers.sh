#!/bin/sh
# LAB_QEMU_EXTRA="-virtfs local,path=$PWD/target/bench/baseline,mount_tag=baseline,security_model=none,id=baseline" \
#   just lab-run tests/lab/examples/null-peers.sh   (after `just bench counters` put rublk in that share)
# The ublk front end alone, 4 KiB at QD32 over 2 queues x 64: srp-ublk's null backend against rublk's
# null target with and without user recovery (srp-ublk always asks for USER_RECOVERY_REISSUE, for
# `srp-ublk recover`), in rotating rounds; IOPS per run.
set -u
mkdir -p /mnt/baseline
mount -t 9p -o trans=virtio,version=9p2000.L baseline /mnt/baseline || exit 1
R=/mnt/baseline/rublk
new_dev() { before=$(ls /dev/ublkb* 2>/dev/null); "$@" >/dev/null 2>&1 || return 1
    for x in $(ls /dev/ublkb*); do echo "$before" | grep -qx "$x" || echo "$x"; done; }
s=$(srp-ublk add --backend null:1G --queues 2 --depth 64) || exit 1
r=$(new_dev $R add null -q 2 -d 64) || exit 1
rr=$(new_dev $R add null -q 2 -d 64 -r) || exit 1
echo "srp-ublk $s, rublk $r, rublk -r $rr"
for rw in ${NULL_RW:-randwrite randread}; do
    for round in $(seq ${NULL_ROUNDS:-4}); do
        for e in "srp_ublk_null:$s" "rublk_null:$r" "rublk_null_recovery:$rr"; do
            n=${e%%:*}; d=${e#*:}
            iops=$(fio --name=x --filename="$d" --ioengine=libaio --direct=1 --rw=$rw --bs=4k --iodepth=32 \
                --runtime=5 --time_based --ramp_time=1 --size=512m --eta=never --output-format=terse \
                --terse-version=3 | awk -F';' -v rw=$rw '{print (rw == "randread") ? $8 : $49}')
            echo "null-peers: $rw round $round $n $iops"
        done
    done
done
# per I/O of each daemon at QD32 randwrite: system calls, context switches, CPU (perf stat), and where
# its CPU goes (perf record, cpu-clock)
sp=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/${s#/dev/}.json" | grep -o '[0-9]*$')
for e in "srp_ublk_null:$s:$sp" "rublk_null:$r:$($R list -n "${r#/dev/ublkb}" | grep -o "daemon pid [0-9]*" | grep -o "[0-9]*$")"; do
    n=${e%%:*}; rest=${e#*:}; d=${rest%%:*}; p=${rest#*:}
    perf stat -x, -e raw_syscalls:sys_enter,context-switches,task-clock -p "$p" -o /tmp/$n.stat &
    pp=$!; sleep 0.3
    perf record -e cpu-clock -F 999 -p "$p" -o /tmp/$n.data >/dev/null 2>&1 & rp=$!; sleep 0.3
    ios=$(fio --name=x --filename="$d" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=32 \
        --runtime=5 --time_based --size=512m --eta=never --output-format=terse --terse-version=3 | awk -F';' '{print $47}')
    kill -INT $rp $pp; wait $rp $pp
    echo "null-peers: $n pid $p ios $ios"; cat /tmp/$n.stat | grep -v '^#' | grep -v '^$'
    perf report -i /tmp/$n.data --no-children --sort comm,dso,sym --stdio -q 2>/dev/null | grep '%' | head -25
done
srp-ublk del --all; $R del -a
