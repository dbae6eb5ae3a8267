#!/bin/sh
# The job of the target guest of a pair (lab.sh pair): hand the target's environment (SRP_TARGET,
# the service GUID) to the host, which gives it to the initiator guest, then serve until the host
# says stop (a file in the share, once the initiator guest is done).
cp /tmp/lab-env "$LAB_OUT/target-env" || exit 1
echo "target guest: serving $(. /tmp/lab-env; echo "$SRP_TARGET") until the host says stop"
while [ ! -e /lab/stop ]; do sleep 1; done
echo "target guest: stopping"
