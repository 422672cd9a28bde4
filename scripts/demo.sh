#!/usr/bin/env bash
# `make demo`: train a small GPT on real text, end to end, in a few minutes on a laptop CPU (or on
# the GPU when one is present: the runtime picks cuda > cpu).
#   1. corpus: the King James Bible from Debian's bible-kjv package, one JSONL document per chapter
#   2. tokenizer: a SentencePiece BPE model trained on it with Debian's spm_train
#   3. preprocess_data: JSONL -> Megatron .bin/.idx
#   4. pretrain_gpt: a 2-layer GPT, loss falling from ln(vocab) to well under half of it, with
#      validation loss, and a checkpoint saved under <build>/demo/checkpoints
#   5. resume: one more stretch loaded from that checkpoint (exact resume)
#   then: generate prints text sampled from the trained model (greedy and top-k/top-p)
# Installs bible-kjv and sentencepiece when missing (root or sudo). Outputs go to <build>/demo/.
set -euo pipefail
build=${1:-build}
work="$build/demo"
mkdir -p "$work"

need=()
command -v bible >/dev/null || need+=(bible-kjv)
command -v spm_train >/dev/null || need+=(sentencepiece)
if [ ${#need[@]} -gt 0 ]; then
  echo "demo: installing ${need[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "demo: need root or sudo to install ${need[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

echo "== 1/5 corpus: King James Bible (Debian bible-kjv), one document per chapter =="
# `bible` prints "Book N" headers after a blank line, verses as "  N text" wrapped at 80 columns.
bible Gen1:1-Rev22:21 | awk '
  function flush() {
    if (doc != "") {
      gsub(/\\/, "\\\\", doc); gsub(/"/, "\\\"", doc)
      printf "{\"text\": \"%s\"}\n", doc
      print doc > txt
    }
    doc = ""
  }
  prev == "" && /^[^ ].* [0-9]+$/ { flush(); prev = $0; next }
  /^$/ { prev = ""; next }
  { line = $0; sub(/^ +[0-9]+ /, "", line); doc = (doc == "" ? line : doc " " line); prev = $0 }
  END { flush() }' txt="$work/kjv.txt" > "$work/kjv.jsonl"
echo "$(wc -l < "$work/kjv.jsonl") documents, $(wc -c < "$work/kjv.txt") bytes -> $work/kjv.jsonl"

echo "== 2/5 tokenizer: SentencePiece BPE (spm_train), vocabulary 2000 =="
if [ ! -f "$work/kjv_spm.model" ]; then
  spm_train --input="$work/kjv.txt" --model_prefix="$work/kjv_spm" --vocab_size=2000 \
    --model_type=bpe --character_coverage=1.0 --num_threads=2 --minloglevel=2 >/dev/null 2>&1
fi
echo "$work/kjv_spm.model"

echo "== 3/5 preprocess_data: JSONL -> Megatron .bin/.idx =="
"$build/bin/preprocess_data" --input "$work/kjv.jsonl" --output-prefix "$work/kjv" \
  --tokenizer-type SentencePieceTokenizer --tokenizer-model "$work/kjv_spm.model" \
  --append-eod --workers 2 --log-interval 100000 | tail -n 2

echo "== 4/5 pretrain_gpt: a 2-layer GPT on the CPU (or GPU), 300 iterations =="
rm -rf "$work/checkpoints"
common=(
  --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128
  --max-position-embeddings 128 --micro-batch-size 16 --global-batch-size 16
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 20 --weight-decay 0.01
  --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0 --seed 1234
  --data-path "$work/kjv_text_document" --split 98,2,0 --data-cache-path "$work/cache"
  --tokenizer-type SentencePieceTokenizer --tokenizer-model "$work/kjv_spm.model"
  --train-iters 330 --log-interval 30 --eval-interval 150 --eval-iters 4
  --save "$work/checkpoints" --save-interval 150
)
"$build/bin/pretrain_gpt" "${common[@]}" --exit-interval 300 | tee "$work/train.log"

echo "== 5/5 resume from the checkpoint at iteration 300 and finish (exact resume) =="
"$build/bin/pretrain_gpt" "${common[@]}" --load "$work/checkpoints" | tee -a "$work/train.log" |
  grep -E "loaded|iteration  *3[0-9][0-9]/|saved"
echo
awk -F'lm loss: ' '/ iteration .*lm loss: / { split($2, v, " "); if (first == "") first = v[1]; last = v[1] }
  END { printf "training loss: %.3f (first log line) -> %.3f (last); uniform over 2000 tokens: %.3f\n",
        first, last, log(2000) }' "$work/train.log"
echo "checkpoints: $(ls -d "$work"/checkpoints/iter_* | xargs -n1 basename | tr '\n' ' ')"
echo "latest: $(cat "$work/checkpoints/latest_checkpointed_iteration.txt")"

echo
echo "== generate: a sample from the trained model (KV cache; greedy, then top-k/top-p sampling) =="
"$build/bin/generate" --load "$work/checkpoints" --prompt "And God said" --max-new-tokens 32 \
  --greedy
"$build/bin/generate" --load "$work/checkpoints" --prompt "In the beginning" --max-new-tokens 48 \
  --temperature 0.8 --top-k 40 --top-p 0.95 --seed 1234
