#!/bin/sh
# FP8 training (docs/fp8.md) end to end with pretrain_gpt on the CPU platform's exact emulation.
# usage: pretrain_gpt_fp8.sh <pretrain_gpt> <preprocess_data> <np> <mpiexec> [mpiexec args...]
# np 1:
#   track   the demo corpus (King James Bible, Debian bible-kjv; here Genesis as byte tokens
#           through NullTokenizer, vocabulary 256), a 2-layer GPT trained 300 iterations in BF16
#           and in FP8 (hybrid, delayed scaling). Tolerance: E4M3's unit roundoff u = 2^-4, the
#           largest relative error an FP8 cast adds to a GEMM operand. The FP8 curve must stay
#           within u of the BF16 curve on average over the 30 logged values and at the last one
#           (the mean of its 10 iterations), start within u of it (same weights), differ from it
#           (FP8 really ran) and learn (the last loss under 0.5 ln 256). A broken FP8 path (a
#           wrong scale_inv, a lost gradient, a transposed operand) moves the loss by O(1).
#           SKIPs (77) when Debian's `bible` is missing (scripts/install_deps.sh installs it).
#   resume  FP8 run saved at iteration 3 and resumed equals the uninterrupted run bit for bit
#           (the amax histories and scales travel in the checkpoint; a fresh state would restart
#           at scale 1 and change the losses), for delayed and tensorwise scaling; the FP8
#           checkpoint loads into a BF16 run (FP8 state ignored) and a BF16 one into an FP8 run.
#   fp8 dpa  --fp8-dot-product-attention: the start-up line, losses not those of the run without
#           it (within 2^-4), save/resume bit-exact (the attention scales in the checkpoint).
#   fp8 mha  --fp8-multi-head-attention: the start-up line, the first loss that of fp8 dpa, later
#           ones not (within 2^-4), save/resume bit-exact.
#   fp8 params  --fp8-param-gather (distributed optimizer): against the run without it (first
#           iteration bit for bit, later within 1e-3), save/resume bit-exact for both recipes, a
#           weights-only resume (the saved weights are the dequantised FP8 ones), into BF16.
# np 2 (f32 model, so TP partial sums are not rounded to bf16): TP 2 (SP off and on) and DP 2
#   FP8 runs against one rank; DP 2 with --fp8-param-gather against its one-rank run and, bit for
#   bit, against DP 2 without the flag (distributed optimizer, and Megatron FSDP ZeRO-3). The amaxes are reduced over the TP / DP ranks, so the scales, and
#   every FP8 cast of the first iterations, equal one rank's: the first loss within 2e-6 (f32
#   summation order, as pretrain_gpt_dp.sh). Later, a layout's other f32 summation order can put a
#   scaled value on the other side of an FP8 rounding boundary (one element of one operand moves by
#   one FP8 ulp); the losses stay within 1e-3 relative, and the start-up lines must show the layout
#   and "amax reduced over 2 rank(s)". TP 2 with SP and --fp8-dot-product-attention (and
#   --fp8-multi-head-attention) likewise.
set -eu
bin=$1; pre=$2; np=$3; shift 3
mpi=$1; shift; mpi_args="$*"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
. "$(dirname "$0")/compare_logs.sh"  # compare_one, expect_line, expect_layout

