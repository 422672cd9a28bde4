#!/bin/sh
# Expert tensor parallelism, experts with biases and --moe-grouped-gemm in pretrain_gpt (4 ranks):
# each run prints the lm loss, grad norm and load-balancing loss of the single-rank run of the same
# global batch, with its layout checked from the start-up lines (expect_layout):
#   - expert TP 2 x EP 2 (TP 1) with the alltoall and the allgather dispatcher, and its host
#     round trips per step (one read per MoE layer and micro-batch);
#   - TP 2 + SP x EP 2 with Megatron's default expert TP (= TP = 2);
#   - experts with biases (linear_fc{1,2}.bias): single rank vs expert TP 2 x EP 2, and expert TP
#     2 x expert-DP 2 with the distributed optimizer;
#   - --moe-grouped-gemm: the single-rank run prints the same values as without it, to the last
#     digit (the CPU grouped GEMM is the loop of GEMMs), and expert TP 2 x EP 2 with it agrees;
#   - the MoE command of Megatron's documentation (MEGATRON_WORKFLOWS.md section 3: TP 2, EP 4,
#     8 experts top-2 aux loss, bf16, no --disable-bias-linear) shrunk to a tiny model and 4
#     ranks (EP 2; --sequence-parallel, which Megatron requires for MoE with TP) trains 3
#     iterations with finite losses.
# usage: pretrain_gpt_moe_etp.sh <pretrain_gpt> <mpiexec> [mpiexec args...]
# (CTest label `mpi`; tests/CMakeLists.txt.) Tolerances as pretrain_gpt_moe.sh: lm loss 2e-6
# relative, grad norm (3 decimals) 2e-3 absolute, load_balancing_loss 1e-5 relative.
set -eu
bin=$1; shift
mpi=$1; shift; mpi_args="$*"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
base="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 3
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 301
  --make-vocab-size-divisible-by 4 --log-interval 1 --eval-iters 0 --hidden-dropout 0
  --attention-dropout 0 --seed 7 --swiglu --num-experts 8 --moe-router-topk 2
  --moe-ffn-hidden-size 24 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3"
args="$base --disable-bias-linear"

. "$(dirname "$0")/compare_logs.sh"  # values, compare_one, expect_layout
use_test_platform  # MG_TEST_PLATFORM=cuda: every run on the GPU (compare_logs.sh)
compare() {
  compare_one "$1" "$2" "$3" "lm loss" 2e-6 0
  compare_one "$1" "$2" "$3" "grad norm" 0 2e-3
  compare_one "$1" "$2" "$3" "load_balancing_loss" 1e-5 0
}
run() {  # run <log> <extra args...>: 4 ranks, and the layout of its start-up lines
  log=$1; shift
  "$mpi" $mpi_args -np 4 "$bin" $args "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
  expect_layout "$log" 4 $args "$@"
}
single() {  # single <log> <extra args...>
  log=$1; shift
  "$bin" $args "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
}

etp2="--expert-tensor-parallel-size 2 --expert-model-parallel-size 2"
single "$work/single.log"
for d in alltoall allgather; do
  run "$work/etp.log" $etp2 --moe-token-dispatcher-type $d
  compare "$work/single.log" "$work/etp.log" "ETP 2 x EP 2 ($d)"
done
# One host read per MoE layer and micro-batch under expert TP too (the group's row counts come with
# the dispatch's): 2 layers x 1 micro-batch per rank (log line outside the profiled steps). The
# `moe` site only: in CUDA mode the ranks share the GPU through the MPI backend, whose staging
# copies of the collectives' device buffers come after it as `other` (23 a step on the H200,
# session 24); NCCL has none.
run "$work/etp_sync.log" $etp2 --moe-token-dispatcher-type alltoall --log-interval 10 \
  --profile-op-table --profile-step-start 1 --profile-step-end 3
grep -qE "^host round-trips per step: (.*, )?moe 2(,|$)" "$work/etp_sync.log" \
  || { echo "FAIL: ETP 2 x EP 2 reads more than once per MoE layer and micro-batch"; \
       grep "host round-trips" "$work/etp_sync.log"; exit 1; }
run "$work/tp2.log" --tensor-model-parallel-size 2 --sequence-parallel \
  --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
grep -q "expert tensor parallel 2" "$work/tp2.log" \
  || { echo "FAIL: TP 2 did not default to expert TP 2"; cat "$work/tp2.log"; exit 1; }
compare "$work/single.log" "$work/tp2.log" "TP 2 + SP x EP 2 (expert TP 2, Megatron's default)"

# --moe-grouped-gemm: the same digits on one rank; expert TP 2 x EP 2 with it.
single "$work/grouped.log" --moe-grouped-gemm
for key in "lm loss" "grad norm" "load_balancing_loss"; do
  [ "$(values "$work/single.log" "$key")" = "$(values "$work/grouped.log" "$key")" ] \
    || { echo "FAIL --moe-grouped-gemm: $key differs from the GEMM loop"; exit 1; }
done
echo "ok --moe-grouped-gemm: one rank prints the loop's values exactly"
run "$work/etpg.log" $etp2 --moe-grouped-gemm
compare "$work/single.log" "$work/etpg.log" "ETP 2 x EP 2 --moe-grouped-gemm"

# Experts with biases (Megatron's default --add-bias-linear).
args="$base"
single "$work/bias.log"
run "$work/etpb.log" $etp2
compare "$work/bias.log" "$work/etpb.log" "experts with biases: ETP 2 x EP 2"
# The distributed optimizer with expert TP: ETP 2 x EP 1 (expert data-parallel 2: expert shards
# and their optimizer state split over it, the replicated fc2 bias counted once in the grad norm).
run "$work/etpd.log" --expert-tensor-parallel-size 2 --use-distributed-optimizer
compare "$work/bias.log" "$work/etpd.log" "experts with biases: ETP 2 x EP 1 x expert-DP 2, dist-opt"

# MEGATRON_WORKFLOWS.md section 3, shrunk (4 ranks: TP 2 x EP 2, expert TP 2 by default).
args="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --expert-model-parallel-size 2
  --num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss
  --moe-aux-loss-coeff 0.01 --hidden-size 32 --num-layers 2 --num-attention-heads 4
  --seq-length 16 --max-position-embeddings 16 --bf16 --use-mcore-models
  --transformer-impl transformer_engine --sequence-parallel --mock-data
  --tokenizer-type NullTokenizer --vocab-size 301 --micro-batch-size 2 --train-iters 3 --lr 1e-4
  --log-interval 1 --eval-iters 0"
run "$work/workflow.log"
n=$(values "$work/workflow.log" "lm loss" | awk '$1 + 0 == $1 + 0 && $1 != "nan" && $1 != "inf" { n++ } END { print n + 0 }')
[ "$n" -eq 3 ] || { echo "FAIL workflow command: $n finite losses of 3"; cat "$work/workflow.log"; exit 1; }
echo "ok MEGATRON_WORKFLOWS.md section 3 (shrunk): 3 iterations, finite losses"
