#!/usr/bin/env bash
# The per-op profile (--profile-op-table, docs/profiling.md) of the demo model (scripts/demo.sh:
# 2 layers, H 128, 4 heads, seq 128, micro-batch = global batch 16, vocabulary 2000 SentencePiece,
# f32) on the King James Bible data `make demo` prepares, on the CPU platform.
#   bash benchmarks/run_cpu_profile.sh [build-dir]     (default build; runs scripts/demo.sh first
#                                                       when <build>/demo has no data)
# Iterations [START, END) (default 5..15, after warm-up) of the demo's schedule (330 iterations,
# stopped by --exit-interval END) are profiled; THREADS (default 2) is
# OMP_NUM_THREADS. Writes benchmarks/results/<date>-cpu-demo-op-profile.md with the command, the
# load average before and after (the machine may be shared) and the table.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
start=${START:-5}
end=${END:-15}
threads=${THREADS:-2}
work="$build/demo"
[ -f "$work/kjv_text_document.bin" ] || bash scripts/demo.sh "$build" > /dev/null
cmd=("$build/bin/pretrain_gpt" --platform cpu
  --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128
  --max-position-embeddings 128 --micro-batch-size 16 --global-batch-size 16
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 20 --weight-decay 0.01
  --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0 --seed 1234
  --data-path "$work/kjv_text_document" --split 98,2,0 --data-cache-path "$work/cache"
  --tokenizer-type SentencePieceTokenizer --tokenizer-model "$work/kjv_spm.model"
  --train-iters 330 --exit-interval "$end" --log-interval 5 --eval-iters 0
  --profile-op-table --profile-step-start "$start" --profile-step-end "$end")
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log=$(OMP_NUM_THREADS=$threads "${cmd[@]}")
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
out="benchmarks/results/$(date -u +%F)-cpu-demo-op-profile.md"
{
  echo "# Per-op profile of the demo model on the CPU ($(date -u +%F))"
  echo
  echo "Command (\`bash benchmarks/run_cpu_profile.sh\`, OMP_NUM_THREADS=$threads; data from \`make demo\`):"
  echo
  echo '```'
  echo "${cmd[*]}" | sed "s#$work#<build>/demo#g"
  echo '```'
  echo
  echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;"
  echo "load average before: $load_before, after: $load_after (shared machine: shares, not absolute times)."
  echo
  echo '```'
  echo "$log" | sed -n '/^op profile/,/^host round-trips/p'
  echo '```'
  echo
  echo "Training log lines of the run:"
  echo
  echo '```'
  echo "$log" | grep -E ' iteration +[0-9]+/'
  echo '```'
} > "$out"
echo "wrote $out"
