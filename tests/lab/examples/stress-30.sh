#!/bin/sh
# just lab-run tests/lab/examples/stress-30.sh: suite test 30 (rxe link flaps under fio verify), or
# the suite tests LAB_ONLY names (e.g. LAB_ONLY=31-reconnect-target-drop), run 4 times in one boot under
# the suite's watchdog (300 s a test, state dump on a hang), stopping at the first failure. A hunt for
# rare faults that one suite run may not meet.
export LAB_ONLY=${LAB_ONLY:-30-reconnect-link-flap} SUITE_TEST_LIMIT=300
i=1
while [ $i -le 4 ]; do
    echo "stress: round $i of 4: $LAB_ONLY"
    sh /usr/lib/srp-lab/suite/run.sh || { echo "stress: round $i FAILED"; exit 1; }
    i=$((i + 1))
done
echo "stress: 4 rounds passed"
