#!/bin/sh
# cp OLD-SRP-UBLK target/bench/baseline/srp-ublk   (a binary from before the daemon called setsid)
# LAB_QEMU_EXTRA="-virtfs local,path=$PWD/target/bench/baseline,mount_tag=baseline,security_model=none,id=baseline" \
#   just lab-run tests/lab/examples/own-session.sh   (rublk there too, as `just bench counters` leaves it)
# Whether the daemon's session (and so its scheduler autogroup) changes what a wake-up finds: the old
# binary's daemon in the shell's session (as fio), the same binary under setsid, this binary (which
# calls setsid itself) and rublk (daemonized); null backends and the SRP LUN, 4 KiB QD32, 3 rounds.
set -u
mkdir -p /mnt/baseline
mount -t 9p -o trans=virtio,version=9p2000.L baseline /mnt/baseline || exit 1
B=/mnt/baseline/srp-ublk R=/mnt/baseline/rublk
new_dev() { before=$(ls /dev/ublkb* 2>/dev/null); "$@" >/dev/null 2>&1 || return 1
    for x in $(ls /dev/ublkb*); do echo "$before" | grep -qx "$x" || echo "$x"; done; }
pid_of() { grep -o '"pid": *[0-9]*' "/run/srp-ublk/${1#/dev/}.json" | grep -o '[0-9]*$'; }
old=$($B add --backend null:1G --queues 2 --depth 64) || exit 1
olds=$(setsid $B add --backend null:1G --queues 2 --depth 64) || exit 1
new=$(srp-ublk add --backend null:1G --queues 2 --depth 64) || exit 1
r=$(new_dev $R add null -q 2 -d 64) || exit 1
t=$($B add --target "$SRP_TARGET" --queues 2 --depth 64) || exit 1
ts=$(setsid $B add --target "$SRP_TARGET" --queues 2 --depth 64) || exit 1
rp=$($R list -n "${r#/dev/ublkb}" | grep -o "daemon pid [0-9]*" | grep -o "[0-9]*$")
for rw in randwrite randread; do
  for round in 1 2 3; do
    for e in "null_old:$old:$(pid_of $old)" "null_old_setsid:$olds:$(pid_of $olds)" "null_new:$new:$(pid_of $new)" \
             "rublk:$r:$rp" "srp_old:$t:$(pid_of $t)" "srp_old_setsid:$ts:$(pid_of $ts)"; do
      n=${e%%:*}; rest=${e#*:}; d=${rest%%:*}; p=${rest#*:}
      perf stat -x, -e raw_syscalls:sys_enter,context-switches,task-clock -p "$p" -o /tmp/$n.stat &
      pp=$!; sleep 0.3
      out=$(fio --name=x --filename="$d" --ioengine=libaio --direct=1 --rw=$rw --bs=4k --iodepth=32 \
          --runtime=5 --time_based --size=192m --eta=never --output-format=terse --terse-version=3)
      kill -INT $pp; wait $pp
      iops=$(echo "$out" | awk -F';' -v rw=$rw '{print (rw == "randread") ? $8 : $49}')
      st=$(grep -v '^#' /tmp/$n.stat | grep -v '^$' | awk -F, '{printf "%s=%s ", $3, $1}')
      echo "own-session: $rw round $round $n (session $(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f4), pid $p) iops=$iops $st"
    done
  done
done
$B del --all; $R del -a
