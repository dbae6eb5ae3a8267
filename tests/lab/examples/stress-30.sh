#!/bin/sh
# just lab-run tests/lab/examples/stress-30.sh: suite test 30 (rxe link flaps under fio verify), or
# the suite test LAB_ONLY names (e.g. LAB_ONLY=32-rdma-device-removal), run 4 times in one boot,
# stopping at the first failure and printing its log. A hunt for rare faults that one suite run may
# not meet.
rounds=4
t=${LAB_ONLY:-30-reconnect-link-flap}
i=1
while [ $i -le "$rounds" ]; do
    echo "stress: round $i of $rounds: $t"
    if ! sh /usr/lib/srp-lab/suite/$t.sh > /tmp/stress.log 2>&1; then
        cat /tmp/stress.log; echo "stress: round $i FAILED"; exit 1
    fi
    grep 'ok: \|flap 5\|drop 2\|removal 2' /tmp/stress.log
    i=$((i + 1))
done
echo "stress: $rounds rounds passed"
