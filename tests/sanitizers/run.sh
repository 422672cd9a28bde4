#!/usr/bin/env bash
# The sanitizer gates (README.md, "Developing"): `make test-asan` and `make test-tsan`.
#   run.sh asan <build dir> <jobs>  ASan + UBSan (-fsanitize=address,undefined, errors fatal): the
#       whole build (no CUDA, no benchmarks) and every CTest test, the multi-rank ones included
#       (the ranks inherit the options; OpenMPI's own allocations kept until exit are suppressed,
#       lsan.supp says which and why).
#   run.sh tsan <build dir> <jobs>  TSan (-fsanitize=thread) over the code with background threads:
#       the MPI progress thread (collectives_test, ddp_test under mpirun, 2 and 4 ranks), the async
#       checkpoint save (checkpointing_test) and the data prefetch thread (data_samplers_test);
#       and one pretrain_gpt run with all three (DP 2, overlapped reduce and gather, --async-save);
#       only those targets are built. One OpenMP thread: libgomp is not TSan-instrumented, so its
#       barriers would be invisible to TSan and every parallel loop a false report.
# Both configure a build directory of their own (CPU only, -O1 -g1: the sanitizers' recommended
# level, and the shortest compile), print the time each stage took, and fail on the first report.
set -euo pipefail
cd "$(dirname "$0")/../.."
kind=${1:?usage: run.sh asan|tsan <build dir> <jobs>}
build=${2:-build-$kind}
jobs=${3:-$(nproc)}
supp=$PWD/tests/sanitizers
case "$kind" in
  asan) sanitize=address,undefined ;;
  tsan) sanitize=thread ;;
  *) echo "run.sh: unknown sanitizer '$kind' (asan, tsan)" >&2; exit 2 ;;
esac
stage() { echo "== $kind: $1 ($((SECONDS - t0)) s so far)"; }
t0=$SECONDS
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1 -DNDEBUG" \
  -DMG_CUDA=OFF -DMG_SANITIZE=$sanitize -DMG_BUILD_BENCHMARKS=OFF > "$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$kind" = asan ]; then
  cmake --build "$build" -j "$jobs"
  stage "built"
  export ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:fast_unwind_on_malloc=0
  export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 1800
  stage "all tests passed"
else
  tests=(collectives_test ddp_test checkpointing_test data_samplers_test)
  cmake --build "$build" -j "$jobs" --target "${tests[@]}" pretrain_gpt
  stage "built"
  export TSAN_OPTIONS="suppressions=$supp/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
  export OMP_NUM_THREADS=1
  mpirun=(mpirun --oversubscribe -x TSAN_OPTIONS -x OMP_NUM_THREADS)
  for t in "${tests[@]}"; do
    echo "== tsan: $t"
    "$build/bin/$t" --gtest_brief=1
  done
  for np in 2 4; do
    for t in collectives_test ddp_test; do
      echo "== tsan: mpirun -np $np $t"
      "${mpirun[@]}" -np "$np" --tag-output "$build/bin/$t" --gtest_brief=1
    done
  done
  # All three threads in one real run: DP 2 with the overlapped grad reduce and param gather
  # (progress thread), the data prefetch, and an async save at iterations 2 and 4.
  echo "== tsan: mpirun -np 2 pretrain_gpt (overlap, prefetch, --async-save)"
  ckpt=$(mktemp -d)
  "${mpirun[@]}" -np 2 "$build/bin/pretrain_gpt" --num-layers 2 --hidden-size 32 \
    --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 --micro-batch-size 2 \
    --global-batch-size 8 --train-iters 4 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer \
    --vocab-size 301 --log-interval 1 --eval-iters 0 --use-distributed-optimizer \
    --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 2000 --save "$ckpt" \
    --save-interval 2 --async-save > "$build/pretrain_gpt_tsan.log" 2>&1 \
    || { cat "$build/pretrain_gpt_tsan.log"; rm -rf "$ckpt"; exit 1; }
  rm -rf "$ckpt"
  stage "all runs clean"
fi
