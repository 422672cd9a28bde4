#!/bin/sh
# Megatron FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads | optim_grads_params)
# under mpirun prints the lm loss and grad norm values of the single-rank run, in every layout it
# composes with, and the layout that ran is the one asked for (expect_layout: the data-parallel
# line names the strategy). Each FSDP run also ends with its engine's line: optim_grads_params
# gathered parameter buckets in forward and backward (a count > 0) and its flat param+grad
# buffers stayed below their full size throughout; after the last step both strategies hold less
# than the full buffers (only the gradient shard; ZeRO-3 also only the parameter shard).
#   np 2: DP 2 with each strategy; optim_grads_params with --overlap-grad-reduce
#         --overlap-param-gather (prefetch), small buckets, full recompute, bf16, and a save at
#         iteration 2 + resume in the same layout (values equal the uninterrupted run exactly);
#         --use-torch-fsdp2 (the same engine, its note printed); CP 2 (sharded over dp-cp).
#         EP 2 (MoE: 4 experts, top-2; each rank's experts unsharded, dense params over DP 2).
#   np 4: DP 4, TP 2 + SP x DP 2, PP 2 x DP 2 (tied embedding across stages; optim_grads 1F1B,
#         optim_grads_params interleaved with VP 2, prefetch and an evaluation whose validation
#         losses match too), CP 2 x DP 2, EP 2 x DP 4 (experts sharded over their expert
#         data-parallel group of 2), each with both strategies.
# usage: pretrain_gpt_fsdp.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]
# (CTest label `mpi`; tests/CMakeLists.txt.) lm loss to 2e-6 relative (f32 round-off of another
# summation order, as pretrain_gpt_dp.sh), grad norm (3 decimals printed) to 2e-3; bf16 runs are
# compared with a bf16 single-rank run to 2e-3 relative (bf16 weights rounded once per step after
# a reduction in another order).
set -eu
bin=$1; np=$2; shift 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
common="--hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 3
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 301
  --make-vocab-size-divisible-by 4 --log-interval 1 --hidden-dropout 0 --attention-dropout 0
  --seed 7"
args="$common --num-layers 2 --eval-iters 0"
vp_args="$common --num-layers 4 --eval-iters 1 --eval-interval 2"  # interleaved PP + evaluation

. "$(dirname "$0")/compare_logs.sh"  # compare_one, expect_layout, expect_line
use_test_platform  # MG_TEST_PLATFORM=cuda: every run on the GPU (compare_logs.sh)
fsdp="--use-megatron-fsdp --data-parallel-sharding-strategy"
moe="--num-experts 4 --disable-bias-linear --swiglu --moe-router-topk 2 --moe-ffn-hidden-size 24
  --moe-aux-loss-coeff 1e-2"
# engine <log> <strategy>: the FSDP engine's end-of-training line shows it sharded.
engine() {
  line=$(grep -E "^Megatron FSDP $2: " "$1") \
    || { echo "FAIL $2: no engine line"; cat "$1"; exit 1; }
  echo "$line" | awk -v s="$2" '{
      for (i = 1; i <= NF; i++) { if ($i == "parameter") g = $(i - 1);
        if ($i == "now") now = $(i + 1); if ($i == "most") peak = $(i + 1);
        if ($i == "of") full = $(i + 1) }
      if (s == "optim_grads_params" && g + 0 <= 0) { print "FAIL " s ": no parameter gathers: " $0; exit 1 }
      if (now + 0 >= full + 0) { print "FAIL " s ": nothing released: " $0; exit 1 }
      if (s == "optim_grads_params" && peak + 0 >= full + 0) { print "FAIL " s ": peak not below the full buffers: " $0; exit 1 }
      print "ok engine " s ": " g " gathers, resident now " now ", at most " peak " of " full " MiB" }' \
    || { cat "$1"; exit 1; }
}
# fsdp_run <what> <np> <reference log> <strategy> <args...>: an FSDP run vs the reference.
fsdp_run() {
  what=$1; n=$2; ref=$3; strategy=$4; shift 4
  log="$work/run.log"
  a=${run_args:-$args}
  $mpi -np "$n" "$bin" $a $fsdp "$strategy" "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
  expect_layout "$log" "$n" $a $fsdp "$strategy" "$@"
  engine "$log" "$strategy"
  compare_one "$ref" "$log" "$what $strategy" "lm loss" 2e-6 0
  compare_one "$ref" "$log" "$what $strategy" "grad norm" 0 2e-3
}
mpi="$*"

