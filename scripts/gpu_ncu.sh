#!/usr/bin/env bash
# Nsight Compute on the lent GPU machine (device README: ncu reads hardware counters on the
# Firecracker runtime; give it --clock-control none): per-kernel duration, speed of light,
# occupancy, launch statistics and warp stall reasons of the kernels of one benchmark binary.
# Run from the repository root with the bundle of scripts/gpu_bundle.sh carried:
#   NCU_RUNS="binary|benchmark filter|kernel regex|launch count;..." bash scripts/gpu_ncu.sh
# e.g. NCU_RUNS="fused_kernels_bench|BM_layernorm/N:16384/H:768/bf16:1/bwd:1|norm_bwd|6".
# Each run goes to ${OUT:-/tmp/gpu_out}/ncu-<n>.txt, limited to NCU_LIMIT seconds (default 60).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
source scripts/gpu_env.sh
command -v ncu > /dev/null || { echo "gpu_ncu: no ncu on this machine" >&2; exit 2; }
IFS=';' read -ra runs <<< "${NCU_RUNS:?NCU_RUNS: binary|filter|kernel regex|count;...}"
n=0
for r in "${runs[@]}"; do
  IFS='|' read -r bin filter kregex count <<< "$r"
  n=$((n + 1))
  f="$out/ncu-$n.txt"
  echo "# $bin --benchmark_filter='$filter', kernels matching '$kregex', $count launches" > "$f"
  MG_BENCH_PLATFORM=cuda timeout "${NCU_LIMIT:-60}" ncu --clock-control none \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis -k "regex:$kregex" --launch-count "$count" \
    ".gpu_bundle/bin/$bin" --benchmark_filter="$filter" --benchmark_min_time=0.001 >> "$f" 2>&1
  echo "ncu run $n ($bin, $kregex): rc=$? $(grep -c 'Duration' "$f") kernels"
  grep -E 'Context [0-9]|Duration|Achieved Occupancy|Registers Per Thread|DRAM Throughput|Block Size|Grid Size|==ERROR==|==WARNING==' "$f" | head -80
done
