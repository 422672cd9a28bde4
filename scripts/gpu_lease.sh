#!/usr/bin/env bash
# One short device lease (15 minutes of device time, start-up included) spent on what only a GPU can
# show, in ONE call: run on the lent GPU machine from the repository root with the bundle of
# scripts/gpu_bundle.sh carried. In priority order, each part under its own limit, later parts
# skipped when the budget (LEASE_BUDGET, default 500 s) is nearly spent:
#   1. device facts and megatron_info                                                  ~5 s
#   2. the CUDA cases of every unit-test binary that has any (binaries named cuda_* whole; the
#      others with the filter *cuda*:*Cuda*:*CUDA*:*Device*:*Gpu*), four binaries at a time,
#      each under 90 s (cuda_cudnn_attention_test, cuda_fp8_attention_test 180 s)       ~60-90 s
#   3. several ranks on the one GPU (issue 17): scripts/gpu_multirank.sh with ONLY = the issue's
#      layouts (NCCL one rank, MPI staging, the in-process *Cuda comparisons, TP 2, PP 2 with
#      interleaving, CP 2 with each comm type, EP 2, DP 2 with the distributed optimizer,
#      TP2 x PP2 x DP2 on 8 ranks) and then FSDP, MoE ETP and MoE layouts in CUDA mode  ~200-250 s
#   4. measurements, pretrain_gpt --platform cuda --bf16 --mock-data, 3 warm-up + 10 timed
#      iterations each (benchmarks/run_gpu_e2e.sh's model shapes):
#        gpt2-124m micro-batch 64 (issue 16's target), again with MG_CUDA_CE_FWD=two-pass and
#        =online (the cross entropy forward's kernels, A/B), then with --profile-op-table;
#        llama-1b micro-batch 4, BF16 and FP8 hybrid (issue 22), FP8 with SwiGLU's casts
#        unfused (--no-bias-swiglu-fusion, A/B), and both at global batch 32 (8 micro-batches);
#        FP8 attention (--fp8-dot-product-attention): llama-1b with NVTE_FP8_DPA_BWD=0 (head dim
#        64: cuDNN's FP8 backward on Hopper takes 128 only) at mb 4 and global batch 32, and
#        llama-1b with 16 heads of 128 in BF16, FP8 and FP8 with FP8 attention, and with
#        --fp8-multi-head-attention (mb 4 and global batch 32);
#        MoE (8 experts, top-2, grouped GEMM) vs the dense model of equal active parameters
#        (issue 21);
#        gpt2-124m with --optimizer-cpu-offload (issue 20)                             ~120 s
# Everything goes under ${OUT:-/tmp/gpu_out}: lease.md (the summary: tests, the multi-rank table,
# the measurement table) and lease.tar.gz (every log).
#
# Here, before the call (no GPU needed):
#   cmake --build build -j2 && bash scripts/gpu_bundle.sh build    # -> .gpu_bundle/bundle.tar.xz
# The device call: command "bash scripts/gpu_lease.sh", carry [".gpu_bundle"], timeout_s 560.
# Env: LEASE_BUDGET (s), SKIP (comma list of tests,multirank,perf), TESTS_ONLY (an extended regex
# the test binaries' names must match), PERF_RUNS (replaces the measurement list: "name limit
# workload micro-batch [VAR=value...] [flags...]" separated by ';'; leading VAR=value words set
# that run's environment, e.g. MG_CUDA_CE_FWD=two-pass for an A/B pair), MULTIRANK_ONLY (overrides the
# multi-rank part list; `all`: every part of gpu_multirank.sh), MULTIRANK_BUDGET (s), PERF_ITERS
# (timed iterations, default 10), KERNELS and KERNEL_ENV (part 3b, kernel benchmarks, off unless set),
# FSDP_MEMORY=1 (part 3c, FSDP device memory with and without CUDA virtual memory, off unless set;
# FSDP_DP: its data-parallel sizes, default "1 2").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
stage=$(mktemp -d)
budget=${LEASE_BUDGET:-500}
skip=",${SKIP:-},"
begin=$SECONDS
md=$stage/lease.md
left() { echo $((budget - (SECONDS - begin))); }
note() { echo "$*" | tee -a "$md"; }
finish() {
  note ""
  note "lease script: $((SECONDS - begin)) s"
  tar -C "$stage" -czf "$out/lease.tar.gz" .
  cp "$md" "$out/lease.md"
  rm -rf "$stage"
  exit 0
}
trap finish TERM INT

