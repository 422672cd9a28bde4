#!/usr/bin/env bash
# Imported HuggingFace MoE models (issue 19: Mixtral, Qwen2-MoE with its gated shared expert,
# Qwen3-MoE) generate transformers' greedy tokens on one rank, tensor-parallel on 2 ranks and
# expert-parallel on 2 ranks (each rank 2 of the 4 experts). The layout each run used is checked
# from generate's start-up line, so a run that fell back to one rank cannot pass on its tokens.
# Then the Mixtral import fine-tunes at EP 2 (model_args.yaml from import --ep 2) with the lm
# losses of a single-rank run (relative 1e-5), layouts checked by expect_layout, and exports as
# mixtral with the original config.json (hf_checkpoint_test compares a whole config.json).
# usage: hf_moe_parallel.sh CONVERT GENERATE PRETRAIN FIXTURES_DIR MPIRUN [mpirun args...]
set -euo pipefail
convert=$1 generate=$2 pretrain=$3 fixtures=$4 mpirun=$5
shift 5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
json_ids() {  # the "prompt" or "generated" list of generation.json, space-separated
  tr -d '\n' < "$1" | sed -e "s/.*\"$2\": *\[\([^]]*\)\].*/\1/" -e 's/,/ /g' -e 's/  */ /g' \
    -e 's/^ //'
}
for model in mixtral qwen2_moe qwen3_moe; do
  "$convert" import --hf-dir "$fixtures/hf_models/$model" --save "$work/$model" > /dev/null
  prompt=$(json_ids "$fixtures/hf_models/$model/generation.json" prompt)
  want=$(json_ids "$fixtures/hf_models/$model/generation.json" generated)
  n=$(echo "$want" | wc -w)
  gen=(--load "$work/$model" --prompt "$prompt" --max-new-tokens "$n" --ignore-eod --print-tokens
       --greedy)
  run() {  # label, then the command; prints the generated ids, checks the layout line
    local label=$1 layout=$2
    shift 2
    OMP_NUM_THREADS=1 "$@" > "$work/out" 2> "$work/err" || { cat "$work/err" >&2; exit 1; }
    grep -q "^generate: $layout\$" "$work/err" \
      || { echo "$model $label: expected '$layout'" >&2; cat "$work/err" >&2; exit 1; }
    grep '^generated tokens:' "$work/out" | sed 's/^generated tokens: *//'
  }
  one=$(run "1 rank" "tensor parallel 1, expert parallel 1" "$generate" "${gen[@]}")
  tp2=$(run "TP 2" "tensor parallel 2, expert parallel 1" "$mpirun" "$@" -np 2 "$generate" \
        "${gen[@]}" --tensor-model-parallel-size 2)
  ep2=$(run "EP 2" "tensor parallel 1, expert parallel 2" "$mpirun" "$@" -np 2 "$generate" \
        "${gen[@]}" --expert-model-parallel-size 2)
  echo "$model: transformers: $want"
  echo "$model: 1 rank:       $one"
  echo "$model: TP 2:         $tp2"
  echo "$model: EP 2:         $ep2"
  [ "$one" = "$want" ] || { echo "$model: greedy tokens differ from transformers'" >&2; exit 1; }
  [ "$tp2" = "$want" ] || { echo "$model: TP 2 tokens differ" >&2; exit 1; }
  [ "$ep2" = "$want" ] || { echo "$model: EP 2 tokens differ" >&2; exit 1; }
done
echo "MoE imports: TP 2 and EP 2 generation equal transformers' greedy tokens"

. "$(dirname "$0")/compare_logs.sh"  # expect_layout
"$convert" import --hf-dir "$fixtures/hf_models/mixtral" --save "$work/mx" --ep 2 > /dev/null
flags=(--yaml-cfg "$work/mx/model_args.yaml" --load "$work/mx" --finetune --mock-data
       --micro-batch-size 2 --global-batch-size 4 --seq-length 16 --train-iters 3 --lr 1e-3
       --log-interval 1 --eval-iters 0)
losses() { grep -o 'lm loss: [0-9.E+-]*' | awk '{print $3}'; }
OMP_NUM_THREADS=1 "$pretrain" "${flags[@]}" --expert-model-parallel-size 1 > "$work/ep1.log"
OMP_NUM_THREADS=1 "$mpirun" "$@" -np 2 "$pretrain" "${flags[@]}" --save "$work/mx_ft" \
  --save-interval 3 > "$work/ep2.log"
expect_layout "$work/ep1.log" 1 --num-experts 4 --expert-model-parallel-size 1
expect_layout "$work/ep2.log" 2 --num-experts 4 --expert-model-parallel-size 2  # from the yaml
losses < "$work/ep1.log" > "$work/ep1"
losses < "$work/ep2.log" > "$work/ep2"
echo "EP 1: $(tr '\n' ' ' < "$work/ep1")"
echo "EP 2: $(tr '\n' ' ' < "$work/ep2")"
[ "$(wc -l < "$work/ep1")" -eq 3 ] || { echo "expected 3 loss values on one rank" >&2; exit 1; }
paste "$work/ep1" "$work/ep2" | awk '{ d = $1 - $2; if (d < 0) d = -d;
  if (d > 1e-5 * $1 || $2 == "") { print "loss differs: " $1 " vs " $2; bad = 1 } }
  END { exit bad }'
"$convert" export --checkpoint-path "$work/mx_ft" --output-path "$work/mx_hf" | grep -q "^exported mixtral" \
  || { echo "the EP 2 fine-tune does not export as mixtral" >&2; exit 1; }
for field in '"model_type": "mixtral"' '"num_local_experts": 4' '"num_experts_per_tok": 2' \
             '"transformers_version": "5.24.0"'; do  # the imported config.json, kept
  grep -qF "$field" "$work/mx_hf/config.json" \
    || { echo "the exported config.json lacks $field" >&2; exit 1; }
done
echo "Mixtral import: EP 2 fine-tune losses equal one rank's; the export keeps family and config"
