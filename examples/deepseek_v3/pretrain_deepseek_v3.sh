#!/usr/bin/env bash
# DeepSeek-V3-shaped MoE pretraining with Megatron-LM's DeepSeek-V3 router flags (its MoE
# README's recipe): 256 routed experts, top-8 with sigmoid scores, group-limited routing (8 groups,
# 4 chosen), probabilities scaled by 2.5, aux-loss-free load balancing (expert bias, update rate
# 1e-3) plus a small sequence-level aux loss, one shared expert, the first 3 layers dense,
# alltoall dispatcher, EP 64 x PP 16.
# Left out: multi-latent attention and multi-token prediction (refused here: docs/flags.md), so the
# attention is GQA; --moe-layer-freq is given as a list instead of Megatron's Python expression.
# TOY=1 keeps every routing flag: 2 ranks = EP 2, 16 experts top-4 in 4 groups (2 chosen), 3 layers
# (the first dense), hidden 64; it saves at the end, so the expert biases reach the checkpoint.
#   examples/deepseek_v3/pretrain_deepseek_v3.sh [extra pretrain_gpt flags...]
set -euo pipefail
. "$(dirname "$0")/../common.sh"
NP=1024; EP=64; PP=16; TP=1; EXPERTS=256; TOPK=8; NGROUPS=8; GROUP_TOPK=4; LAYERS=61
HIDDEN=7168; FFN=18432; MOE_FFN=2048; SHARED=2048; HEADS=128; GROUPS=128; SEQ=4096
VOCAB=129280; MBS=1; GBS=8192; ITERS=500000
FREQ="[$(printf '0,%.0s' 1 2 3)$(printf '1,%.0s' $(seq 1 57))1]"
if [ "$TOY" = 1 ]; then
  NP=2; EP=2; PP=1; EXPERTS=16; TOPK=4; NGROUPS=4; GROUP_TOPK=2; LAYERS=3; HIDDEN=64; FFN=128
  MOE_FFN=32; SHARED=32; HEADS=4; GROUPS=2; SEQ=32; VOCAB=1000; MBS=2; GBS=8; ITERS=4
  FREQ="[0,1,1]"
fi
MODEL_ARGS=(
  --use-mcore-models --disable-bias-linear --seq-length $SEQ --max-position-embeddings $SEQ
  --num-layers $LAYERS --hidden-size $HIDDEN --ffn-hidden-size $FFN --num-attention-heads $HEADS
  --init-method-std 0.006 --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm
  --norm-epsilon 1e-6 --position-embedding-type rope --rotary-base 10000 --swiglu
  --untie-embeddings-and-output-weights --group-query-attention --num-query-groups $GROUPS
  --no-position-embedding
)
MOE_ARGS=(
  --num-experts $EXPERTS --moe-layer-freq "$FREQ" --moe-ffn-hidden-size $MOE_FFN
  --moe-shared-expert-intermediate-size $SHARED --moe-router-topk $TOPK
  --moe-router-score-function sigmoid --moe-router-num-groups $NGROUPS
  --moe-router-group-topk $GROUP_TOPK --moe-router-topk-scaling-factor 2.5
  --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-3
  --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4
  --moe-router-dtype fp32 --moe-token-dispatcher-type alltoall --moe-grouped-gemm
  --moe-per-layer-logging
)
DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size $VOCAB --split 99990,8,2)
TRAINING_ARGS=(
  --micro-batch-size $MBS --global-batch-size $GBS --lr 1e-4 --train-iters $ITERS
  --lr-decay-iters $ITERS --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1
  --lr-warmup-iters 2 --clip-grad 1.0 --bf16 --overlap-grad-reduce
)
MODEL_PARALLEL_ARGS=(
  --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP
  --expert-model-parallel-size $EP
)
LOGGING_ARGS=(
  --log-interval 1 --save-interval $ITERS --eval-interval 1000 --eval-iters 2
  --save "$WORK/checkpoints" --load "$WORK/checkpoints"
)
launch $NP "$MG_BIN/pretrain_gpt" "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${DATA_ARGS[@]}" \
  "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${LOGGING_ARGS[@]}" "$@"
