#!/usr/bin/env bash
# Everything a GPU session needs measured, in ONE device call of under 10 minutes: run on the lent
# GPU machine from the repository root, with the bundle of scripts/gpu_bundle.sh carried.
#   1. device and build facts (nvidia-smi, nvcc, megatron_info)          ~10 s
#   2. every unit test binary on the CUDA platform (scripts/gpu_run_tests.sh)  ~1 min
#   3. the end-to-end benchmark (benchmarks/run_gpu_e2e.sh: correctness gate, pretrain_gpt --bf16
#      on gpt2-124m and llama-1b, PyTorch eager and torch.compile on the same models, one table)
#                                                                         ~4-5 min
#   4. the kernel benchmarks (attention_bench, gemm_bench with its cuBLAS baseline,
#      fused_kernels_bench) with MG_BENCH_PLATFORM=cuda and short minimum times, and their tables
#      (benchmarks/kernel_report.py)                                      ~1-2 min
#   5. cuDNN fused attention (scripts/gpu_run_cudnn.sh: its tests, the attention sweep cuDNN vs
#      ours vs PyTorch SDPA, gpt2-124m tokens/s with --attention-backend fused vs local)  ~3-4 min
# Each part runs under its own time limit and the later parts are skipped when the whole budget
# (SESSION_BUDGET, default 570 s) is nearly spent, so a slow part costs its own results only.
# Everything goes under ${OUT:-/tmp/gpu_out}: session.tar.gz (every log, JSON and table) and
# summary.md (the tables, the test summary, what was skipped); the device tool brings back at most
# 8 files, hence the tarball.
#
# Here, before the call (a machine with this repository's build dependencies, no GPU needed):
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMG_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
#   cmake --build build-gpu -j"$(nproc)" && cmake --build build-gpu --target benchmarks
#   bash scripts/gpu_bundle.sh build-gpu   # -> .gpu_bundle/bundle.tar.xz (~36 MiB with ICU data;
#                                          # the call carries 64 MiB, the tree is ~8)
# The device call: command "bash scripts/gpu_session.sh", carry [".gpu_bundle"], timeout_s 600.
# Afterwards: unpack session.tar.gz and commit e2e/<date>-<gpu>-e2e.{md,json} and kernels.md as
# benchmarks/results/<date>-<gpu>-{e2e,kernels}.* (see benchmarks/README.md).
# Env: SESSION_BUDGET (s), E2E_LIMIT (s, default 330), KERNEL_MIN_TIME (s, default 0.05),
# SKIP (a comma list of tests,e2e,kernels,cudnn), and run_gpu_e2e.sh's WARMUP, STEPS, MB_GPT2, MB_LLAMA.
# To exercise this script without a GPU (a test of the script, not results):
#   SKIP=tests BIN_DIR=build/bin KERNEL_PLATFORM=cpu KERNEL_FILTER=S:128 \
#     E2E_ARGS="--cpu-tiny --build build" bash scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
stage=$(mktemp -d)
budget=${SESSION_BUDGET:-570}
skip=",${SKIP:-},"
begin=$SECONDS
status=0
summary=$stage/summary.md
left() { echo $((budget - (SECONDS - begin))); }
note() { echo "$*" | tee -a "$summary"; }
# part name limit command...: runs when at least 30 s are left, under min(limit, what is left).
part() {
  local name=$1 limit=$2
  shift 2
  if [[ $skip == *",$name,"* ]]; then note "- $name: skipped (SKIP)"; return; fi
  local l
  l=$(left)
  if [ "$l" -lt 30 ]; then note "- $name: skipped, ${l}s of the session budget left"; status=1; return; fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$stage/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || status=1
  note "- $name: rc=$rc in $((SECONDS - t0)) s (limit ${limit}s)$([ $rc -eq 124 ] && echo ', TIMED OUT')"
}

bindir=${BIN_DIR:-.gpu_bundle/bin}
if [ -e .gpu_bundle/paths ] || [ -e .gpu_bundle/bundle.tar.xz ]; then
  source scripts/gpu_env.sh