if [ "$np" -eq 1 ]; then
  # ---- resume (mock data) ----
  args="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
    --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 6
    --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 301
    --make-vocab-size-divisible-by 4 --log-interval 1 --eval-iters 0 --hidden-dropout 0
    --attention-dropout 0 --seed 7 --bf16"
  # resume_equal <what> <full log> <ckpt dir> <flags...>: saved at 3 and resumed, every loss and
  # grad norm of the uninterrupted run <full log>, bit for bit.
  resume_equal() {
    what=$1; full=$2; ck=$3; shift 3
    rm -rf "$ck"
    "$bin" $args "$@" --save "$ck" --save-interval 3 --exit-interval 3 > "$work/a.log" 2>&1 \
      || { cat "$work/a.log"; exit 1; }
    "$bin" $args "$@" --load "$ck" > "$work/b.log" 2>&1 || { cat "$work/b.log"; exit 1; }
    cat "$work/a.log" "$work/b.log" > "$work/resumed.log"
    compare_one "$full" "$work/resumed.log" "$what save at 3 + resume" "lm loss" 0 0
    compare_one "$full" "$work/resumed.log" "$what save at 3 + resume" "grad norm" 0 0
  }
  for recipe in delayed tensorwise; do
    f8="--fp8-format hybrid --fp8-recipe $recipe --fp8-amax-history-len 4 --fp8-amax-compute-algo max"
    "$bin" $args $f8 > "$work/full.log" 2>&1 || { cat "$work/full.log"; exit 1; }
    expect_line "$work/full.log" "fp8 $recipe" "^fp8: format hybrid .*recipe $recipe"
    resume_equal "fp8 $recipe" "$work/full.log" "$work/ck" $f8
  done
  # --fp8-dot-product-attention (the core attention in FP8): the start-up line counts the 2 FP8
  # core attentions, the losses differ from the run without it (the flag is read), and a save at
  # 3 + resume is bit-exact (the six attention scales per layer travel in the checkpoint).
  f8="--fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max"
  "$bin" $args $f8 --fp8-dot-product-attention > "$work/full.log" 2>&1 || { cat "$work/full.log"; exit 1; }
  expect_line "$work/full.log" "fp8 dpa" "^fp8: .*8 FP8 linears and 2 FP8 core attentions on this rank"
  "$bin" $args $f8 > "$work/nodpa.log" 2>&1 || { cat "$work/nodpa.log"; exit 1; }
  if [ "$(values "$work/nodpa.log" "lm loss" | md5sum)" = "$(values "$work/full.log" "lm loss" | md5sum)" ]; then
    echo "FAIL fp8 dpa: every loss equals the run without --fp8-dot-product-attention"; exit 1
  fi
  compare_one "$work/nodpa.log" "$work/full.log" "fp8 dpa vs without" "lm loss" 0.0625 0
  resume_equal "fp8 dpa" "$work/full.log" "$work/ck" $f8 --fp8-dot-product-attention
  # --fp8-multi-head-attention (TE's fp8_mha, implies the FP8 attention): the start-up line; the
  # first iteration's loss equals --fp8-dot-product-attention's (all scales 1: O at scale_O is the
  # byte linear_proj's own cast of the dequantised O makes), later ones do not (dO is one rounding
  # of the GEMM's f32 result, linear_proj's input scale is O's); save at 3 + resume bit-exact.
  "$bin" $args $f8 --fp8-multi-head-attention > "$work/mha.log" 2>&1 || { cat "$work/mha.log"; exit 1; }
  expect_line "$work/mha.log" "fp8 mha" \
    "^fp8: .*8 FP8 linears and 2 FP8 core attentions \(multi-head: O and dO in FP8 at linear_proj\) on this rank"
  if [ "$(values "$work/mha.log" "lm loss" | head -n 1)" != "$(values "$work/full.log" "lm loss" | head -n 1)" ]; then
    echo "FAIL fp8 mha: the first loss differs from --fp8-dot-product-attention's"; exit 1
  fi
  if [ "$(values "$work/mha.log" "lm loss" | md5sum)" = "$(values "$work/full.log" "lm loss" | md5sum)" ]; then
    echo "FAIL fp8 mha: every loss equals --fp8-dot-product-attention's"; exit 1
  fi
  compare_one "$work/full.log" "$work/mha.log" "fp8 mha vs dpa" "lm loss" 0.0625 0
  resume_equal "fp8 mha" "$work/mha.log" "$work/ckm" $f8 --fp8-multi-head-attention
  # The FP8 checkpoint into a BF16 run, and a BF16 checkpoint into an FP8 run.
  "$bin" $args --load "$work/ck" > "$work/bf16.log" 2>&1 || { cat "$work/bf16.log"; exit 1; }
  expect_line "$work/bf16.log" "bf16 from fp8" "successfully loaded checkpoint .* at iteration +3"
  expect_no_line "$work/bf16.log" "bf16 from fp8" "^fp8:"
  rm -rf "$work/ck16"
  "$bin" $args --save "$work/ck16" --save-interval 3 --exit-interval 3 > "$work/c.log" 2>&1 \
    || { cat "$work/c.log"; exit 1; }
  "$bin" $args --fp8-format hybrid --load "$work/ck16" > "$work/d.log" 2>&1 \
    || { cat "$work/d.log"; exit 1; }
  expect_line "$work/d.log" "fp8 from bf16" "successfully loaded checkpoint .* at iteration +3"

  # ---- --fp8-param-gather (distributed optimizer, bf16 model) ----
  # The FP8 weights are cast from the f32 master weights after each step instead of from the
  # bf16 weights in the forward. Step 1 casts the initial weights, which are bf16 values, with
  # scale 1: the first loss and grad norm equal the run without the flag bit for bit. Later the
  # two roundings (f32 -> FP8 against f32 -> bf16 -> FP8) put some weight elements one FP8 step
  # apart (fp8_param_test): the losses differ (the masters are really cast), within 1e-3 relative.
  pg="--use-distributed-optimizer --fp8-param-gather"
  for recipe in delayed tensorwise; do
    f8="--fp8-format hybrid --fp8-recipe $recipe --fp8-amax-history-len 4 --fp8-amax-compute-algo max"
    "$bin" $args $f8 > "$work/ref.log" 2>&1 || { cat "$work/ref.log"; exit 1; }
    "$bin" $args $f8 $pg > "$work/full.log" 2>&1 || { cat "$work/full.log"; exit 1; }
    expect_line "$work/full.log" "fp8 params $recipe" \
      "^fp8 parameters \(--fp8-param-gather\): [0-9]+ elements in 1 run\(s\), fp8_e4m3 \(1 byte each\), all-gathered in 1 bucket"
    for v in "lm loss" "grad norm"; do
      a=$(values "$work/ref.log" "$v" | head -n 1); b=$(values "$work/full.log" "$v" | head -n 1)
      [ "$a" = "$b" ] || { echo "FAIL fp8 params $recipe: first $v $a vs $b"; exit 1; }
    done
    compare_one "$work/ref.log" "$work/full.log" "fp8 params $recipe vs without" "lm loss" 1e-3 0
    if [ "$(values "$work/ref.log" "lm loss" | md5sum)" = "$(values "$work/full.log" "lm loss" | md5sum)" ]; then
      echo "FAIL fp8 params $recipe: every loss equals the run without the flag (masters not cast)"; exit 1
    fi
    echo "ok fp8 params $recipe: first iteration identical, later within 1e-3, not identical"
    resume_equal "fp8 params $recipe" "$work/full.log" "$work/ck" $f8 $pg
  done
  # The checkpoint holds the FP8 weights dequantised (q * scale_inv, rounded to bf16): without
  # the optimizer state they become the masters, and their cast with the checkpoint's (delayed)
  # scales gives back the same FP8 bytes (the bf16 rounding error, 2^-9 relative, is far below
  # half an FP8 step), so the first resumed loss and grad norm equal the uninterrupted run's.
  f8="--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 4 --fp8-amax-compute-algo max"
  "$bin" $args $f8 $pg > "$work/full.log" 2>&1 || { cat "$work/full.log"; exit 1; }
  rm -rf "$work/ck"
  "$bin" $args $f8 $pg --save "$work/ck" --save-interval 3 --exit-interval 3 > "$work/a.log" 2>&1 \
    || { cat "$work/a.log"; exit 1; }
  "$bin" $args $f8 $pg --load "$work/ck" --no-load-optim > "$work/n.log" 2>&1 \
    || { cat "$work/n.log"; exit 1; }
  for v in "lm loss" "grad norm"; do
    a=$(values "$work/full.log" "$v" | sed -n 4p); b=$(values "$work/n.log" "$v" | head -n 1)
    [ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL fp8 params: weights-only resume, $v $a vs $b"; exit 1; }
  done
  echo "ok fp8 params: the saved (dequantised) weights re-cast to the same FP8 bytes"
  "$bin" $args --load "$work/ck" > "$work/bf16.log" 2>&1 || { cat "$work/bf16.log"; exit 1; }
  expect_line "$work/bf16.log" "bf16 from fp8 params" "successfully loaded checkpoint .* at iteration +3"

  # ---- track (the demo corpus) ----
  if ! command -v bible > /dev/null; then
    echo "SKIP track: Debian's bible-kjv (the demo corpus) is not installed (scripts/install_deps.sh)"
    exit 77
  fi
  # One JSONL document per 20 verses of Genesis, each byte a token id (NullTokenizer).
  bible Gen1:1-Gen50:26 | LC_ALL=C awk 'BEGIN { for (i = 1; i < 256; i++) ord[sprintf("%c", i)] = i }
    /^$/ { next }
    { line = $0; sub(/^ +[0-9]+ /, "", line)
      for (i = 1; i <= length(line); i++) t = t (t == "" ? "" : " ") ord[substr(line, i, 1)]
      t = t " 10"; if (++n == 20) { printf "{\"text\": \"%s\"}\n", t; t = ""; n = 0 } }
    END { if (t != "") printf "{\"text\": \"%s\"}\n", t }' > "$work/gen.jsonl"
  "$pre" --input "$work/gen.jsonl" --output-prefix "$work/gen" --tokenizer-type NullTokenizer \
    --vocab-size 256 --append-eod --workers 1 > "$work/pre.log" 2>&1 || { cat "$work/pre.log"; exit 1; }
  targs="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64
    --max-position-embeddings 64 --micro-batch-size 4 --global-batch-size 4 --train-iters 300
    --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 20 --clip-grad 1.0
    --hidden-dropout 0 --attention-dropout 0 --seed 1234 --data-path $work/gen_text_document
    --split 100,0,0 --data-cache-path $work/cache --tokenizer-type NullTokenizer --vocab-size 256
    --make-vocab-size-divisible-by 16 --log-interval 10 --eval-iters 0 --bf16"
  "$bin" $targs > "$work/t16.log" 2>&1 || { cat "$work/t16.log"; exit 1; }
  "$bin" $targs --fp8-format hybrid > "$work/t8.log" 2>&1 || { cat "$work/t8.log"; exit 1; }
  expect_line "$work/t8.log" "fp8 track" "^fp8: format hybrid .*recipe delayed.*8 FP8 linears"
  values "$work/t16.log" "lm loss" > "$work/a"; values "$work/t8.log" "lm loss" > "$work/b"
  paste "$work/a" "$work/b" | awk -v u=0.0625 '
    { a = $1 + 0; b = $2 + 0; d = (a - b) / a; if (d < 0) d = -d; sum += d; n++
      if (n == 1) first = d; if (d > 0) differs = 1; last = d; lastb = b }
    END {
      printf "track: %d values, mean relative deviation %.5f, first %.6f, last %.5f, last fp8 loss %.4f\n", n, sum / n, first, last, lastb
      if (n != 30) { print "FAIL track: expected 30 logged values"; exit 1 }
      if (sum / n > u || last > u || first > u) { print "FAIL track: FP8 deviates from BF16 by more than 2^-4"; exit 1 }
      if (!differs) { print "FAIL track: FP8 and BF16 losses are identical (FP8 did not run)"; exit 1 }
      if (lastb > 0.5 * log(256)) { print "FAIL track: FP8 did not learn"; exit 1 }
      print "ok track: FP8 tracks BF16 within 2^-4" }' || { paste "$work/a" "$work/b"; exit 1; }
  exit 0
fi

# ---- np 2: layouts against one rank (f32 model) ----
args="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
  --max-position-embeddings 16 --global-batch-size 4 --train-iters 8 --lr 1e-3 --mock-data
  --tokenizer-type NullTokenizer --vocab-size 301 --make-vocab-size-divisible-by 4
  --log-interval 1 --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --seed 7
  --fp8-format hybrid --fp8-amax-history-len 2 --fp8-amax-compute-algo max"
run() {  # run <log> <extra args...>: np ranks, the layout checked
  log=$1; shift
  "$mpi" $mpi_args -np "$np" "$bin" $args "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
  expect_layout "$log" "$np" $args "$@"
  expect_line "$log" "amax group" "^fp8: .*amax reduced over $np rank\(s\)"
}
check() {  # check <reference> <candidate> <what>
  first_r=$(values "$1" "lm loss" | head -n 1); first_c=$(values "$2" "lm loss" | head -n 1)
  awk -v a="$first_r" -v b="$first_c" -v w="$3" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d;
    if (d > 2e-6) { print "FAIL " w ": first loss " a " vs " b; exit 1 } print "ok " w ": first loss equal" }'
  compare_one "$1" "$2" "$3" "lm loss" 1e-3 0
}
# DP 2 (micro-batch 2 per rank) against one rank with the same global batch in one micro-batch of
# 4: one forward pass per iteration on both sides, the DP-reduced amax is the whole batch's.
"$bin" $args --micro-batch-size 4 > "$work/single4.log" 2>&1 || { cat "$work/single4.log"; exit 1; }
run "$work/dp2.log" --micro-batch-size 2
check "$work/single4.log" "$work/dp2.log" "fp8 DP 2"
# --fp8-param-gather at DP 2 (the distributed optimizer: each rank casts its master shard, the
# FP8 bytes are all-gathered) against its one-rank run, as above; and against DP 2 without the
# flag bit for bit: in an f32 model the master weights are the model weights, so the cast of the
# shards with the weight's scale gives the bytes the forward's cast of the whole weight gives,
# and the weights' amaxes, max-reduced over DP, are the whole weights'.
"$bin" $args --micro-batch-size 4 --use-distributed-optimizer --fp8-param-gather \
  > "$work/single4pg.log" 2>&1 || { cat "$work/single4pg.log"; exit 1; }
