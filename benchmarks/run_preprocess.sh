#!/usr/bin/env bash
# preprocess_data on the Brown corpus (../shared/data/brown/brown.jsonl, 6 MB) with GPT-2 BPE, for
# --workers 1 and 2: prints the tool's own rate line, wall time and peak memory, and checks that
# both outputs are byte-identical. Writes benchmarks/results/<date>-cpu-preprocess_brown.md.
#   bash benchmarks/run_preprocess.sh [build-dir] [corpus.jsonl]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
corpus=${2:-../shared/data/brown/brown.jsonl}
[ -f "$corpus" ] || { echo "run_preprocess: no corpus at $corpus" >&2; exit 1; }
make -s build BUILD="$build" >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out="benchmarks/results/$(date -u +%Y-%m-%d)-cpu-preprocess_brown.md"
{
  echo "# preprocess_data on $(basename "$corpus") ($(du -h "$corpus" | cut -f1)), GPT-2 BPE, --append-eod"
  echo
  echo "Commit $(git rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)."
  echo "Command: \`bash benchmarks/run_preprocess.sh\`."
  echo
  for w in 1 2; do
    /usr/bin/time -f "wall %e s, peak RSS %M KB" "$build/bin/preprocess_data" --input "$corpus" \
      --output-prefix "$tmp/w$w" --tokenizer-type GPT2BPETokenizer \
      --vocab-file tests/fixtures/gpt2/gpt2-vocab.json --merge-file tests/fixtures/gpt2/gpt2-merges.txt \
      --append-eod --workers "$w" --log-interval 100000 2> "$tmp/log$w"
    echo "- workers $w: $(grep '^Done' "$tmp/log$w"); $(tail -1 "$tmp/log$w")"
  done
  cmp -s "$tmp/w1_text_document.bin" "$tmp/w2_text_document.bin" &&
    cmp -s "$tmp/w1_text_document.idx" "$tmp/w2_text_document.idx" &&
    echo "- outputs of 1 and 2 workers are byte-identical"
} | tee "$out"
