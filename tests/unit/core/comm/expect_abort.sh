#!/bin/sh
# expect_abort.sh SECONDS REGEX CMD...: runs CMD (an mpirun job) with a time limit and passes when it
# ends by itself within SECONDS, with a non-zero status, and its output matches REGEX (grep -E).
limit=$1 regex=$2
shift 2
out=$(timeout "$limit" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 124 ]; then echo "expect_abort: FAIL: still running after ${limit}s (a hang)"; exit 1; fi
if [ "$rc" -eq 0 ]; then echo "expect_abort: FAIL: exited 0, expected a failure"; exit 1; fi
if ! printf '%s\n' "$out" | grep -Eq "$regex"; then
  echo "expect_abort: FAIL: output does not match: $regex"
  exit 1
fi
echo "expect_abort: ok (exit $rc, message found)"
