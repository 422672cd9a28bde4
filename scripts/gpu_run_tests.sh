#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: every unit test binary of .gpu_bundle/
# (scripts/gpu_bundle.sh; the tarball is unpacked here first) with the CUDA platform available.
# Writes summary.txt, device.txt and megatron_info.txt under ${OUT:-/tmp/gpu_out}, and the full log
# of every binary into logs.tar.gz there (the device tool brings back at most 8 files).
# The tests were compiled with this checkout's and build's absolute paths (plugins, fixtures,
# megatron_info); scripts/gpu_env.sh links them to this copy and sets the library paths. Each
# binary gets ${MG_TEST_TIMEOUT:-240} s. Exit status: 0 only if every binary passed.
#   bash scripts/gpu_run_tests.sh [gtest filter]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
source scripts/gpu_env.sh
logs=$(mktemp -d)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvidia-smi | head -4 | tail -1
  command -v nvcc >/dev/null && nvcc --version | tail -2
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd .gpu_bundle/lib/libmegatron_cuda.so | grep -E 'cud|cublas|not found'
} > "$out/device.txt" 2>&1
cat "$out/device.txt"
.gpu_bundle/bin/megatron_info --all-platforms > "$out/megatron_info.txt" 2>&1
summary="$out/summary.txt"
: > "$summary"
status=0
for t in .gpu_bundle/bin/*_test; do
  name=$(basename "$t")
  start=$(date +%s.%N)
  timeout "${MG_TEST_TIMEOUT:-240}" "$t" --gtest_brief=1 ${1:+--gtest_filter="$1"} > "$logs/$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  echo "$name rc=$rc ${secs}s $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | tr '\n' ' ')" | tee -a "$summary"
done
tar -C "$logs" -czf "$out/logs.tar.gz" .
rm -rf "$logs"
exit $status