elif [ -z "${BIN_DIR:-}" ]; then
  echo "gpu_session: no .gpu_bundle (run scripts/gpu_bundle.sh here and carry .gpu_bundle)" >&2
  exit 2
fi
note "# GPU session $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(cat .gpu_bundle/commit 2>/dev/null || echo unknown)"
note ""
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version 2>/dev/null | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
  "$bindir/megatron_info" --all-platforms 2>&1 | head -40
} > "$stage/device.txt" 2>&1
head -3 "$stage/device.txt" | sed 's/^/    /' | tee -a "$summary"

# 2. unit tests (each binary 90 s at most)
part tests 120 env OUT="$stage/tests" MG_TEST_TIMEOUT=90 bash scripts/gpu_run_tests.sh
[ -f "$stage/tests/summary.txt" ] &&
  note "  tests: $(grep -c 'rc=0' "$stage/tests/summary.txt") binaries passed, $(grep -vc 'rc=0' "$stage/tests/summary.txt") failed: $(grep -v 'rc=0' "$stage/tests/summary.txt" | cut -d' ' -f1-2 | tr '\n' ' ')"

# 3. end-to-end
# shellcheck disable=SC2086
part e2e "${E2E_LIMIT:-330}" env RESULTS_DIR="$stage/e2e" bash benchmarks/run_gpu_e2e.sh ${E2E_ARGS:-}

# 4. kernel benchmarks: one repetition of at least KERNEL_MIN_TIME s each (Debian's Google
# Benchmark 1.7 takes a plain number of seconds)
kernels() {
  local rc=0 names=()
  for b in attention_bench gemm_bench fused_kernels_bench; do
    [ -x "$bindir/$b" ] || { echo "no $b in $bindir"; rc=1; continue; }
    MG_BENCH_PLATFORM=${KERNEL_PLATFORM:-cuda} timeout 150 "$bindir/$b" \
      --benchmark_min_time="${KERNEL_MIN_TIME:-0.05}" --benchmark_filter="${KERNEL_FILTER:-.}" \
      --benchmark_out="$stage/kernels/cuda-$b.json" --benchmark_out_format=json \
      > "$stage/kernels/cuda-$b.txt" 2>&1 || rc=1
    [ -s "$stage/kernels/cuda-$b.json" ] && names+=("$stage/kernels/cuda-$b.json")
  done
  [ ${#names[@]} -gt 0 ] && python3 benchmarks/kernel_report.py "$stage/kernels.md" "${names[@]}" >/dev/null
  return $rc
}
mkdir -p "$stage/kernels"
export stage bindir KERNEL_MIN_TIME KERNEL_PLATFORM KERNEL_FILTER
export -f kernels
part kernels 240 bash -c kernels

# 5. cuDNN fused attention
part cudnn "${CUDNN_LIMIT:-300}" env RESULTS_DIR="$stage/cudnn" BIN_DIR="$bindir" bash scripts/gpu_run_cudnn.sh

# Summary: the e2e table and the kernel tables, then the tarball.
{
  echo
  for f in "$stage"/e2e/*-e2e.md; do [ -f "$f" ] && cat "$f"; done
  echo
  [ -f "$stage/kernels.md" ] && cat "$stage/kernels.md"
  [ -f "$stage/cudnn/cudnn.md" ] && cat "$stage/cudnn/cudnn.md"
} >> "$summary"
note ""
note "session: $((SECONDS - begin)) s, status $status"
tar -C "$stage" -czf "$out/session.tar.gz" .
cp "$summary" "$out/summary.md"
# The reply carries the last 12,000 characters of the output: the e2e table and the summary lines.
grep -E '^(- |  tests:|# GPU)' "$summary"
for f in "$stage"/e2e/*-e2e.md; do [ -f "$f" ] && cat "$f"; done
[ -f "$stage/cudnn/cudnn.md" ] && cat "$stage/cudnn/cudnn.md" && grep -E '^(\[  (PASSED|FAILED|SKIPPED) |rc=|== )' "$stage/cudnn/tests.txt"
rm -rf "$stage"
exit $status
