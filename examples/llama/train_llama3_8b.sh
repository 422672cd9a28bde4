#!/usr/bin/env bash
# LLaMA-3 8B pretraining with the flags of Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh
# (8 GPUs: TP 1 x CP 2 x DP 4, mock data with NullTokenizer, distributed optimizer with overlapped
# communication), in bf16. Left out, each refused here with an error naming it (docs/flags.md):
# --decoupled-lr / --decoupled-min-lr, --grad-reduce-in-bf16, --fp8-param-gather (FP8 parameters:
# not built). The rest of the FP8 set runs (docs/fp8.md; the CPU platform emulates it exactly).
# --attention-backend fused is cuDNN's fused attention on a CUDA build; on the CPU our kernels.
# TOY=1 keeps every flag and shrinks the shape (2 layers, hidden 64, 2 ranks = CP 2).
#   examples/llama/train_llama3_8b.sh [extra pretrain_gpt flags...]
set -euo pipefail
. "$(dirname "$0")/../common.sh"
NP=8 LAYERS=32 HIDDEN=4096 FFN=14336 HEADS=32 GROUPS=8 KV=128 SEQ=8192 VOCAB=128256 GBS=128
SAMPLES=1953125000 DECAY=1949218748 WARMUP=3906252
if [ "$TOY" = 1 ]; then
  NP=2 LAYERS=2 HIDDEN=64 FFN=224 HEADS=4 GROUPS=2 KV=16 SEQ=64 VOCAB=1000 GBS=4
  SAMPLES=16 DECAY=16 WARMUP=4
fi
MODEL_ARGS=(
  --use-mcore-models --num-layers $LAYERS --hidden-size $HIDDEN --ffn-hidden-size $FFN
  --num-attention-heads $HEADS --group-query-attention --num-query-groups $GROUPS
  --kv-channels $KV --seq-length $SEQ --max-position-embeddings $SEQ
  --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0
  --attention-dropout 0.0 --hidden-dropout 0.0 --swiglu --init-method-std 0.0134
  --attention-backend fused --apply-layernorm-1p --untie-embeddings-and-output-weights
  --disable-bias-linear --normalization RMSNorm --transformer-impl transformer_engine
)
TRAINING_ARGS=(
  --micro-batch-size 1 --global-batch-size $GBS --train-samples $SAMPLES
  --lr-decay-samples $DECAY --lr-warmup-samples $WARMUP --lr 0.00015 --min-lr 0.00001
  --lr-decay-style cosine --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95
  --bf16 --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc
  --empty-unused-memory-level 1 --exit-duration-in-mins 235
  --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max
)
MODEL_PARALLEL_ARGS=(--tensor-model-parallel-size 1 --context-parallel-size 2 --sequence-parallel)
DDP_ARGS=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size $VOCAB --split 99,1,0)
EVAL_AND_LOGGING_ARGS=(
  --log-interval 1 --eval-iters 2 --eval-interval 100 --save-interval 1000 --log-throughput
  --save "$WORK/checkpoints" --load "$WORK/checkpoints" --ckpt-format sharded
)
launch $NP "$MG_BIN/pretrain_gpt" "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" \
  "${MODEL_PARALLEL_ARGS[@]}" "${DDP_ARGS[@]}" "${DATA_ARGS[@]}" "${EVAL_AND_LOGGING_ARGS[@]}" "$@"
