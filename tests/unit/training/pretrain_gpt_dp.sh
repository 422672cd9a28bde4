#!/bin/sh
# pretrain_gpt under mpirun prints the same lm loss values as the single-rank run: plain data
# parallel, and the distributed optimizer with --overlap-grad-reduce and --overlap-param-gather
# across a checkpoint save at
# iteration 2 and a resume (per-rank optimizer shard files).
# usage: pretrain_gpt_dp.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]
# (CTest label `mpi`; tests/CMakeLists.txt.) Values are compared to 2e-6 relative: f32 round-off
# of a different summation order, far below the last printed digit's change per step.
set -eu
bin=$1; np=$2; shift 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 4
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 300 --log-interval 1
  --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --seed 7"

. "$(dirname "$0")/compare_logs.sh"  # expect_layout
use_test_platform  # MG_TEST_PLATFORM=cuda: every run on the GPU (compare_logs.sh)
losses() { grep -o 'lm loss: [^ ]*' "$1" | sed 's/lm loss: //'; }
compare() {  # compare <reference> <candidate> <what>
  losses "$1" > "$work/a"; losses "$2" > "$work/b"
  n=$(wc -l < "$work/a")
  [ "$n" -ge 2 ] || { echo "FAIL $3: reference printed $n lm loss lines"; cat "$1"; exit 1; }
  paste "$work/a" "$work/b" | awk -v what="$3" -v n="$n" '
    { a = $1 + 0; b = $2 + 0; d = a - b; if (d < 0) d = -d;
      if ($2 == "" || d > 2e-6 * (a < 0 ? -a : a)) { print "FAIL " what ": line " NR ": " $1 " vs " $2; bad = 1 } }
    END { if (NR != n) bad = 1; if (bad) exit 1; print "ok " what ": " NR " lm loss values agree" }' \
    || { echo "--- $2:"; cat "$2"; exit 1; }
}

"$bin" $args > "$work/single.log" 2>&1 || { cat "$work/single.log"; exit 1; }
"$@" -np "$np" "$bin" $args > "$work/dp.log" 2>&1 || { cat "$work/dp.log"; exit 1; }
expect_layout "$work/dp.log" "$np" $args
compare "$work/single.log" "$work/dp.log" "np $np"

# Distributed optimizer + overlap of the grad reduce and of the param gather (the save at
# iteration 2 happens while the last step's gathers are in flight, so it must wait for them):
# save at iteration 2, resume to 4 (each rank writes its own optimizer pieces): the same losses
# as the single-rank run.
dopt="--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 2000"
"$@" -np "$np" "$bin" $args $dopt --save "$work/ckpt" --save-interval 2 --exit-interval 2 \
  > "$work/first.log" 2>&1 || { cat "$work/first.log"; exit 1; }
ls "$work/ckpt/iter_0000002/rank_00000.safetensors" > /dev/null
expect_layout "$work/first.log" "$np" $args $dopt
"$@" -np "$np" "$bin" $args $dopt --load "$work/ckpt" > "$work/second.log" 2>&1 \
  || { cat "$work/second.log"; exit 1; }
expect_layout "$work/second.log" "$np" $args $dopt
cat "$work/first.log" "$work/second.log" > "$work/resumed.log"
compare "$work/single.log" "$work/resumed.log" "np $np save at 2 + resume"
