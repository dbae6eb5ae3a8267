#!/bin/sh
# just lab-run tests/lab/examples/syscalls-by-kind.sh: which system calls srp-ublk's daemon makes per
# I/O, by kind. srp-ublk as `just bench` attaches it (2 queues x 64, default poll mode, or POLL=MODE);
# for 4 KiB randread and randwrite at QD1 and QD32 (one job), perf counts the daemon's entries into
# each system call over 8 s of fio. Per case, $LAB_OUT/syscalls-CASE.txt holds perf's counts and the
# I/Os; the summary (calls per I/O, by kind) is printed and left in $LAB_OUT/syscalls.txt.
dev=$(srp-ublk add --target "$SRP_TARGET" --queues 2 --depth 64 ${POLL:+--poll $POLL}) || exit 1
pid=$(grep -o '"pid": *[0-9]*' "/run/srp-ublk/${dev#/dev/}.json" | grep -o '[0-9]*$')
kinds="io_uring_enter write read sched_yield futex epoll_wait ioctl poll ppoll clock_nanosleep nanosleep"
evs="-e raw_syscalls:sys_enter"
for k in $kinds; do evs="$evs -e syscalls:sys_enter_$k"; done
: > "$LAB_OUT/syscalls.txt"
for c in randread:1 randwrite:1 randread:32 randwrite:32; do
    rw=${c%:*} qd=${c#*:}
    job() { fio --name=p --filename="$dev" --ioengine=libaio --direct=1 --rw=$rw --bs=4k --iodepth=$qd \
        --runtime="$1" --time_based --size=200m --eta=never --output-format=terse --terse-version=3; }
    job 2 >/dev/null
    out=$LAB_OUT/syscalls-$rw-qd$qd.txt
    perf stat $evs -p "$pid" -o "$out" -- sleep 8 >/dev/null 2>&1 & pp=$!
    sleep 0.2
    ios=$(job 9 | awk -F';' '{print ($8 + $49) * 8}')
    wait $pp
    echo "ios $ios" >> "$out"
    awk -v c="$rw-qd$qd" -v ios="$ios" '
        /ios /{next}
        /sys_enter/{gsub(",", "", $1); n=$1; e=$2; sub(".*sys_enter_?", "", e); if (e == "") e = "all";
                     printf "%s %s %.2f\n", c, e, n / ios}' "$out" | tee -a "$LAB_OUT/syscalls.txt"
done
srp-ublk del --all
