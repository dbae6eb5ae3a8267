#!/bin/sh
# The job of the target guest of a pair (lab.sh pair): hand the target's environment (SRP_TARGET,
# the service GUID) to the host, which gives it to the initiator guest, then serve until the host
# says stop (a file in the share, once the initiator guest is done), copying its /proc/stat's CPU
# line to the share both guests mount (/lab-pair) as it goes.
cp /tmp/lab-env "$LAB_OUT/target-env" || exit 1
echo "target guest: serving $(. /tmp/lab-env; echo "$SRP_TARGET") until the host says stop"
# and its CPU line on the share both guests mount, for the initiator guest's bench (counters.sh)
while [ ! -e /lab/stop ]; do
    grep '^cpu ' /proc/stat > /lab-pair/stat.new && mv /lab-pair/stat.new /lab-pair/stat
    sleep 0.2
done
echo "target guest: stopping"
