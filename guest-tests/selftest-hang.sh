#!/bin/sh
# Deliberately hanging guest test: shows that the fixture's timeout kills a
# stuck guest (run-vm.sh then exits 124).
echo "selftest-hang: sleeping forever on purpose"
while :; do sleep 3600; done
