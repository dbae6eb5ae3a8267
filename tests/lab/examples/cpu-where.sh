#!/bin/sh
# just lab-run tests/lab/examples/cpu-where.sh: where the guest's CPU goes during 4 KiB randread at QD1
# and QD32, srp-ublk against ib_srp: per-task CPU time (utime+stime from /proc/*/task/*/stat) over each
# run, the top consumers by name, and softirq/irq time from /proc/stat.
snap() { for t in /proc/[0-9]*/task/[0-9]*; do
    [ -r $t/stat ] && awk -v t="$t" '{sub(/^[0-9]+ \(/, ""); n=$0; sub(/\).*/, "", n); sub(/^[^)]*\) /, ""); print t, n, $12 + $13}' $t/stat 2>/dev/null
done; awk '/^cpu /{print "cpu", "softirq+irq", $7+$8; print "cpu", "idle", $5+$6}' /proc/stat; }
measure() {   # measure NAME DEV QD
    snap > /tmp/a
    fio --name=$1 --filename=$2 --ioengine=libaio --direct=1 --rw=randread --bs=4k --iodepth=$3 --runtime=8 \
        --time_based --size=200m --eta=never --output-format=terse --terse-version=3 > /tmp/f
    snap > /tmp/b
    ios=$(awk -F';' '{print $6 / 4}' /tmp/f)
    echo "== $1 QD$3: $(awk -F';' '{print $8}' /tmp/f) IOPS, $ios I/Os; CPU us per I/O by task (top 12):"
    awk -v ios="$ios" 'NR==FNR{a[$1" "$2]=$3; next} {k=$1" "$2; d=$3-a[k]; n=$2; sub(/[0-9:\/]+$/, "", n); s[n]+=d} END{for (n in s) if (s[n]>0) printf "%8.0f %s\n", s[n]*10000/ios, n}' /tmp/a /tmp/b | sort -rn | head -12
}
sd=$(lab-ref-attach ch_count=1,queue_size=65) || exit 1
dev=$(srp-ublk add --target "$SRP_TARGET" --queues 1 --poll interrupt) || exit 1
for qd in 1 32; do
    measure ib_srp $sd $qd
    measure srp-ublk-interrupt $dev $qd
done
srp-ublk del --all; lab-ref-detach
