#!/bin/sh
# convert_checkpoint import prints the progress line of its layers (done/total, ETA, the final
# line) on stderr; MG_PROGRESS_*_SECONDS=0 makes every update print (megatron/core/common/progress.h).
# usage: hf_import_progress.sh <convert_checkpoint> <fixtures dir>
set -eu
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
MG_PROGRESS_QUIET_SECONDS=0 MG_PROGRESS_INTERVAL_SECONDS=0 \
  "$1" import --hf-dir "$2/hf_models/llama" --save "$work/ckpt" > "$work/out" 2> "$work/err" \
  || { cat "$work/out" "$work/err"; exit 1; }
for re in ' > importing the HuggingFace layers: 1/2 \(50\.0%\), [0-9.]+ s, ETA [0-9.]+ s$' \
          ' > importing the HuggingFace layers: 2/2 \(100\.0%\) in [0-9.]+ s$'; do
  grep -Eq "$re" "$work/err" || { echo "FAIL: no line matches /$re/ on stderr:"; cat "$work/err"; exit 1; }
done
echo "ok convert_checkpoint import: progress lines"
