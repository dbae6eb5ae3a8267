#!/bin/sh
# just lab-run tests/lab/examples/sched-qd1.sh: who holds the CPU while each task of a QD1 I/O waits
# for it. srp-ublk as `just bench` attaches it (2 queues x 64, default poll mode); for 4 KiB randread
# and randwrite at QD1, perf records sched_switch and sched_wakeup on every CPU over 5 s of fio. The
# raw `perf script` text goes to $LAB_OUT/sched-{randread,randwrite}.txt, the daemon's threads to
# $LAB_OUT/sched-tasks.txt and the I/Os to $LAB_OUT/sched-ios.txt; on the host,
# `python3 tests/lab/examples/sched-wait.py target/lab/out` tells the waits apart.
# With SCHED_INITIATOR=ib_srp it traces the kernel's initiator instead (ch_count=2, queue_size=65):
# `{ echo SCHED_INITIATOR=ib_srp; cat tests/lab/examples/sched-qd1.sh; } > /tmp/s.sh; just lab-run /tmp/s.sh`.
if [ "${SCHED_INITIATOR:-srp-ublk}" = ib_srp ]; then
    dev=$(lab-ref-attach "ch_count=2,queue_size=65") || exit 1
    : > "$LAB_OUT/sched-tasks.txt"
else
    dev=$(srp-ublk add --target "$SRP_TARGET" --queues 2 --depth 64) || exit 1
    pid=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/${dev#/dev/}.json" | grep -o '[0-9]*$')
    for t in /proc/"$pid"/task/*; do echo "$(basename "$t") $(cat "$t/comm")"; done > "$LAB_OUT/sched-tasks.txt"
fi
: > "$LAB_OUT/sched-ios.txt"
for rw in randread randwrite; do
    job() { fio --name=p --filename="$dev" --ioengine=libaio --direct=1 --rw=$rw --bs=4k --iodepth=1 \
        --runtime="$1" --time_based --size=200m --eta=never --output-format=terse --terse-version=3; }
    job 3 >/dev/null
    perf record -a -e sched:sched_switch -e sched:sched_wakeup -o /tmp/sched.data -- sleep 5 \
        >/dev/null 2>&1 & pp=$!
    sleep 0.3
    # I/Os completed within perf's 5 s: the run's IOPS (fields 8 and 49: read, write) times 5
    iops=$(job 6 | awk -F';' '{print $8 + $49}')
    wait $pp
    echo "$rw $((iops * 5)) $iops" | tee -a "$LAB_OUT/sched-ios.txt"
    perf script -i /tmp/sched.data -F comm,tid,cpu,time,event,trace > "$LAB_OUT/sched-$rw.txt" 2>/dev/null ||
        { echo "perf script failed"; exit 1; }
done
if [ "${SCHED_INITIATOR:-srp-ublk}" = ib_srp ]; then lab-ref-detach; else srp-ublk del --all; fi
