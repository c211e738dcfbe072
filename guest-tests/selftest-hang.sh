#!/bin/sh
# Deliberately hanging guest test: shows that run-vm.sh's --timeout kills a
# stuck guest.  Expected result: run-vm.sh exits 124 after the timeout.
echo "selftest-hang: sleeping forever on purpose"
while :; do sleep 3600; done
