#!/bin/sh
# pretrain_gpt with pipeline parallelism under mpirun prints the same lm loss and grad norm values
# as the single-rank run, 3 optimizer steps of a tiny GPT-2 (tied embeddings: the last stage's
# copy summed over the embedding group and counted once in the grad norm) and a tiny LLaMA
# (untied, RoPE, SwiGLU, GQA). Layouts by np:
#   np 2: PP 2 (1F1B), PP 2 x VP 2 (interleaved), uneven split (1 + 3 layers), LLaMA PP 2 x VP 2;
#         PP 2 saves at iteration 2 and resumes at PP 2 and at PP 1 (the sharded format reshards
#         by global names); refused before any work: --ckpt-format legacy with PP, 31 layers over
#         PP 2 (never silently fewer layers), interleaving with micro-batches not a multiple of PP;
#   np 4: PP 4, PP 2 x TP 2 + SP, PP 2 x DP 2 + distributed optimizer, PP 2 x VP 2 x DP 2,
#         LLaMA PP 4 x VP 2 and uneven PP 4 (1 + 2 + 2 + 3); PP 2 x DP 2 + distributed optimizer
#         saves at 2, PP 4 resumes;
#   np 8: PP 2 x TP 2 x DP 2 (+ SP, distributed optimizer), 1F1B and interleaved; LLaMA too.
# With DP > 1 the GPT-2 runs compare without hidden dropout (masks follow the local micro-batch
# index, as in Megatron).
# usage: pretrain_gpt_pp.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]
# (CTest label `mpi`; tests/CMakeLists.txt.) lm loss to 2e-6 relative (f32 round-off of a
# different summation order: the printed value has 7 digits); grad norm (3 decimals printed) to
# 2e-3: counting the tied embedding twice moves it by far more.
set -eu
bin=$1; np=$2; shift 2
mpi=$1; shift; mpi_args="$*"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
common="--hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --train-iters 3
  --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 301
  --make-vocab-size-divisible-by 4 --log-interval 1 --eval-iters 0 --attention-dropout 0 --seed 7"
gpt2="$common --global-batch-size 16 --num-layers 4 --hidden-dropout 0.1"
# With data parallelism the dropout masks follow the local micro-batch index (as in Megatron), so
# DP layouts compare without dropout.
gpt2nd="$common --global-batch-size 16 --num-layers 4 --hidden-dropout 0"
llama="$common --global-batch-size 16 --num-layers 8 --hidden-dropout 0 --normalization RMSNorm --swiglu
  --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights
  --group-query-attention --num-query-groups 2"

min_lines=3
. "$(dirname "$0")/compare_logs.sh"  # values, compare_one
use_test_platform  # MG_TEST_PLATFORM=cuda: every run on the GPU (compare_logs.sh)
compare() {
  compare_one "$1" "$2" "$3" "lm loss" 2e-6 0
  compare_one "$1" "$2" "$3" "grad norm" 0 2e-3
}
run() {  # run <log> <np> <model args> <extra args...>: also checks the layout of its start-up lines
  log=$1; n=$2; model=$3; shift 3
  "$mpi" $mpi_args -np "$n" "$bin" $model "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
  expect_layout "$log" "$n" $model "$@"
}
refused() {  # refused <np> <expected message> <args...>
  n=$1; msg=$2; shift 2
  if "$mpi" $mpi_args -np "$n" "$bin" "$@" > "$work/bad.log" 2>&1; then
    echo "FAIL: not refused: $*"; cat "$work/bad.log"; exit 1
  fi
  grep -q -- "$msg" "$work/bad.log" || { echo "FAIL: no '$msg'"; cat "$work/bad.log"; exit 1; }
  echo "ok refused: $msg"
}

"$bin" $gpt2 > "$work/gpt2.log" 2>&1 || { cat "$work/gpt2.log"; exit 1; }
"$bin" $llama > "$work/llama.log" 2>&1 || { cat "$work/llama.log"; exit 1; }
if [ "$np" -ge 4 ]; then
  "$bin" $gpt2nd > "$work/gpt2nd.log" 2>&1 || { cat "$work/gpt2nd.log"; exit 1; }
