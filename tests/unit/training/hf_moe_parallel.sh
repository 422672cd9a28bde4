#!/usr/bin/env bash
# Imported HuggingFace MoE models (issue 19: Mixtral, Qwen2-MoE with its gated shared expert,
# Qwen3-MoE) generate transformers' greedy tokens on one rank, tensor-parallel on 2 ranks and
# expert-parallel on 2 ranks (each rank 2 of the 4 experts). The layout each run used is checked
# from generate's start-up line, so a run that fell back to one rank cannot pass on its tokens.
# usage: hf_moe_parallel.sh CONVERT GENERATE FIXTURES_DIR MPIRUN [mpirun args...]
set -euo pipefail
convert=$1 generate=$2 fixtures=$3 mpirun=$4
shift 4
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
