#!/usr/bin/env bash
# Megatron-Core's quick start (`torchrun --nproc_per_node=2 examples/run_simple_mcore_train_loop.py`)
# as a pretrain_gpt run: a GPT with tensor-parallel size 2 on mock data, 5 iterations, a sharded
# checkpoint saved, then loaded back and trained 5 more iterations.
#   examples/run_simple_mcore_train_loop.sh            (mpirun -np 2; see examples/common.sh)
set -euo pipefail
. "$(dirname "$0")/common.sh"
GPT_ARGS=(
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1
  --num-layers 2 --hidden-size 12 --num-attention-heads 4
  --seq-length 64 --max-position-embeddings 64
  --micro-batch-size 8 --global-batch-size 8 --lr 1e-3
  --mock-data --tokenizer-type NullTokenizer --vocab-size 100
  --log-interval 1 --eval-iters 0 --use-mcore-models --transformer-impl local
  --train-iters 10 --save "$WORK/ckpt"
)
# 5 iterations, then the checkpoint (--exit-interval saves and stops).
launch 2 "$MG_BIN/pretrain_gpt" "${GPT_ARGS[@]}" --exit-interval 5
# Loaded back: iterations 6 to 10 from the saved state.
launch 2 "$MG_BIN/pretrain_gpt" "${GPT_ARGS[@]}" --load "$WORK/ckpt"
echo "quick start: saved at iteration 5, loaded and trained to 10 in $WORK/ckpt"