fi
if [ "$np" -eq 2 ]; then
  run "$work/x.log" 2 "$gpt2" --pipeline-model-parallel-size 2
  compare "$work/gpt2.log" "$work/x.log" "GPT-2 PP 2 (1F1B)"
  grep -q "pipeline parallel: PP 2: rank 0 layers \[0, 2), rank 1 layers \[2, 4); 1F1B" "$work/x.log" \
    || { echo "FAIL: no pipeline summary"; cat "$work/x.log"; exit 1; }
  run "$work/x.log" 2 "$gpt2" --pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2
  compare "$work/gpt2.log" "$work/x.log" "GPT-2 PP 2 x VP 2 (interleaved)"
  run "$work/x.log" 2 "$gpt2" --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1
  compare "$work/gpt2.log" "$work/x.log" "GPT-2 PP 2 uneven (1 + 3 layers)"
  run "$work/x.log" 2 "$llama" --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2
  compare "$work/llama.log" "$work/x.log" "LLaMA PP 2 x VP 2 (interleaved)"
  # Checkpoints (sharded format, keyed by global names): PP 2 saves at iteration 2 (the last
  # stage's tied embedding copy is a replica, not written twice) and resumes at PP 2, and at PP 1
  # (another layout: resharded by name).
  run "$work/first.log" 2 "$gpt2" --pipeline-model-parallel-size 2 --save "$work/ckpt" \
    --save-interval 2 --exit-interval 2
  run "$work/second.log" 2 "$gpt2" --pipeline-model-parallel-size 2 --load "$work/ckpt"
  cat "$work/first.log" "$work/second.log" > "$work/resumed.log"
  compare "$work/gpt2.log" "$work/resumed.log" "GPT-2 PP 2 save at 2 + resume at PP 2"
  "$bin" $gpt2 --load "$work/ckpt" > "$work/second.log" 2>&1 || { cat "$work/second.log"; exit 1; }
  cat "$work/first.log" "$work/second.log" > "$work/resumed.log"
  compare "$work/gpt2.log" "$work/resumed.log" "GPT-2 PP 2 save at 2 + resume at PP 1"
  refused 2 "legacy does not support pipeline parallelism" \
    $gpt2 --pipeline-model-parallel-size 2 --save "$work/ckpt2" --ckpt-format legacy
  refused 2 "--num-layers 31 is not divisible by --pipeline-model-parallel-size 2" \
    $common --num-layers 31 --pipeline-model-parallel-size 2
  refused 2 "micro-batches (3 = global batch" \
    $common --num-layers 4 --pipeline-model-parallel-size 2 \
    --virtual-pipeline-model-parallel-size 2 --global-batch-size 6
elif [ "$np" -eq 4 ]; then
  run "$work/x.log" 4 "$gpt2" --pipeline-model-parallel-size 4
  compare "$work/gpt2.log" "$work/x.log" "GPT-2 PP 4 (1F1B)"
  run "$work/x.log" 4 "$gpt2" --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 \
    --sequence-parallel
  compare "$work/gpt2.log" "$work/x.log" "GPT-2 PP 2 x TP 2 + SP"
  run "$work/x.log" 4 "$gpt2nd" --pipeline-model-parallel-size 2 --use-distributed-optimizer
  compare "$work/gpt2nd.log" "$work/x.log" "GPT-2 PP 2 x DP 2 + distributed optimizer"
  run "$work/x.log" 4 "$gpt2nd" --pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2 \
    --use-distributed-optimizer
  compare "$work/gpt2nd.log" "$work/x.log" "GPT-2 PP 2 x VP 2 x DP 2 + distributed optimizer"
  # PP 2 x DP 2 with the distributed optimizer saves at 2; PP 4 resumes (resharded by name).
  run "$work/first.log" 4 "$gpt2nd" --pipeline-model-parallel-size 2 --use-distributed-optimizer \
    --save "$work/ckpt" --save-interval 2 --exit-interval 2
  run "$work/second.log" 4 "$gpt2nd" --pipeline-model-parallel-size 4 --load "$work/ckpt"
  cat "$work/first.log" "$work/second.log" > "$work/resumed.log"
  compare "$work/gpt2nd.log" "$work/resumed.log" "GPT-2 PP 2 x DP 2 save at 2 + resume at PP 4"
  run "$work/x.log" 4 "$llama" --pipeline-model-parallel-size 4 --virtual-pipeline-model-parallel-size 2
  compare "$work/llama.log" "$work/x.log" "LLaMA PP 4 x VP 2 (interleaved)"
  run "$work/x.log" 4 "$llama" --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 1 \
    --decoder-last-pipeline-num-layers 3
  compare "$work/llama.log" "$work/x.log" "LLaMA PP 4 uneven (1 + 2 + 2 + 3 layers)"
else
  run "$work/x.log" "$np" "$gpt2nd" --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 \
    --sequence-parallel --use-distributed-optimizer
  compare "$work/gpt2nd.log" "$work/x.log" "GPT-2 PP 2 x TP 2 x DP $((np / 4)) + SP + distributed optimizer"
  run "$work/x.log" "$np" "$gpt2nd" --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 \
    --sequence-parallel --use-distributed-optimizer --virtual-pipeline-model-parallel-size 2
  compare "$work/gpt2nd.log" "$work/x.log" "GPT-2 PP 2 x VP 2 x TP 2 x DP $((np / 4)) (interleaved)"
  run "$work/x.log" "$np" "$llama" --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 \
    --use-distributed-optimizer
  compare "$work/llama.log" "$work/x.log" "LLaMA PP 2 x TP 2 x DP $((np / 4)) + distributed optimizer"
fi