run "$work/dp2pg.log" --micro-batch-size 2 --use-distributed-optimizer --fp8-param-gather
expect_line "$work/dp2pg.log" "fp8 params DP 2" \
  "^fp8 parameters \(--fp8-param-gather\): .* all-gathered in [1-9][0-9]* bucket\(s\) of their own over 2 data-parallel"
check "$work/single4pg.log" "$work/dp2pg.log" "fp8 params DP 2"
run "$work/dp2do.log" --micro-batch-size 2 --use-distributed-optimizer
compare_one "$work/dp2do.log" "$work/dp2pg.log" "fp8 params DP 2 vs without (f32)" "lm loss" 0 0
compare_one "$work/dp2do.log" "$work/dp2pg.log" "fp8 params DP 2 vs without (f32)" "grad norm" 0 0
# Megatron FSDP ZeRO-3 (each module gathers its buckets, the FP8 ones as bytes, and releases them
# after use): the same, bit for bit against ZeRO-3 without the flag.
z3="--micro-batch-size 2 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"
run "$work/z3.log" $z3
run "$work/z3pg.log" $z3 --fp8-param-gather
compare_one "$work/z3.log" "$work/z3pg.log" "fp8 params FSDP optim_grads_params vs without (f32)" "lm loss" 0 0
compare_one "$work/z3.log" "$work/z3pg.log" "fp8 params FSDP optim_grads_params vs without (f32)" "grad norm" 0 0
# TP 2 against one rank with the same micro-batches.
"$bin" $args --micro-batch-size 2 > "$work/single2.log" 2>&1 || { cat "$work/single2.log"; exit 1; }
run "$work/tp2.log" --micro-batch-size 2 --tensor-model-parallel-size 2
check "$work/single2.log" "$work/tp2.log" "fp8 TP 2"
run "$work/tp2sp.log" --micro-batch-size 2 --tensor-model-parallel-size 2 --sequence-parallel
check "$work/single2.log" "$work/tp2sp.log" "fp8 TP 2 SP"
# FP8 attention (--fp8-dot-product-attention) at TP 2 with SP: each rank's heads, their amaxes
# max-reduced over TP with the linears', so the scales equal one rank's; against one rank as above.
"$bin" $args --micro-batch-size 2 --fp8-dot-product-attention > "$work/single_dpa.log" 2>&1 \
  || { cat "$work/single_dpa.log"; exit 1; }