"$bin" $args > "$work/single.log" 2>&1 || { cat "$work/single.log"; exit 1; }
if [ "$np" -eq 2 ]; then
  for s in optim_grads optim_grads_params; do fsdp_run "DP2" 2 "$work/single.log" $s; done
  # ZeRO-3 with prefetch, overlapped reduce-scatters, 300-element buckets and full recompute
  # (the recomputed forward gathers again), saved at 2 and resumed to 3.
  z3="--overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 300
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
  fsdp_run "DP2 overlap+prefetch+recompute" 2 "$work/single.log" optim_grads_params $z3 \
    --save "$work/ckpt" --save-interval 2
  cp "$work/run.log" "$work/full.log"
  printf 2 > "$work/ckpt/latest_checkpointed_iteration.txt"
  $mpi -np 2 "$bin" $args $fsdp optim_grads_params $z3 --load "$work/ckpt" > "$work/resume.log" 2>&1 \
    || { cat "$work/resume.log"; exit 1; }
  grep -q "successfully loaded checkpoint .* at iteration 2" "$work/resume.log" \
    || { echo "FAIL: no load line"; cat "$work/resume.log"; exit 1; }
  tail_of() { values "$1" "$2" | tail -n 1; }
  for f in "lm loss" "grad norm"; do
    [ "$(tail_of "$work/full.log" "$f")" = "$(tail_of "$work/resume.log" "$f")" ] \
      || { echo "FAIL resume: $f differs"; cat "$work/resume.log"; exit 1; }
  done
  echo "ok DP2 optim_grads_params: save at 2 + resume prints the uninterrupted run's values"
  # --use-torch-fsdp2: the same engine, noted; bf16 with fp32 master weights.
  "$bin" $args --bf16 > "$work/single_bf16.log" 2>&1 || { cat "$work/single_bf16.log"; exit 1; }
  $mpi -np 2 "$bin" $args --bf16 --use-torch-fsdp2 > "$work/fsdp2.log" 2>&1 \
    || { cat "$work/fsdp2.log"; exit 1; }
  expect_layout "$work/fsdp2.log" 2 $args --use-torch-fsdp2
  expect_line "$work/fsdp2.log" "fsdp2 note" "^note: --use-torch-fsdp2 runs the Megatron FSDP engine"
  engine "$work/fsdp2.log" optim_grads_params
  compare_one "$work/single_bf16.log" "$work/fsdp2.log" "bf16 DP2 torch-fsdp2" "lm loss" 2e-3 0
  # Context parallelism: the sharding group is dp-cp.
  fsdp_run "CP2" 2 "$work/single.log" optim_grads_params --context-parallel-size 2
  # Expert parallelism: each rank its own 2 experts (expert data-parallel size 1), the dense
  # parameters sharded over DP 2.
  "$bin" $args $moe > "$work/single_moe.log" 2>&1 || { cat "$work/single_moe.log"; exit 1; }
  fsdp_run "EP2" 2 "$work/single_moe.log" optim_grads $moe --expert-model-parallel-size 2
else
  "$bin" $args $moe > "$work/single_moe.log" 2>&1 || { cat "$work/single_moe.log"; exit 1; }
  "$bin" $vp_args > "$work/single_vp.log" 2>&1 || { cat "$work/single_vp.log"; exit 1; }
  for s in optim_grads optim_grads_params; do
    fsdp_run "DP4" 4 "$work/single.log" $s
    fsdp_run "TP2+SP x DP2" 4 "$work/single.log" $s --tensor-model-parallel-size 2 \
      --sequence-parallel
    if [ "$s" = optim_grads ]; then
      fsdp_run "PP2 x DP2" 4 "$work/single.log" $s --pipeline-model-parallel-size 2
    else  # interleaved (4 layers, VP 2) with prefetch and an evaluation
      run_args=$vp_args
      fsdp_run "PP2 x VP2 x DP2 + eval" 4 "$work/single_vp.log" $s \
        --pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2 \
        --overlap-grad-reduce --overlap-param-gather
      run_args=
      compare_one "$work/single_vp.log" "$work/run.log" "PP2 x VP2 x DP2" "lm loss value" 2e-6 0
    fi
    fsdp_run "CP2 x DP2" 4 "$work/single.log" $s --context-parallel-size 2
    # EP 2 x DP 4: experts sharded over their expert data-parallel group of 2.
    fsdp_run "EP2 x DP4" 4 "$work/single_moe.log" $s $moe --expert-model-parallel-size 2
  done
fi
