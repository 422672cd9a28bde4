#!/usr/bin/env bash
# CPU kernel benchmarks (GEMM, attention and the memory-bound kernels, Google Benchmark): builds them, runs them on an
# otherwise idle machine, and writes benchmarks/results/<date>-cpu-<name>.json (Google Benchmark's
# JSON, with the host's CPU and the commit in its context) plus a short .md summary.
#   bash benchmarks/run_cpu_kernels.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
make -s build BUILD="$build" >/dev/null
cmake --build "$build" --target gemm_bench attention_bench fused_kernels_bench >/dev/null
date=$(date -u +%Y-%m-%d)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
threads=${OMP_NUM_THREADS:-$(nproc)}
mkdir -p benchmarks/results
for name in gemm_bench attention_bench fused_kernels_bench; do
  out="benchmarks/results/${date}-cpu-${name}"
  OMP_NUM_THREADS=$threads "$build/bin/$name" --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true --benchmark_out="$out.json" \
    --benchmark_out_format=json --benchmark_context=commit="$commit" \
    --benchmark_context=omp_threads="$threads" | tee "$out.txt"
  {
    echo "# $name on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads OpenMP threads"
    echo
    echo "Commit $commit, $date. Command: \`bash benchmarks/run_cpu_kernels.sh\`. Medians of 5 repetitions;"
    echo "full data in \`$(basename "$out").json\`."
    echo
    echo '```'
    grep -E '_median' "$out.txt" || true
    echo '```'
  } > "$out.md"
  rm -f "$out.txt"
done
