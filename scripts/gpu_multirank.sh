#!/usr/bin/env bash
# Several ranks on the one lent GPU (issue 17), in ONE device call of under 10 minutes: run on the
# GPU machine from the repository root, with the bundle of scripts/gpu_bundle.sh carried (it packs
# OpenMPI's launcher too: the device image has none; scripts/gpu_env.sh points OPAL_PREFIX at it).
#   1. device facts, megatron_info, the MPI launcher and whether MPI is CUDA-aware    ~5 s
#   2. the NCCL single-rank tests (nccl_communicator_test), the MPI staging test
#      (device_staging_test, one rank and `mpirun -np 2`), and the CUDA cases (*Cuda) of the
#      in-process gradient comparisons (gpt_tp, pipeline_schedules, ddp, context_parallel,
#      moe_ep) under `mpirun -np 2`                                                  ~1 min
#   3. the CUDA mode of the multi-rank training scripts (MG_TEST_PLATFORM=cuda, compare_logs.sh
#      use_test_platform): every rank `--platform cuda --distributed-backend mpi` on GPU 0,
#      compared with a one-rank CUDA run as the CPU mode is with one CPU rank (f32, no dropout
#      where DP is involved), in the issue's order: TP 2, PP 2 (1F1B and interleaved), CP 2 (p2p,
#      allgather, a2a), EP 2, DP 2 with the distributed optimizer, TP2xPP2xDP2 on 8 ranks; then,
#      while the budget lasts, the np 4 variants and the checkpoint reshard sources.
# Each part runs under its own time limit; parts are skipped once the budget (SESSION_BUDGET,
# default 540 s) is nearly spent. Results under ${OUT:-/tmp/gpu_out}: multirank.md (a table: part,
# command, rc, seconds, the ok/FAIL lines) and multirank.tar.gz (every log). Commit multirank.md as
# benchmarks/results/<date>-<gpu>-multirank.md.
#
# Here, before the call (no GPU needed): build with CUDA and pack,
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMG_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
#   cmake --build build-gpu -j"$(nproc)" && bash scripts/gpu_bundle.sh build-gpu
# The device call: command "bash scripts/gpu_multirank.sh", carry [".gpu_bundle"], timeout_s 600.
# Env: SESSION_BUDGET (s), ONLY (a comma list of part names, e.g. tp_np2,pp_np8), BIN_DIR (a build's
# bin/ instead of the bundle), MPIEXEC (default mpirun). Without a usable GPU it says why, writes
# that into multirank.md and exits 0 having run nothing (a dry run of this script on a CPU
# machine: BIN_DIR=build/bin bash scripts/gpu_multirank.sh; with DRY_RUN=1 every part runs anyway
# and skips, which exercises the table).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
stage=$(mktemp -d)
budget=${SESSION_BUDGET:-540}
only=",${ONLY:-},"
begin=$SECONDS
status=0
md=$stage/multirank.md
left() { echo $((budget - (SECONDS - begin))); }
note() { echo "$*" | tee -a "$md"; }
finish() {
  note ""
  note "session: $((SECONDS - begin)) s, status $status"
  tar -C "$stage" -czf "$out/multirank.tar.gz" .
  cp "$md" "$out/multirank.md"
  rm -rf "$stage"
  exit "$status"
}

bindir=${BIN_DIR:-.gpu_bundle/bin}
if [ -z "${BIN_DIR:-}" ]; then
  if [ -e .gpu_bundle/paths ] || [ -e .gpu_bundle/bundle.tar.xz ]; then
    source scripts/gpu_env.sh
  else
    echo "gpu_multirank: no .gpu_bundle (run scripts/gpu_bundle.sh here and carry .gpu_bundle)," \
      "or set BIN_DIR to a build's bin/" >&2
    exit 2
  fi
