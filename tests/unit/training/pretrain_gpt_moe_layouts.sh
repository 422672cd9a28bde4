#!/bin/sh
# pretrain_gpt with Mixture of Experts in the layouts Megatron documents for Mixtral and
# DeepSeek-V3 under mpirun prints the same lm loss, grad norm and load-balancing loss (per layer
# and mean) as the single-rank run of the same global batch (4 layers, hidden 32, 8 experts top-2,
# SwiGLU, aux loss and z-loss, alltoall dispatcher), each run's layout checked from its start-up
# lines (expect_layout).
#   np 2: EP 2 + distributed optimizer (dense params sharded over DP 2, experts over expert-DP 1);
#         TP 2 (+ SP) x EP 1 + distributed optimizer (dp 1, whole experts sharded over the TP
#         ranks); CP 2 x EP 2 with --cp-comm-type p2p, a2a and allgather (the aux losses' token
#         counts summed over the CP group).
#   np 4: TP 2 (+ SP) x EP 2 + distributed optimizer (experts sharded over expert-DP 2);
#         TP 2 x EP 2 with FSDP optim_grads_params; PP 2 x EP 2 (1F1B) and interleaved (VP 2);
#         TP 2 x PP 2 x EP 2; CP 2 x EP 2 x DP 2 + distributed optimizer.
#   np 8: TP 2 (+ SP) x PP 2 x CP 2 x EP 2 + distributed optimizer (expert-DP = the CP pair; the
#         aux-loss partition is the tp-cp group of 4).
# usage: pretrain_gpt_moe_layouts.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]
# (CTest label `mpi`; tests/CMakeLists.txt.) lm loss to 2e-6 relative (f32 round-off of another
# summation order), grad norm (3 decimals printed) to 2e-3, load_balancing_loss to 1e-5 relative.
set -eu
bin=$1; np=$2; shift 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args="--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 3
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 301
  --make-vocab-size-divisible-by 4 --log-interval 1 --eval-iters 0 --hidden-dropout 0
  --attention-dropout 0 --seed 7 --disable-bias-linear --swiglu --num-experts 8
  --moe-router-topk 2 --moe-ffn-hidden-size 24 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3
  --moe-token-dispatcher-type alltoall"

. "$(dirname "$0")/compare_logs.sh"  # values, compare_one, expect_layout
use_test_platform  # MG_TEST_PLATFORM=cuda: every run on the GPU (compare_logs.sh)
mpi=$1; shift; mpi_args="$*"
"$bin" $args > "$work/single.log" 2>&1 || { cat "$work/single.log"; exit 1; }
# run <what> <np> <extra args...>: the layout of its start-up lines, then the values.
run() {
  what=$1; n=$2; shift 2
  "$mpi" $mpi_args -np "$n" "$bin" $args "$@" > "$work/run.log" 2>&1 \
    || { cat "$work/run.log"; echo "FAIL $what: exited non-zero"; exit 1; }
  expect_layout "$work/run.log" "$n" $args "$@"
  compare_one "$work/single.log" "$work/run.log" "$what" "lm loss" 2e-6 0
  compare_one "$work/single.log" "$work/run.log" "$what" "grad norm" 0 2e-3
  compare_one "$work/single.log" "$work/run.log" "$what" "load_balancing_loss" 1e-5 0
}
ep2="--expert-model-parallel-size 2"
tp2="--tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1"
pp2="--pipeline-model-parallel-size 2"
cp2="--context-parallel-size 2"
dopt="--use-distributed-optimizer"
case "$np" in
  2)
    run "EP 2 dist-opt" 2 $ep2 $dopt
    run "TP 2 + SP x EP 1 dist-opt" 2 $tp2 $dopt
    for t in p2p a2a allgather; do
      run "CP 2 ($t) x EP 2" 2 $cp2 --cp-comm-type $t $ep2
    done
    ;;
  4)
    run "TP 2 + SP x EP 2 dist-opt" 4 $tp2 $ep2 $dopt
    run "TP 2 + SP x EP 2 FSDP optim_grads_params" 4 $tp2 $ep2 --use-megatron-fsdp \
      --data-parallel-sharding-strategy optim_grads_params
    run "PP 2 x EP 2" 4 $pp2 $ep2
    run "PP 2 x VP 2 x EP 2" 4 $pp2 --num-layers-per-virtual-pipeline-stage 1 $ep2
    run "TP 2 + SP x PP 2 x EP 2" 4 $tp2 $pp2 $ep2
    run "CP 2 x EP 2 x DP 2 dist-opt" 4 $cp2 $ep2 $dopt
    ;;
  8)
    run "TP 2 + SP x PP 2 x CP 2 x EP 2 dist-opt" 8 $tp2 $pp2 $cp2 $ep2 $dopt
    ;;
  *) echo "np must be 2, 4 or 8, got $np"; exit 2 ;;
esac
