#!/usr/bin/env bash
# Runs one examples/ script at its toy size (TOY=1) as `make test` does, with the launcher given,
# then checks the layout the run reported (expect_layout: its start-up lines) and that it trained
# (lm loss lines, all finite).
# usage: run_example.sh <bin dir> <examples/script> <np> "<layout flags>" <mpiexec...> -- [args]
set -euo pipefail
bin=$1 script=$2 np=$3 layout=$4
shift 4
launcher=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
[ $# -gt 0 ] && shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
TOY=1 MG_BIN=$bin WORK=$work/run LAUNCHER="${launcher[*]} -np" bash "$script" "$@" \
  > "$work/log" 2>&1 || { cat "$work/log"; echo "FAIL $script exited non-zero"; exit 1; }
. "$(dirname "$0")/compare_logs.sh"  # expect_layout
# shellcheck disable=SC2086
expect_layout "$work/log" "$np" $layout
n=$(grep -c 'lm loss: ' "$work/log" || true)
[ "$n" -ge 2 ] || { cat "$work/log"; echo "FAIL $script: $n lm loss lines"; exit 1; }
if grep -o 'lm loss: [^ ]*' "$work/log" | grep -qiE 'nan|inf'; then
  cat "$work/log"; echo "FAIL $script: a non-finite loss"; exit 1
fi
echo "ok $script: $n lm loss lines"
