#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root: pretrain_gpt's whole training step on the
# CUDA platform, with the bundle of scripts/gpu_bundle.sh and the demo's tokenized corpus.
#   1. the `make demo` model and data, f32, 20 iterations, one log line per iteration (compare the
#      losses with the same command on the CPU: benchmarks/results/*-h100-training.md)
#   2. the same model in bf16, 330 iterations: uninterrupted, and 150 + save + load + 180 (resume)
#   3. GPT-2 124M shapes (12 x 768, seq 1024, vocab 50257 padded to 50304), bf16, mock data:
#      step time and tokens/s of the current kernels
# Data: ${MG_GPU_DATA:-.gpu_data}/kjv_text_document.{bin,idx} and kjv_spm.model, copied from
# <build>/demo after `make demo` (carry the folder). Logs go to ${OUT:-/tmp/gpu_out}.
#   bash scripts/gpu_run_training.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
source scripts/gpu_env.sh
data=${MG_GPU_DATA:-.gpu_data}
bin=.gpu_bundle/bin/pretrain_gpt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/device.txt" 2>&1
demo=(
  --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128
  --max-position-embeddings 128 --micro-batch-size 16 --global-batch-size 16
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --weight-decay 0.01
  --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0 --seed 1234
  --data-path "$data/kjv_text_document" --split 98,2,0 --data-cache-path /tmp/mg_cache
  --tokenizer-type SentencePieceTokenizer --tokenizer-model "$data/kjv_spm.model"
)
status=0
echo "== 1. demo model, f32, 20 iterations on cuda =="
"$bin" --platform cuda "${demo[@]}" --lr-warmup-iters 5 --train-iters 20 --log-interval 1 --eval-interval 1000 \
  --eval-iters 1 > "$out/cuda_f32_20.log" 2>&1 || status=1
grep -E "platform|lm loss:" "$out/cuda_f32_20.log" | tail -3

echo "== 2. demo model, bf16, 330 iterations, and 150 + save + load + 180 =="
common=("${demo[@]}" --lr-warmup-iters 20 --bf16 --train-iters 330 --log-interval 30 --eval-interval 150 --eval-iters 4)
"$bin" --platform cuda "${common[@]}" > "$out/cuda_bf16_330.log" 2>&1 || status=1
rm -rf /tmp/mg_ckpt
"$bin" --platform cuda "${common[@]}" --save /tmp/mg_ckpt --save-interval 150 --exit-interval 150 \
  > "$out/cuda_bf16_resume.log" 2>&1 || status=1
"$bin" --platform cuda "${common[@]}" --load /tmp/mg_ckpt >> "$out/cuda_bf16_resume.log" 2>&1 || status=1
grep -E "lm loss:" "$out/cuda_bf16_330.log" | tail -1
grep -E "lm loss:" "$out/cuda_bf16_resume.log" | tail -1

echo "== 3. GPT-2 124M shapes, bf16, mock data =="
"$bin" --platform cuda --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 \
  --max-position-embeddings 1024 --micro-batch-size 8 --global-batch-size 8 --bf16 --lr 6e-4 \
  --train-iters 12 --log-interval 1 --eval-interval 1000 --eval-iters 1 --mock-data \
  --tokenizer-type NullTokenizer --vocab-size 50257 --seed 1234 > "$out/cuda_gpt2_124m.log" 2>&1 || status=1
grep -E "lm loss:" "$out/cuda_gpt2_124m.log" | tail -2
exit $status
