#!/bin/sh
# --deterministic-mode across ranks: pretrain_gpt with dropout on, data parallel over <np> ranks
# under mpirun, run twice: every printed lm loss and grad norm is identical (compared as text, to
# the last printed digit; the in-process test deterministic_mode_test compares the doubles and
# the saved weights bit for bit). The MPI backend reduces in a fixed order for a fixed size.
# usage: deterministic_mode.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]
set -eu
bin=$1; np=$2; shift 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/compare_logs.sh"
args="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 6
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 300 --log-interval 1
  --eval-iters 0 --hidden-dropout 0.1 --attention-dropout 0.1 --seed 11 --deterministic-mode"
for run in 1 2; do
  "$@" -np "$np" "$bin" $args > "$work/run$run.log" 2>&1 || { cat "$work/run$run.log"; exit 1; }
done
expect_layout "$work/run1.log" "$np" $args
grep -q "deterministic mode" "$work/run1.log" || { echo "FAIL: no deterministic mode line"; cat "$work/run1.log"; exit 1; }
min_lines=6
compare_one "$work/run1.log" "$work/run2.log" "np $np rerun" "lm loss" 0 0
compare_one "$work/run1.log" "$work/run2.log" "np $np rerun" "grad norm" 0 0
