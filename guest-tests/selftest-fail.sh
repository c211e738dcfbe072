#!/bin/sh
# Deliberately failing guest test: shows that the fixture passes a guest
# command's failure on to the host.  Expected result: exit status 3.
echo "selftest-fail: this test fails on purpose (exit status 3)"
exit 3