run "$work/tp2dpa.log" --micro-batch-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
  --fp8-dot-product-attention
expect_line "$work/tp2dpa.log" "fp8 dpa TP 2" "^fp8: .* and 2 FP8 core attentions on this rank"
check "$work/single_dpa.log" "$work/tp2dpa.log" "fp8 TP 2 SP attention in FP8"
# --fp8-multi-head-attention at TP 2 with SP likewise: each rank's O is its linear_proj's FP8
# input, each rank's dO comes out of its data-gradient GEMM in FP8.
"$bin" $args --micro-batch-size 2 --fp8-multi-head-attention > "$work/single_mha.log" 2>&1 \
  || { cat "$work/single_mha.log"; exit 1; }
run "$work/tp2mha.log" --micro-batch-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
  --fp8-multi-head-attention
expect_line "$work/tp2mha.log" "fp8 mha TP 2" "^fp8: .* and 2 FP8 core attentions \(multi-head"
check "$work/single_mha.log" "$work/tp2mha.log" "fp8 TP 2 SP multi-head attention in FP8"
# SwiGLU fused into the FP8 casts (docs/fp8.md "Fused casts": fc2's input and fc1's output
# gradient made inside the casts, the model's default) at TP 2 (each rank's fc1 holds [gate_r;
# up_r]) with sequence parallelism: the start-up line says so, the run equals --no-bias-swiglu-fusion
# (the separate ops) bit for bit, and one rank as the layouts above.
sw="--micro-batch-size 2 --swiglu --disable-bias-linear"
"$bin" $args $sw > "$work/single_sw.log" 2>&1 || { cat "$work/single_sw.log"; exit 1; }
run "$work/tp2sw.log" $sw --tensor-model-parallel-size 2 --sequence-parallel
expect_line "$work/tp2sw.log" "fp8 SwiGLU fused" "^fp8: .*SwiGLU fused into the casts \(forward and backward\)"
run "$work/tp2sw_sep.log" $sw --tensor-model-parallel-size 2 --sequence-parallel --no-bias-swiglu-fusion
expect_no_line "$work/tp2sw_sep.log" "fp8 SwiGLU separate" "SwiGLU fused"
compare_one "$work/tp2sw_sep.log" "$work/tp2sw.log" "fp8 TP 2 SP SwiGLU fused vs separate" "lm loss" 0 0
compare_one "$work/tp2sw_sep.log" "$work/tp2sw.log" "fp8 TP 2 SP SwiGLU fused vs separate" "grad norm" 0 0
check "$work/single_sw.log" "$work/tp2sw.log" "fp8 TP 2 SP SwiGLU"
