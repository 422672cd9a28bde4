#!/bin/sh
# pretrain_gpt with context parallelism under mpirun prints the same lm loss and grad norm values
# as the single-rank run (same seed, same global batch). np 2: CP 2 with the p2p ring, the
# all-gather and the all-to-all (Ulysses) variants, GPT-2-like (learned positions) and LLaMA-like
# (RoPE: the positions must follow each chunk's real positions; GQA, SwiGLU, RMSNorm), and packed
# documents of 2-9 tokens (a dataset made here with preprocess_data; --reset-attention-mask
# --reset-position-ids --eod-mask-loss: per-document masks across chunks, unequal token counts per
# CP rank). np 4: CP 4 (p2p, all-gather, a2a, documents), CP 2 x TP 2 (+ SP; p2p, all-gather,
# a2a), CP 2 x DP 2 with the distributed optimizer, CP 2 x PP 2 (p2p with documents, allgather
# with the tied embedding).
# usage: pretrain_gpt_cp.sh <pretrain_gpt> <np> <mpiexec> [mpiexec args...]
# (CTest label `mpi`; tests/CMakeLists.txt.) lm loss to 2e-6 relative (f32 round-off: partial
# attention results merge in another order); grad norm (3 decimals printed) to 2e-3.
set -eu
bin=$1; np=$2; shift 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 4
  --lr 1e-3 --tokenizer-type NullTokenizer --vocab-size 301
  --make-vocab-size-divisible-by 4 --log-interval 1 --eval-iters 0 --hidden-dropout 0
  --attention-dropout 0 --seed 7"
mock="--mock-data"
llama="--position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention
  --num-query-groups 2 --disable-bias-linear --untie-embeddings-and-output-weights"
# Short documents (2-9 token ids each, a fixed LCG) so that 16-token sequences pack several.
awk 'BEGIN { x = 7; for (d = 0; d < 400; d++) { x = (x * 1103515245 + 12345) % 2147483648;
  n = 2 + x % 8; line = ""; for (i = 0; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648;
  line = line (i ? " " : "") (1 + x % 299) } printf "{\"text\": \"%s\"}\n", line } }' \
  > "$work/docs.jsonl"
"$(dirname "$bin")/preprocess_data" --input "$work/docs.jsonl" --output-prefix "$work/docs" \
  --tokenizer-type NullTokenizer --vocab-size 301 --append-eod --workers 1 > "$work/pre.log" 2>&1 \
  || { cat "$work/pre.log"; exit 1; }
docs_data="--data-path $work/docs_text_document --data-cache-path $work/cache --split 100,0,0"
docs="$docs_data --reset-attention-mask --reset-position-ids --eod-mask-loss"

. "$(dirname "$0")/compare_logs.sh"  # values, compare_one
use_test_platform  # MG_TEST_PLATFORM=cuda: every run on the GPU (compare_logs.sh)
single() {  # single <name> <extra args...>: the one-rank reference, run once
  name=$1; shift
  [ -f "$work/$name.log" ] || "$bin" $args "$@" > "$work/$name.log" 2>&1 \
    || { cat "$work/$name.log"; exit 1; }
}
# check <reference name> <np> <what> <extra args...>: the parallel run shows the layout asked for
# and equals the reference.
check() {
  ref=$1; n=$2; what=$3; shift 3
  "$mpi" $mpi_args -np "$n" "$bin" $args "$@" > "$work/run.log" 2>&1 \
    || { cat "$work/run.log"; exit 1; }
  expect_layout "$work/run.log" "$n" $args "$@"
  compare_one "$work/$ref.log" "$work/run.log" "$what" "lm loss" 2e-6 0
  compare_one "$work/$ref.log" "$work/run.log" "$what" "grad norm" 0 2e-3
}
mpi=$1; shift; mpi_args="$*"

single gpt $mock
single llama $mock $llama
single docs $llama $docs
# The documents matter (the reference differs from the same data without their masks).
single nodocs $llama $docs_data
values "$work/docs.log" "lm loss" > "$work/a"; values "$work/nodocs.log" "lm loss" > "$work/b"
if cmp -s "$work/a" "$work/b"; then echo "FAIL: document masks changed nothing"; exit 1; fi
if [ "$np" -eq 2 ]; then
  check gpt 2 "CP 2 p2p" $mock --context-parallel-size 2
  check gpt 2 "CP 2 allgather" $mock --context-parallel-size 2 --cp-comm-type allgather
  check llama 2 "CP 2 p2p LLaMA" $mock $llama --context-parallel-size 2
  check docs 2 "CP 2 p2p documents" $llama $docs --context-parallel-size 2
  check docs 2 "CP 2 allgather documents" $llama $docs --context-parallel-size 2 \
    --cp-comm-type allgather
  check gpt 2 "CP 2 a2a" $mock --context-parallel-size 2 --cp-comm-type a2a
  check docs 2 "CP 2 a2a documents" $llama $docs --context-parallel-size 2 --cp-comm-type a2a
  # Refused before any work: a sequence length CP does not divide, heads a2a cannot split.
  if "$bin" $args $mock --context-parallel-size 3 > "$work/bad.log" 2>&1; then
    echo "FAIL: --seq-length 16 with --context-parallel-size 3 was accepted"; exit 1
  fi
  grep -q "must be divisible by 2 x --context-parallel-size = 6" "$work/bad.log" \
    || { cat "$work/bad.log"; exit 1; }
  if "$bin" $args $mock $llama --context-parallel-size 4 --cp-comm-type a2a > "$work/bad.log" 2>&1
  then
    echo "FAIL: a2a with 2 query groups over CP 4 was accepted"; exit 1
  fi
  grep -q "2 query groups per TP rank must be divisible by --context-parallel-size 4" \
    "$work/bad.log" || { cat "$work/bad.log"; exit 1; }
  echo "ok --seq-length 16 with CP 3 and a2a with 2 groups over CP 4 refused"
else
  check gpt "$np" "CP 4 p2p" $mock --context-parallel-size 4
  check gpt "$np" "CP 4 allgather" $mock --context-parallel-size 4 --cp-comm-type allgather
  check gpt "$np" "CP 4 a2a" $mock --context-parallel-size 4 --cp-comm-type a2a
  check docs "$np" "CP 4 p2p documents" $llama $docs --context-parallel-size 4
  check llama "$np" "CP 2 x TP 2 p2p + SP" $mock $llama --context-parallel-size 2 \
    --tensor-model-parallel-size 2 --sequence-parallel
  check gpt "$np" "CP 2 x TP 2 allgather" $mock --context-parallel-size 2 \
    --tensor-model-parallel-size 2 --cp-comm-type allgather
  check gpt "$np" "CP 2 x TP 2 a2a + SP" $mock --context-parallel-size 2 \
    --tensor-model-parallel-size 2 --sequence-parallel --cp-comm-type a2a
  check docs "$np" "CP 2 x DP 2 + distributed optimizer" $llama $docs --context-parallel-size 2 \
    --use-distributed-optimizer
  # With pipeline parallelism: the stages exchange the CP-local [2 S / (2 CP), B, H] chunks.
  check docs "$np" "CP 2 x PP 2 p2p documents" $llama $docs --context-parallel-size 2 \
    --pipeline-model-parallel-size 2
  check gpt "$np" "CP 2 x PP 2 allgather (tied embedding)" $mock --context-parallel-size 2 \
    --pipeline-model-parallel-size 2 --cp-comm-type allgather
fi
