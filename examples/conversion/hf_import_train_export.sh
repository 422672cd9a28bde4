#!/usr/bin/env bash
# Megatron Bridge's conversion workflow (convert_checkpoints.py import / export) with
# convert_checkpoint: a HuggingFace model directory is imported for TP 2, finetuned on 2 ranks
# (mpirun instead of torchrun), saved, and exported back to a HuggingFace directory.
#   examples/conversion/hf_import_train_export.sh HF_MODEL_DIR [OUT_HF_DIR]
set -euo pipefail
. "$(dirname "$0")/../common.sh"
hf=$1
out=${2:-$WORK/hf_export}
"$MG_BIN/convert_checkpoint" import --hf-dir "$hf" --save "$WORK/megatron" --tp 2
launch 2 "$MG_BIN/pretrain_gpt" --yaml-cfg "$WORK/megatron/model_args.yaml" \
  --load "$WORK/megatron" --finetune --mock-data --micro-batch-size 2 --global-batch-size 4 \
  --seq-length 32 --train-iters 3 --lr 1e-4 --log-interval 1 --eval-iters 0 \
  --save "$WORK/finetuned"
"$MG_BIN/convert_checkpoint" export --load "$WORK/finetuned" --hf-dir "$out"
ls "$out"
echo "conversion: imported, finetuned at TP 2, exported to $out"