[ -e .gpu_bundle/paths ] || [ -e .gpu_bundle/bundle.tar.xz ] ||
  { echo "gpu_lease: no .gpu_bundle (run scripts/gpu_bundle.sh here and carry .gpu_bundle)" >&2; exit 2; }
source scripts/gpu_env.sh
bindir=.gpu_bundle/bin
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# 1. facts
note "# GPU lease $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(cat .gpu_bundle/commit 2>/dev/null || echo unknown)"
note ""
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version 2>/dev/null | tail -1
  "$bindir/megatron_info" --platform cuda 2>&1 | head -20
} > "$stage/device.txt" 2>&1
sed 's/^/    /' "$stage/device.txt" | tee -a "$md"
note ""

# 2. the CUDA cases of the unit tests
if [[ $skip != *",tests,"* ]]; then
  mkdir -p "$stage/tests"
  t0=$SECONDS
  for t in "$bindir"/*_test; do
    n=$(basename "$t")
    case $n in
      cuda_*) echo "$n -" ;;
      *) timeout 20 "$t" --gtest_list_tests 2>/dev/null | grep -qE 'cuda|Cuda|CUDA|Device|Gpu' &&
        echo "$n *cuda*:*Cuda*:*CUDA*:*Device*:*Gpu*" ;;
    esac
  done | grep -E "^(${TESTS_ONLY:-.*}) " > "$stage/tests/list.txt"
  # one line per binary: name rc seconds and gtest's PASSED/FAILED/SKIPPED lines
  run_one() {
    local n=$1 f=$2 s=$SECONDS
    local filter=()
    [ "$f" != "-" ] && filter=(--gtest_filter="$f")
    # cuDNN's graph builds on a fresh machine: cuda_cudnn_attention_test took 84 s (session 24)
    # and over 90 s (session 25) with every case passing before
    local lim=90
    case $n in cuda_cudnn_attention_test | cuda_fp8_attention_test) lim=180 ;; esac
    timeout "$lim" "$bindir/$n" --gtest_brief=1 --gtest_color=no "${filter[@]}" > "$stage/tests/$n.log" 2>&1
    local rc=$?
    echo "$n rc=$rc $((SECONDS - s))s $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$stage/tests/$n.log" | tr '\n' ' ')"
  }
  export -f run_one
  export stage bindir
  timeout 200 xargs -P 4 -L 1 bash -c 'run_one "$0" "$1"' < "$stage/tests/list.txt" > "$stage/tests/summary.txt" 2>&1
  note "## CUDA cases of the unit tests ($(wc -l < "$stage/tests/list.txt") binaries, $((SECONDS - t0)) s)"
  note ""
  note "passed: $(grep -c ' rc=0 ' "$stage/tests/summary.txt")"
  note ""
  grep -v ' rc=0 ' "$stage/tests/summary.txt" | sed 's/^/    FAILED: /' | tee -a "$md"
  # the failing cases with their first lines of output
  for n in $(grep -v ' rc=0 ' "$stage/tests/summary.txt" | cut -d' ' -f1); do
    grep -E '^\[  FAILED  \]|Failure|error|Expected|Which is|actual' "$stage/tests/$n.log" | head -12 | sed "s/^/    $n: /" | tee -a "$md"
  done
  note ""
fi

# 3. several ranks on the GPU
if [[ $skip != *",multirank,"* ]]; then
  l=$(left)
  mb=$((l - 150))
  [ $mb -gt 260 ] && mb=260
  [ -n "${MULTIRANK_BUDGET:-}" ] && mb=$MULTIRANK_BUDGET
  if [ $mb -ge 60 ]; then
    only=${MULTIRANK_ONLY:-nccl_single,staging_np2,gpt_tp_np2,pipeline_schedules_np2,ddp_np2,context_parallel_np2,moe_ep_np2,tp_np2,pp_np2,cp_np2,moe_np2,dp_np2,pp_np8,fsdp_np2,moe_etp,moe_layouts_np2}
    note "## Several ranks on one GPU (scripts/gpu_multirank.sh, budget ${mb}s)"
    note ""
    [ "$only" = all ] && only=""  # every part of gpu_multirank.sh
    ONLY=$only SESSION_BUDGET=$mb OUT=$stage/multirank timeout $((mb + 20)) bash scripts/gpu_multirank.sh > "$stage/multirank.log" 2>&1
    grep -E '^\|' "$stage/multirank/multirank.md" 2>/dev/null | tee -a "$md"
    note ""
  else
    note "## Several ranks: not run (${l}s left)"
  fi
fi

# 3b. kernel benchmarks, only when KERNELS names them: "binary:filter;binary:filter" (the
# Google Benchmark binaries of the bundle: fused_kernels_bench, gemm_bench, attention_bench; the
# filter is --benchmark_filter's regex), each under 60 s, MG_BENCH_PLATFORM=cuda, short minimum
# times. KERNEL_ENV: extra VAR=value words for those runs (e.g. CUDNN_FRONTEND_LOG_INFO=1
# CUDNN_FRONTEND_LOG_FILE=stderr: cuDNN's engine list for the attention graphs).
if [ -n "${KERNELS:-}" ] && [[ $skip != *",kernels,"* ]]; then
  mkdir -p "$stage/kernels"
  note "## Kernel benchmarks (KERNELS=$KERNELS)"
  note ""
  IFS=';' read -ra kruns <<< "$KERNELS"
  for kr in "${kruns[@]}"; do
    kb=${kr%%:*}
    kf=${kr#*:}
    [ "$(left)" -lt 40 ] && { note "- $kb: not run, $(left)s left"; continue; }
    # shellcheck disable=SC2086
    env ${KERNEL_ENV:-} MG_BENCH_PLATFORM=cuda timeout 60 "$bindir/$kb" --benchmark_filter="$kf" \
      --benchmark_min_time=0.05 --benchmark_counters_tabular=true \
      > "$stage/kernels/$kb.txt" 2> "$stage/kernels/$kb.err"
    note "### $kb ($kf): rc=$?"
    note ""
    grep -E '(manual_time|^Benchmark|^---)' "$stage/kernels/$kb.txt" | sed 's/^/    /' | tee -a "$md"
    note ""
  done
fi

# 3c. issue 20's device memory under FSDP, only with FSDP_MEMORY=1: benchmarks/run_fsdp_memory.sh
# at DP 1 and 2 with the ranks sharing the GPU, with CUDA virtual memory (the default) and with
# MG_CUDA_VMM=0; ZeRO-2/3's "mem max allocated" should fall only with it. Each under 150 s
# (and under what is left of the budget).
if [ "${FSDP_MEMORY:-0}" = 1 ] && [[ $skip != *",fsdp,"* ]]; then
  mkdir -p "$stage/fsdp"
  for vmm in 1 0; do
    [ "$(left)" -lt 60 ] && { note "- FSDP memory, MG_CUDA_VMM=$vmm: not run, $(left)s left"; continue; }
    t0=$SECONDS
    lim=$(left)
    [ "$lim" -gt 150 ] && lim=150
    MG_CUDA_VMM=$vmm MG_FSDP_PLATFORM=cuda MG_FSDP_DP="${FSDP_DP:-1 2}" timeout "$lim" \
      sh benchmarks/run_fsdp_memory.sh .gpu_bundle "$stage/fsdp/vmm$vmm.md" 3 \
      > "$stage/fsdp/vmm$vmm.log" 2>&1
    note "## FSDP memory on the GPU, MG_CUDA_VMM=$vmm: rc=$?, $((SECONDS - t0)) s"
    note ""
    grep -E '^\|' "$stage/fsdp/vmm$vmm.md" 2>/dev/null | tee -a "$md"
    note ""
  done
fi

# 4. measurements
# The shapes of benchmarks/run_gpu_e2e.sh (gpt2-124m, llama-1b, moe-8x, dense-moe-active).
# shellcheck source=/dev/null
source <(sed -n '/^model_flags() {/,/^}/p' benchmarks/run_gpu_e2e.sh)
iters=${PERF_ITERS:-10}
perf() {  # perf <name> <limit> <workload> <micro-batch> [VAR=value...] [extra flags...]
  local name=$1 limit=$2 w=$3 mbs=$4
  shift 4
  local envs=()  # leading VAR=value words: the run's environment (A/B switches)
  while [ $# -gt 0 ] && [[ $1 =~ ^[A-Z_][A-Z0-9_]*= ]]; do
    envs+=("$1")
    shift
  done
  local l
  l=$(left)
  if [ "$l" -lt 20 ]; then note "| $name | not run: ${l}s left | | | | | |"; return; fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t0=$SECONDS
  # shellcheck disable=SC2046
  timeout --kill-after=5 "$limit" env "${envs[@]}" "$bindir/pretrain_gpt" --platform cuda --bf16 --mock-data \
    $(model_flags "$w" "$mbs") --train-iters $((3 + iters)) --log-interval 1 --eval-iters 0 \
    --eval-interval 1000000 "$@" > "$stage/perf/$name.log" 2>&1
  local rc=$?
  python3 - "$stage/perf/$name.log" "$name" "$rc" "$((SECONDS - t0))" "${envs[*]} $*" <<'EOF' | tee -a "$md"
import re, statistics, sys
log, name, rc, secs, extra = sys.argv[1:]
extra = extra.strip()
lines = [l for l in open(log, errors="replace") if "elapsed time per iteration" in l]
ms = [float(re.search(r"per iteration \(ms\): ([0-9.]+)", l).group(1)) for l in lines][3:]
tps = [float(re.search(r"tokens per second per GPU: ([0-9.]+)", l).group(1)) for l in lines][3:]
mfu = [m.group(1) for l in lines for m in [re.search(r"MFU: ([0-9.]+)%", l)] if m][3:]
mem = [m.group(1) for l in lines for m in [re.search(r"mem max allocated \(MB\): ([0-9.]+)", l)] if m]
loss = [m.group(1) for l in lines for m in [re.search(r"lm loss: ([0-9.E+-]+)", l)] if m]
med = statistics.median(ms) if ms else float("nan")
print(f"| {name} | {extra or '-'} | rc={rc}, {secs}s | {med:.1f} | "
      f"{statistics.median(tps) if tps else float('nan'):.0f} | {mfu[-1] if mfu else '-'} | "
      f"{mem[-1] if mem else '-'} | {loss[0] if loss else '-'} .. {loss[-1] if loss else '-'} |")
EOF
}
if [[ $skip != *",perf,"* ]]; then
  mkdir -p "$stage/perf"
  note "## Measurements (pretrain_gpt --platform cuda --bf16 --mock-data, 3 + $iters iterations, median of the $iters timed)"
  note ""
  note "| run | extra flags | status | median ms/iter | tokens/s | MFU % | peak MB | lm loss first .. last |"
  note "|---|---|---|---|---|---|---|---|"
  if [ -n "${PERF_RUNS:-}" ]; then  # "name limit workload micro-batch [flags...]; ..."
    IFS=';' read -ra runs <<< "$PERF_RUNS"
    for r in "${runs[@]}"; do
      # shellcheck disable=SC2086
      perf $r
    done
    finish
  fi
  perf gpt2-124m 40 gpt2-124m 64
  perf gpt2-124m-ce-two-pass 40 gpt2-124m 64 MG_CUDA_CE_FWD=two-pass
  perf gpt2-124m-ce-online 40 gpt2-124m 64 MG_CUDA_CE_FWD=online
  perf llama-1b-bf16 60 llama-1b 4
  perf llama-1b-fp8 60 llama-1b 4 --fp8-format hybrid
  perf llama-1b-fp8-separate 60 llama-1b 4 --fp8-format hybrid --no-bias-swiglu-fusion
  perf llama-1b-bf16-gbs32 90 llama-1b 4 --global-batch-size 32
  perf llama-1b-fp8-gbs32 90 llama-1b 4 --fp8-format hybrid --global-batch-size 32
  # FP8 attention: llama-1b's head dim 64 has cuDNN's FP8 forward but not its FP8 backward on
  # Hopper (head dim 128 only), so TE's NVTE_FP8_DPA_BWD=0 (backward in bf16); the full FP8
  # attention on the same model with 16 heads of 128.
  perf llama-1b-fp8-dpa 60 llama-1b 4 NVTE_FP8_DPA_BWD=0 --fp8-format hybrid --fp8-dot-product-attention
  perf llama-1b-fp8-dpa-gbs32 90 llama-1b 4 NVTE_FP8_DPA_BWD=0 --fp8-format hybrid --fp8-dot-product-attention --global-batch-size 32
  perf llama-1b-hd128-bf16 60 llama-1b 4 --num-attention-heads 16 --num-query-groups 4
  perf llama-1b-hd128-fp8 60 llama-1b 4 --num-attention-heads 16 --num-query-groups 4 --fp8-format hybrid
  perf llama-1b-hd128-fp8-dpa 60 llama-1b 4 --num-attention-heads 16 --num-query-groups 4 --fp8-format hybrid --fp8-dot-product-attention
  # --fp8-multi-head-attention (session 28, built on the CPU, first run here): O into
  # linear_proj's FP8 GEMM as it is, dO out of its data-gradient GEMM in FP8.
  perf llama-1b-hd128-fp8-mha 60 llama-1b 4 --num-attention-heads 16 --num-query-groups 4 --fp8-format hybrid --fp8-multi-head-attention
  perf llama-1b-hd128-fp8-mha-gbs32 90 llama-1b 4 --num-attention-heads 16 --num-query-groups 4 --fp8-format hybrid --fp8-multi-head-attention --global-batch-size 32
  perf moe-8x-top2 50 moe-8x 4
  perf dense-equal-active 40 dense-moe-active 4
  perf gpt2-124m-offload 50 gpt2-124m 16 --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d
  perf gpt2-124m-optable 40 gpt2-124m 64 --profile-op-table --profile-step-start 8 --profile-step-end 10
  perf llama-1b-optable 60 llama-1b 4 --profile-op-table --profile-step-start 8 --profile-step-end 10
  perf llama-1b-fp8-optable 60 llama-1b 4 --fp8-format hybrid --profile-op-table --profile-step-start 8 --profile-step-end 10
  note ""
  for t in gpt2-124m-optable llama-1b-optable llama-1b-fp8-optable; do
    [ -f "$stage/perf/$t.log" ] || continue
    note "### $t"
    note ""
    grep -A40 'op profile (--profile-op-table)' "$stage/perf/$t.log" | head -45 | sed 's/^/    /' | tee -a "$md"
    note ""
  done
  for f in "$stage"/perf/*.log; do
    grep -qE 'elapsed time per iteration' "$f" || { note "$(basename "$f"): no iteration logged:"; tail -5 "$f" | sed 's/^/    /' | tee -a "$md"; }
  done
fi
finish
