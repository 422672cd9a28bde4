#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: the CUDA cases of the op tests under
# compute-sanitizer: memcheck (out-of-bounds and misaligned accesses, invalid frees, CUDA API
# errors) on every op test binary, racecheck (shared-memory hazards) and synccheck (barrier misuse)
# on those whose kernels use shared memory and __syncthreads (block reductions, attention tiles).
# One log per (tool, binary) in ${OUT:-/tmp/gpu_out}/sanitizer.tar.gz and a summary in
# sanitizer.txt there. Each run gets ${MG_SANITIZE_TIMEOUT:-150} s, and no run starts once
# ${MG_SANITIZE_BUDGET:-300} s have passed (those are listed as skipped).
# The default filter leaves out CudaPlatform.AllocatorReusesFreedBlocksAndSurvivesOutOfMemory,
# whose deliberate over-sized cudaMalloc memcheck reports as API errors (4, seen on an H100).
#   bash scripts/gpu_sanitize.sh [gtest filter, default *uda*-*SurvivesOutOfMemory*]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
source scripts/gpu_env.sh
filter=${1:-*uda*-*SurvivesOutOfMemory*}
logs=$(mktemp -d)
: > "$out/sanitizer.txt"
status=0
begin=$SECONDS
run() {  # tool binary
  if (( SECONDS - begin > ${MG_SANITIZE_BUDGET:-300} )); then
    echo "$1 $2 skipped (time budget)" | tee -a "$out/sanitizer.txt"
    status=1
    return
  fi
  timeout "${MG_SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$1" --error-exitcode 99 \
    --print-limit 20 ".gpu_bundle/bin/$2" --gtest_brief=1 --gtest_filter="$filter" \
    > "$logs/$1-$2.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || status=1
  echo "$1 $2 rc=$rc $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$logs/$1-$2.log" | tr '\n' ' ')" |
    tee -a "$out/sanitizer.txt"
}
for t in cuda_ops_test cuda_platform_test gemm_test norm_test softmax_test cross_entropy_test \
  activation_test embedding_test rope_test dropout_test init_test optimizer_test grad_norm_test \
  attention_test; do
  run memcheck "$t"
done
for t in cuda_ops_test norm_test softmax_test cross_entropy_test grad_norm_test attention_test; do
  run racecheck "$t"
  run synccheck "$t"
done
tar -C "$logs" -czf "$out/sanitizer.tar.gz" .
rm -rf "$logs"
exit $status
