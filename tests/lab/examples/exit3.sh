#!/bin/sh
echo "exiting 3 on purpose"
exit 3