fi
mpiexec=${MPIEXEC:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
note "# Several ranks on one GPU (issue 17): $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(cat .gpu_bundle/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
note ""
note "Command: \`bash scripts/gpu_multirank.sh\` (carry .gpu_bundle; scripts/gpu_multirank.sh header)."
note ""

# 1. Facts, and the two preconditions: a usable CUDA platform and an MPI launcher.
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$bindir/megatron_info" --platform cuda 2>&1 | head -12
  echo "launcher: $(command -v "$mpiexec" || echo none) $("$mpiexec" --version 2>/dev/null | head -1)"
  echo "OPAL_PREFIX=${OPAL_PREFIX:-}"
} > "$stage/device.txt" 2>&1
sed 's/^/    /' "$stage/device.txt" | head -20 | tee -a "$md"
note ""
if ! "$bindir/megatron_info" --platform cuda > "$stage/platform.txt" 2>&1; then
  note "SKIP: no usable CUDA platform on this machine, nothing was run:"
  grep -i "cuda" "$stage/platform.txt" | head -5 | sed 's/^/    /' | tee -a "$md"
  [ -n "${DRY_RUN:-}" ] || finish
  note "(DRY_RUN: the parts run anyway and skip: a test of this script, not results)"
fi
if ! command -v "$mpiexec" > /dev/null; then
  note "FAIL: no MPI launcher '$mpiexec' (the bundle packs OpenMPI's when built on a machine that"
  note "has it: scripts/gpu_bundle.sh; gpu_env.sh sets OPAL_PREFIX and PATH)"
  status=1
  finish
fi

note "| part | command | rc | s | result lines |"
note "|---|---|---|---|---|"
# part <name> <limit s> <command...>: rc 0 passed, 77 skipped (the script said why), else failed.
part() {
  local name=$1 limit=$2
  shift 2
  if [ "$only" != ",," ] && [[ $only != *",$name,"* ]]; then return; fi
  local l
  l=$(left)
  if [ "$l" -lt 25 ]; then
    note "| $name | \`$*\` | - | - | not run: ${l}s of the budget left |"
    status=1
    return
  fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$stage/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
  local lines
  lines=$(grep -E '^(ok |FAIL|SKIP|\[  (PASSED|FAILED|SKIPPED) )' "$stage/$name.log" | sed 's/|/\\|/g' |
    tr '\n' ';' | sed 's/;$//; s/;/<br>/g')
  [ $rc -eq 124 ] && lines="TIMED OUT after ${limit}s; $lines"
  note "| $name | \`${*#"$bindir/"}\` | $rc | $((SECONDS - t0)) | $lines |"
}
training=tests/unit/training
run_script() {  # run_script <name> <limit> <script> <args before mpiexec...>
  local name=$1 limit=$2 script=$3
  shift 3
  part "$name" "$limit" env MG_TEST_PLATFORM=cuda "$training/$script" "$bindir/pretrain_gpt" "$@" \
    "$mpiexec" --oversubscribe
}

# 2. NCCL on one rank; the MPI backend's device staging on a fake device, one and two ranks.
part nccl_single 60 "$bindir/nccl_communicator_test" --gtest_brief=1 --gtest_color=no
part staging_np1 30 "$bindir/device_staging_test" --gtest_brief=1 --gtest_color=no
part staging_np2 60 "$mpiexec" --oversubscribe -np 2 "$bindir/device_staging_test" --gtest_brief=1 --gtest_color=no

# The in-process gradient comparisons on the CUDA platform (their *Cuda cases), two ranks on GPU 0.
for t in gpt_tp_test pipeline_schedules_test ddp_test context_parallel_test moe_ep_test; do
  part "${t%_test}_np2" 90 "$mpiexec" --oversubscribe -np 2 "$bindir/$t" --gtest_brief=1 --gtest_color=no \
    --gtest_filter='*Cuda*'
done

# 3. The issue's layouts first, then the rest while the budget lasts.
run_script tp_np2 120 pretrain_gpt_tp.sh 2
run_script pp_np2 150 pretrain_gpt_pp.sh 2
run_script cp_np2 120 pretrain_gpt_cp.sh 2
run_script moe_np2 120 pretrain_gpt_moe.sh 2
run_script dp_np2 120 pretrain_gpt_dp.sh 2
run_script pp_np8 200 pretrain_gpt_pp.sh 8
run_script fsdp_np2 150 pretrain_gpt_fsdp.sh 2
run_script moe_etp 150 pretrain_gpt_moe_etp.sh
run_script moe_layouts_np2 120 pretrain_gpt_moe_layouts.sh 2
run_script tp_np4 120 pretrain_gpt_tp.sh 4
run_script cp_np4 120 pretrain_gpt_cp.sh 4
run_script moe_np4 150 pretrain_gpt_moe.sh 4
run_script pp_np4 200 pretrain_gpt_pp.sh 4
for source in dopt pp ep cp nodopt; do
  run_script "reshard_$source" 150 checkpoint_reshard.sh "$source"
done
finish
