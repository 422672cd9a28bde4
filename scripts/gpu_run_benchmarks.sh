#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: the kernel benchmarks of .gpu_bundle/
# (gemm_bench, attention_bench, fused_kernels_bench; scripts/gpu_bundle.sh of a build with the `benchmarks` target
# built) on the CUDA platform (MG_BENCH_PLATFORM=cuda: device-event timing, GPU shapes), writing
# Google Benchmark's JSON and console output to ${OUT:-/tmp/gpu_out}/cuda-<name>.{json,txt}.
# Default flags: medians of 3 repetitions of at least 0.2 s each (Debian's Google Benchmark 1.7
# takes --benchmark_min_time in seconds without a unit); arguments replace them.
#   bash scripts/gpu_run_benchmarks.sh [Google Benchmark flags]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
source scripts/gpu_env.sh
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--benchmark_min_time=0.2 --benchmark_repetitions=3
  --benchmark_report_aggregates_only=true)
status=0
for name in gemm_bench attention_bench fused_kernels_bench; do
  [ -x ".gpu_bundle/bin/$name" ] || { echo "gpu_run_benchmarks: no $name in the bundle" >&2; status=1; continue; }
  MG_BENCH_PLATFORM=cuda ".gpu_bundle/bin/$name" --benchmark_out="$out/cuda-$name.json" \
    --benchmark_out_format=json "${flags[@]}" 2>&1 | tee "$out/cuda-$name.txt" || status=1
done
exit $status
