#!/bin/sh
# just lab-run tests/lab/examples/profile-qd1.sh: where srp-ublk's own CPU goes at QD1 (4 KiB randread,
# --poll interrupt, 1 queue): the queue thread's syscalls (strace -c) and a cpu-clock profile
# (perf; qemu TCG has no PMU) of the daemon. Results in target/lab/out/.
PERF_OPTS=${PERF_OPTS:-}
dev=$(srp-ublk add --target "$SRP_TARGET" --queues 1 --poll ${POLL:-interrupt}) || exit 1
pid=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/${dev#/dev/}.json" | grep -o '[0-9]*$')
job() { fio --name=p --filename=$dev --ioengine=libaio --direct=1 --rw=randread --bs=4k --iodepth=1 --runtime=$1 \
    --time_based --size=200m --eta=never --output-format=terse --terse-version=3 | awk -F';' '{print "IOPS", $8}'; }
job 3
strace -c -f -p "$pid" -o "$LAB_OUT/strace-qd1.txt" & sp=$!
sleep 1; job 5; kill -INT $sp; wait $sp
echo "--- syscalls of the daemon over 5 s of QD1 (strace -c)"; head -30 "$LAB_OUT/strace-qd1.txt"
perf record -e cpu-clock -F 2000 -g -p "$pid" -o /tmp/perf.data -- sleep 6 >/dev/null 2>&1 & pp=$!
sleep 0.5; job 5; wait $pp
perf report -i /tmp/perf.data --no-children --sort dso,sym --stdio 2>/dev/null | grep -v '^$' | grep -v '^#' | grep '%' | head -40 > "$LAB_OUT/perf-qd1.txt"
echo "--- perf (cpu-clock) of the daemon over 5 s of QD1"; cat "$LAB_OUT/perf-qd1.txt"
srp-ublk del --all
