#!/bin/sh
# RoCE packets per I/O on rxe0 for srp-ublk and ib_srp, 4 KiB random writes and reads at QD32 for 5 s
# each (rxe's port counters: sent_pkts, rcvd_pkts, ...): whether the two initiators put the same
# traffic on the wire. Run it in the initiator guest of a pair:
#   just lab-pair tests/lab/examples/pair-packets.sh
echo "ib_srp use_imm_data=$(cat /sys/module/ib_srp/parameters/use_imm_data) max_imm_data=$(cat /sys/module/ib_srp/parameters/max_imm_data)"
d=$(srp-ublk add --target "$SRP_TARGET" --queues 2 --depth 64) || exit 1
sd=$(lab-ref-attach "ch_count=2,queue_size=65") || exit 1
# st: rxe0's port counters, one NAME=VALUE a line
st() { rdma statistic show link rxe0/1 | tr ' ' '\n' | awk 'prev ~ /^[a-z_]+$/ && $1 ~ /^[0-9]+$/ {print prev"="$1} {prev=$1}'; }
for rw in randwrite randread; do
    for dev in $d $sd; do
        st > /tmp/s0
        fio --name=p --filename=$dev --ioengine=libaio --direct=1 --rw=$rw --bs=4k --iodepth=32 --runtime=5 \
            --time_based --size=192m --output-format=json --output=/tmp/p.json >/dev/null || exit 1
        st > /tmp/s1
        ios=$(grep -o '"total_ios" : [0-9]*' /tmp/p.json | awk -F': ' '{s += $2} END {print s}')
        echo "$rw $dev, $ios I/Os, per I/O: $(paste -d' ' /tmp/s0 /tmp/s1 | awk -v n="$ios" '{split($1, a, "="); split($2, b, "=");
            if (b[2] > a[2]) printf "%s=%.2f ", a[1], (b[2] - a[2]) / n}')"
    done
done
grep -h 'logged in' /run/srp-ublk/logs/*.log | head -1
srp-ublk del --all; lab-ref-detach
