#!/usr/bin/env bash
# Mixtral 8x7B pretraining, the flags of Megatron-LM's
# examples/mixtral/train_mixtral_8x7b_distributed.sh (8 experts, top-2, aux loss, alltoall
# dispatcher, expert parallel 8, pipeline 4, the distributed optimizer: dense parameters sharded
# over DP, experts over the expert data-parallel group). TOY=1 keeps every flag: 2 ranks = EP 2 x
# PP 1, 8 experts, 2 layers, hidden 64, GQA 4 heads / 2 groups.
#   examples/mixtral/train_mixtral_8x7b_distributed.sh [extra pretrain_gpt flags...]
set -euo pipefail
. "$(dirname "$0")/../common.sh"
NP=32; EP=8; PP=4; TP=1; EXPERTS=8; LAYERS=32; HIDDEN=4096; FFN=14336; HEADS=32; GROUPS=8
SEQ=4096; VOCAB=32000; MBS=1; GBS=256; ITERS=500000
if [ "$TOY" = 1 ]; then
  NP=2; EP=2; PP=1; EXPERTS=8; LAYERS=2; HIDDEN=64; FFN=128; HEADS=4; GROUPS=2; SEQ=32
  VOCAB=1000; MBS=2; GBS=8; ITERS=4
fi
MODEL_ARGS=(
  --use-mcore-models --disable-bias-linear --seq-length $SEQ --max-position-embeddings $SEQ
  --num-layers $LAYERS --hidden-size $HIDDEN --ffn-hidden-size $FFN --num-attention-heads $HEADS
  --init-method-std 0.01 --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm
  --position-embedding-type rope --swiglu --untie-embeddings-and-output-weights
  --group-query-attention --num-query-groups $GROUPS --no-masked-softmax-fusion
  --no-position-embedding --rotary-base 1000000
)
MOE_ARGS=(
  --num-experts $EXPERTS --moe-router-topk 2 --moe-router-load-balancing-type aux_loss
  --moe-aux-loss-coeff 1e-2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall
)
DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size $VOCAB --split 99990,8,2)
TRAINING_ARGS=(
  --micro-batch-size $MBS --global-batch-size $GBS --lr 1e-4 --train-iters $ITERS
  --lr-decay-iters $ITERS --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1
  --lr-warmup-iters 2 --clip-grad 1.0 --bf16 --overlap-grad-reduce --overlap-param-gather
)
MODEL_PARALLEL_ARGS=(
  --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP
  --expert-model-parallel-size $EP --sequence-parallel --use-distributed-optimizer
)
LOGGING_ARGS=(
  --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 2
  --save "$WORK/checkpoints" --load "$WORK/checkpoints"
)
launch $NP "$MG_BIN/pretrain_gpt" "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${DATA_ARGS[@]}" \
  "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${LOGGING_ARGS[@]}" "$@"
