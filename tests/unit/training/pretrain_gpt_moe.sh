#!/bin/sh
# pretrain_gpt with Mixture of Experts and expert parallelism under mpirun prints the same lm loss,
# grad norm and load-balancing loss values as the single-rank run of the same global batch (a
# Mixtral-style model: SwiGLU experts, top-2, aux loss and z-loss on).
# np 4: EP 4 (8 experts, 2 per rank) with the alltoall and the allgather dispatcher; EP 4 with 4
# experts (1 per rank); EP 2 x DP 4; EP 2 x TP 2 (+ SP, expert TP 1); EP 4 with a capacity factor
# (tokens dropped per micro-batch as on one rank; the run differs from the dropless one, so tokens
# were dropped). np 2: EP 2 with both dispatchers; DeepSeek-V3 routing (expert bias, seq aux loss)
# with both, and its resume.
# usage: pretrain_gpt_moe.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]
# (CTest label `mpi`; tests/CMakeLists.txt.) lm loss to 2e-6 relative (f32 round-off of a
# different summation order), grad norm (3 decimals) to 2e-3, load_balancing_loss to 1e-5.
set -eu
bin=$1; np=$2; shift 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 4
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 301
  --make-vocab-size-divisible-by 4 --log-interval 1 --eval-iters 0 --hidden-dropout 0
  --attention-dropout 0 --seed 7 --disable-bias-linear --swiglu --moe-router-topk 2
  --moe-ffn-hidden-size 24 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3"

. "$(dirname "$0")/compare_logs.sh"  # values, compare_one
use_test_platform  # MG_TEST_PLATFORM=cuda: every run on the GPU (compare_logs.sh)
compare() {
  compare_one "$1" "$2" "$3" "lm loss" 2e-6 0
  compare_one "$1" "$2" "$3" "grad norm" 0 2e-3
  compare_one "$1" "$2" "$3" "load_balancing_loss" 1e-5 0
}
run() {  # run <log> <np> <extra args...>: also checks the layout of its start-up lines
  log=$1; n=$2; shift 2
  "$mpi" $mpi_args -np "$n" "$bin" $args "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
  expect_layout "$log" "$n" $args "$@"
}
single() {  # single <log> <extra args...>
  log=$1; shift
  "$bin" $args "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
}
mpi=$1; shift; mpi_args="$*"

single "$work/single8.log" --num-experts 8
if [ "$np" -eq 2 ]; then
  for d in alltoall allgather; do
    run "$work/ep2.log" 2 --num-experts 8 --expert-model-parallel-size 2 --moe-token-dispatcher-type $d
    compare "$work/single8.log" "$work/ep2.log" "EP 2 ($d)"
    if grep -q "tokens per expert" "$work/ep2.log"; then
      echo "FAIL: per-layer MoE lines without --moe-per-layer-logging"; exit 1
    fi
  done
  # DeepSeek-V3 routing: sigmoid, group-limited top-2 (4 groups, 2 chosen), scaling, expert bias
  # (tokens summed over the 2 data-parallel ranks: the same biases as one rank's 4 micro-batches),
  # seq aux loss. Then the biases survive a checkpoint: resuming at iteration 2 prints what the
  # uninterrupted run printed.
  ds="--num-experts 8 --moe-router-score-function sigmoid --moe-router-num-groups 4
    --moe-router-group-topk 2 --moe-router-topk-scaling-factor 2.5 --moe-router-enable-expert-bias
    --moe-router-bias-update-rate 1e-2 --moe-router-load-balancing-type seq_aux_loss
    --moe-token-dispatcher-type alltoall --moe-per-layer-logging"
  single "$work/single_ds.log" $ds
  grep -q "^ moe layer 1 | load_balancing_loss: .* tokens per expert: \[" "$work/single_ds.log" \
    || { echo "FAIL: no per-layer MoE log (--moe-per-layer-logging)"; cat "$work/single_ds.log"; exit 1; }
  run "$work/ep2_ds.log" 2 $ds --expert-model-parallel-size 2 --save "$work/ck_ds" --save-interval 2
  compare "$work/single_ds.log" "$work/ep2_ds.log" "EP 2 DeepSeek routing"
  # The allgather dispatcher selects this rank's experts from the gathered choices; the expert
  # bias still counts this rank's own kept choices (the router's counts).
  run "$work/ep2_ds_ag.log" 2 $ds --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
  compare "$work/single_ds.log" "$work/ep2_ds_ag.log" "EP 2 DeepSeek routing (allgather)"
  expect_line "$work/ep2_ds.log" "EP 2 DeepSeek routing" \
    "^moe router: group-limited, 4 groups \(2 chosen per token\); probabilities x 2.5; expert bias \(aux-loss-free\), update rate 0.01, tokens summed over 2 ranks"
  if [ "$(values "$work/single_ds.log" "lm loss" | tail -1)" = "$(values "$work/single8.log" "lm loss" | tail -1)" ]; then
    echo "FAIL: DeepSeek routing trained as the softmax router"; exit 1
  fi
  grep -q '"decoder.layers.1.mlp.router.expert_bias"' "$work/ck_ds/iter_0000004/metadata.json" \
    || { echo "FAIL: no expert bias in the checkpoint"; exit 1; }
  printf 2 > "$work/ck_ds/latest_checkpointed_iteration.txt"
  run "$work/ep2_ds_resume.log" 2 $ds --expert-model-parallel-size 2 --load "$work/ck_ds"
  values "$work/ep2_ds.log" "lm loss" | tail -2 > "$work/ds_a"
  values "$work/ep2_ds_resume.log" "lm loss" > "$work/ds_b"
  cmp -s "$work/ds_a" "$work/ds_b" || { echo "FAIL: resumed DeepSeek routing differs"; paste "$work/ds_a" "$work/ds_b"; exit 1; }
  echo "ok expert bias: resuming at iteration 2 repeats iterations 3-4"
else
  for d in alltoall allgather; do
    run "$work/ep4.log" "$np" --num-experts 8 --expert-model-parallel-size 4 --moe-token-dispatcher-type $d
    compare "$work/single8.log" "$work/ep4.log" "EP 4 x 8 experts ($d)"
  done
  run "$work/ep2dp.log" "$np" --num-experts 8 --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
  compare "$work/single8.log" "$work/ep2dp.log" "EP 2 x DP 4"
  run "$work/ep2tp2.log" "$np" --num-experts 8 --expert-model-parallel-size 2 \
    --tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1 \
    --moe-token-dispatcher-type alltoall
  compare "$work/single8.log" "$work/ep2tp2.log" "EP 2 x TP 2 + SP"
  single "$work/single4.log" --num-experts 4
  for d in alltoall allgather; do
    run "$work/ep4e4.log" "$np" --num-experts 4 --expert-model-parallel-size 4 --moe-token-dispatcher-type $d
    compare "$work/single4.log" "$work/ep4e4.log" "EP 4 x 4 experts ($d)"
  done
  cap="--num-experts 8 --moe-token-dispatcher-type alltoall --moe-expert-capacity-factor 1.0"
  single "$work/singlecap.log" $cap
  run "$work/ep4cap.log" "$np" $cap --expert-model-parallel-size 4
  compare "$work/singlecap.log" "$work/ep4cap.log" "EP 4 capacity factor 1.0"
  if [ "$(values "$work/singlecap.log" "lm loss" | tail -1)" = "$(values "$work/single8.log" "lm loss" | tail -1)" ]; then
    echo "FAIL: the capacity factor dropped no token (same loss as dropless)"; exit 1
  fi
  echo "ok capacity factor: tokens dropped (loss differs from the dropless run)"
fi
