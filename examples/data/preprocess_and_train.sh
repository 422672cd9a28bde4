#!/usr/bin/env bash
# Megatron's data workflow: tools/preprocess_data.py on JSONL (GPT-2 BPE, --append-eod) writes
# <prefix>_text_document.{bin,idx}; two such corpora are blended 0.7/0.3 with --split 99,1,0,
# the dataset indices cached in --data-cache-path, read by --num-workers loader threads with
# --dataloader-type cyclic. A second run reuses the cache (no index is rebuilt).
#   examples/data/preprocess_and_train.sh VOCAB_JSON MERGES_TXT [INPUT_A.jsonl INPUT_B.jsonl]
# Without inputs, two small JSONL files are written (TOY=1 uses those and 1 rank).
set -euo pipefail
. "$(dirname "$0")/../common.sh"
vocab=$1 merges=$2
a=${3:-} b=${4:-}
if [ -z "$a" ]; then
  a=$WORK/a.jsonl b=$WORK/b.jsonl
  for i in $(seq 1 200); do
    echo "{\"text\": \"Document $i of corpus A: the quick brown fox jumps over the lazy dog.\"}"
  done > "$a"
  for i in $(seq 1 120); do
    echo "{\"text\": \"Corpus B, entry $i. Pack my box with five dozen liquor jugs!\"}"
  done > "$b"
fi
NP=8
[ "$TOY" = 1 ] && NP=1
for c in a b; do
  input=$a
  [ $c = b ] && input=$b
  "$MG_BIN/preprocess_data" --input "$input" --output-prefix "$WORK/corpus_$c" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$vocab" --merge-file "$merges" \
    --workers 2 --append-eod
done
ARGS=(
  --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64
  --max-position-embeddings 64 --micro-batch-size 2 --global-batch-size 8 --train-iters 6
  --lr 1e-3 --log-interval 1 --eval-interval 3 --eval-iters 1
  --data-path 0.7 "$WORK/corpus_a_text_document" 0.3 "$WORK/corpus_b_text_document"
  --split 99,1,0 --data-cache-path "$WORK/cache" --dataloader-type cyclic --num-workers 2
  --tokenizer-type GPT2BPETokenizer --vocab-file "$vocab" --merge-file "$merges"
)
launch $NP "$MG_BIN/pretrain_gpt" "${ARGS[@]}" | tee "$WORK/first.log"
ls "$WORK/cache" > "$WORK/cache_files"
launch $NP "$MG_BIN/pretrain_gpt" "${ARGS[@]}" | tee "$WORK/second.log"
ls "$WORK/cache" | diff "$WORK/cache_files" - \
  || { echo "the second run wrote other cache files" >&2; exit 1; }
echo "data: preprocessed, blended, cached in $WORK/cache and reused"
