# `srp-ublk stats` (issue 23) against fio's own figures: fio reads and writes at a fixed rate (so
# the emulation's noise cannot move the answer), stats measures the middle of the run; each rate
# must be within 10% of fio's. The latency percentiles are ordered and the Prometheus file is
# written.
. /usr/lib/srp-lab/suite/lib.sh
ublk_cleanup
trap 'show_logs; ublk_cleanup' EXIT
dev=$(ublk_add --queues 2) || fail "srp-ublk add: $dev"
id=${dev#/dev/ublkb}
fio --name=rate --filename="$dev" --ioengine=io_uring --direct=1 --rw=randrw --rwmixread=67 --bs=4k \
    --iodepth=4 --size=64m --rate_iops=120,60 --time_based --runtime=24 --output-format=json \
    --output=/tmp/fio-rate.json &
fp=$!
sleep 6
srp-ublk stats -n "$id" --interval 12 --json > /tmp/stats.json || fail "srp-ublk stats"
srp-ublk stats -n "$id" --interval 2 | tee /tmp/stats.txt
wait $fp || fail "fio"
cp /tmp/stats.json /tmp/fio-rate.json "$LAB_OUT/"
num() { grep -o "\"$1\": *[0-9.e+-]*" "$2" | head -1 | sed 's/.*: *//'; }
fr=$(grep -A40 '"read"' /tmp/fio-rate.json | grep -m1 '"iops"' | sed 's/.*: *\([0-9.]*\).*/\1/')
fw=$(grep -A40 '"write"' /tmp/fio-rate.json | grep -m1 '"iops"' | sed 's/.*: *\([0-9.]*\).*/\1/')
sr=$(num read_iops /tmp/stats.json); sw=$(num write_iops /tmp/stats.json)
smb=$(num read_mb_s /tmp/stats.json)
echo "fio: read $fr IOPS, write $fw IOPS; srp-ublk stats: read $sr IOPS ($smb MB/s), write $sw IOPS"
within() { awk -v a="$1" -v b="$2" 'BEGIN{ d = a - b; if (d < 0) d = -d; exit !(b > 0 && d / b <= 0.10) }'; }
within "$sr" "$fr" || fail "stats read IOPS $sr is not within 10% of fio's $fr"
within "$sw" "$fw" || fail "stats write IOPS $sw is not within 10% of fio's $fw"
within "$smb" "$(awk -v r="$fr" 'BEGIN{print r * 4096 / 1e6}')" || fail "stats read MB/s $smb is not fio's IOPS x 4 KiB"
ok "stats rates within 10% of fio's"
lat=$(tr -d ' \n' < /tmp/stats.json | grep -o '"latency_us":\[[0-9,]*\]' | head -1 | grep -o '[0-9,]*\]' | tr -d ']')
echo "latency p50,p90,p99,p99.9 (us): $lat"
echo "$lat" | awk -F, '{exit !($1 > 0 && $1 <= $2 && $2 <= $3 && $3 <= $4)}' || fail "latency percentiles out of order: $lat"
srp-ublk stats --prometheus /tmp/srp-ublk.prom || fail "stats --prometheus"
grep -q "^srp_ublk_read_ops_total{device=\"ublkb$id\",lun=\"0\",queue=\"0\"} [1-9]" /tmp/srp-ublk.prom ||
    fail "no read counter in the Prometheus file: $(head -20 /tmp/srp-ublk.prom)"
grep -q '^srp_ublk_queue_running{.*} 1$' /tmp/srp-ublk.prom || fail "no running queue in the Prometheus file"
ok "Prometheus file written ($(wc -l < /tmp/srp-ublk.prom) lines)"
trap - EXIT
ublk_cleanup
