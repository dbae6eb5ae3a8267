#!/bin/sh
# LAB_KERNEL=new LAB_NEW_KSERIES=7.3 LAB_SETUP=minimal just lab-run tests/lab/examples/batch-null.sh
# What ublk's batch I/O commands (UBLK_F_BATCH_IO) save in the front end: srp-ublk's null backend
# with one ublk command each way per I/O (FETCH, COMMIT_AND_FETCH) against the same backend on the
# batch commands (`add --ublk-batch`: a multishot fetch of many tags, one commit of many results),
# 4 KiB random reads and writes at QD32 and QD1 (BATCH_CASES) from BATCH_JOBS fio jobs over
# BATCH_QUEUES queues x BATCH_DEPTH (1 x 64), in rounds that rotate which goes first. Per run: IOPS,
# the whole guest's CPU per I/O, the daemon's CPU per I/O.
# First a data check: mem: on the batch commands, fio writes and verifies.
set -u
srp-ublk features | grep '^ublk:'
srp-ublk features | grep -q 'batch I/O commands: yes' ||
    { echo "batch-null: SKIPPED: this kernel's ublk has no batch I/O commands (LAB_NEW_KSERIES=7.3)"; exit 1; }
Q=${BATCH_QUEUES:-1} D=${BATCH_DEPTH:-64}
m=$(srp-ublk add --backend mem:256M --ublk-batch --queues "$Q" --depth "$D") || exit 1
fio --name=v --filename="$m" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=32 --size=64m \
    --verify=crc32c --do_verify=1 --eta=never --output-format=terse --terse-version=3 >/tmp/verify.txt ||
    { echo "batch-null: FAIL: fio verify on mem: with --ublk-batch"; cat /tmp/verify.txt; exit 1; }
echo "batch-null: fio verify on mem: with batch commands passed"
srp-ublk del --all
p=$(srp-ublk add --backend null:1G --queues "$Q" --depth "$D") || exit 1
b=$(srp-ublk add --backend null:1G --ublk-batch --queues "$Q" --depth "$D") || exit 1
pid_of() { grep -o '"pid": *[0-9]*' "/run/srp-ublk/${1#/dev/}.json" | grep -o '[0-9]*$'; }
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
dcpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
hz=100   # USER_HZ: /proc/stat and /proc/PID/stat count in 1/100 s on Linux
run() {   # run NAME DEV RW QD ROUND
    pid=$(pid_of "$2"); c0=$(busy); d0=$(dcpu "$pid")
    # terse v3: fields 8 and 49 are the read and write IOPS
    iops=$(fio --name=x --filename="$2" --ioengine=libaio --direct=1 --rw="$3" --bs=4k --iodepth="$4" \
        --numjobs="${BATCH_JOBS:-1}" --group_reporting --runtime="${BATCH_SECS:-10}" --time_based \
        --size=512m --eta=never --output-format=terse \
        --terse-version=3 | awk -F';' '{print $8 + $49}')
    c1=$(busy); d1=$(dcpu "$pid")
    echo "$1 $3 $4 $5 $iops $c0 $c1 $d0 $d1" | awk -v hz="$hz" -v s="${BATCH_SECS:-10}" '{
        ios = $5 * s; if (ios < 1) ios = 1
        printf "batch-null: %s %s qd%s round %s iops %.0f guest_us/io %.0f daemon_us/io %.0f\n",
            $1, $2, $3, $4, $5, ($7 - $6) / hz * 1e6 / ios, ($9 - $8) / hz * 1e6 / ios }'
}
for case in ${BATCH_CASES:-randread:32 randwrite:32 randread:1 randwrite:1}; do
    rw=${case%:*}; qd=${case#*:}
    for round in $(seq "${BATCH_ROUNDS:-5}"); do
        if [ $((round % 2)) = 1 ]; then
            run per_io "$p" "$rw" "$qd" "$round"; run batch "$b" "$rw" "$qd" "$round"
        else
            run batch "$b" "$rw" "$qd" "$round"; run per_io "$p" "$rw" "$qd" "$round"
        fi
    done
done
srp-ublk del --all
