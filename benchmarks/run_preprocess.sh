#!/usr/bin/env bash
# preprocess_data on the Brown corpus (../shared/data/brown/brown.jsonl, 6 MB) with GPT-2 BPE,
# --workers 1 and 2, side by side in the same run with Megatron's tools/preprocess_data.py loop
# (megatron-core's library pieces, benchmarks/preprocess_python.py) and the HF `tokenizers` batch
# encoding:
#   * all three on the same input: Brown repeated PY_REPEAT times (default 2, ~12 MB; the Python
#     loop runs at well under 1 MB/s here, so ~100 MB would take most of an hour);
#   * preprocess_data alone on Brown repeated REPEAT times (default 17, ~100 MB).
# Checks that 1 and 2 workers give byte-identical outputs and that preprocess_data's .bin/.idx
# equal the Megatron loop's. Writes benchmarks/results/<date>-cpu-preprocess_brown.{md,json}.
#   bash benchmarks/run_preprocess.sh [build-dir] [corpus.jsonl]
# The Python side needs a venv with megatron-core 0.16.1, torch, numpy, transformers, tokenizers
# (tests/fixtures/megatron_core/README.md): MG_BENCH_PYTHON (default /tmp/venv-mc/bin/python);
# without it only preprocess_data runs.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
corpus=${2:-../shared/data/brown/brown.jsonl}
repeat=${REPEAT:-17}
py_repeat=${PY_REPEAT:-2}
py=${MG_BENCH_PYTHON:-/tmp/venv-mc/bin/python}
[ -f "$corpus" ] || { echo "run_preprocess: no corpus at $corpus" >&2; exit 1; }
[ "${SKIP_BUILD:-0}" = 1 ] || make -s build BUILD="$build" >/dev/null  # SKIP_BUILD=1: use it as built
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for _ in $(seq "$repeat"); do cat "$corpus"; done > "$tmp/big.jsonl"
for _ in $(seq "$py_repeat"); do cat "$corpus"; done > "$tmp/small.jsonl"
vocab=tests/fixtures/gpt2/gpt2-vocab.json
merges=tests/fixtures/gpt2/gpt2-merges.txt
date=$(date -u +%Y-%m-%d)
out="benchmarks/results/$date-cpu-preprocess_brown"
json="$tmp/runs.jsonl"
: > "$json"

# preprocess_data: its "Done:" line -> one JSON record.
run_cpp() {  # input label workers prefix
  /usr/bin/time -f "%e %M" -o "$tmp/time" "$build/bin/preprocess_data" --input "$1" \
    --output-prefix "$4" --tokenizer-type GPT2BPETokenizer --vocab-file "$vocab" \
    --merge-file "$merges" --append-eod --workers "$3" --log-interval 100000000 2> "$tmp/log"
  local done wall rss bytes
  done=$(grep '^Done' "$tmp/log")
  read -r wall rss < "$tmp/time"
  bytes=$(stat -c %s "$1")
  python3 - "$2" "$3" "$done" "$wall" "$rss" "$bytes" >> "$json" <<'EOF'
import json, re, sys
label, workers, done, wall, rss, size = sys.argv[1:]
m = re.search(r"Done: (\d+) documents .*\), (\d+) tokens", done)
docs, tokens = int(m.group(1)), int(m.group(2))
print(json.dumps({"impl": "Megatron-CPP preprocess_data", "input": label, "workers": int(workers),
                  "docs": docs, "bytes": int(size), "tokens": tokens, "wall_s": float(wall),
                  "mb_per_s": int(size) / 1e6 / float(wall), "tokens_per_s": tokens / float(wall),
                  "peak_rss_kb": int(rss)}))
EOF
}

for w in 1 2; do run_cpp "$tmp/small.jsonl" small "$w" "$tmp/cpp_small_w$w"; done
have_py=0
if [ -x "$py" ] && HF_HUB_OFFLINE=1 "$py" -c "import megatron.core, tokenizers, transformers" 2>/dev/null; then
  have_py=1
  for w in 1 2; do
    HF_HUB_OFFLINE=1 "$py" benchmarks/preprocess_python.py megatron --input "$tmp/small.jsonl" \
      --vocab "$vocab" --merges "$merges" --workers "$w" --output-prefix "$tmp/mc_small_w$w" \
      2> "$tmp/pylog" | sed 's/^{/{"input": "small", /' >> "$json"
    HF_HUB_OFFLINE=1 "$py" benchmarks/preprocess_python.py hf --input "$tmp/small.jsonl" \
      --vocab "$vocab" --merges "$merges" --workers "$w" \
      2>> "$tmp/pylog" | sed 's/^{/{"input": "small", /' >> "$json"
  done
fi
for w in 1 2; do run_cpp "$tmp/big.jsonl" big "$w" "$tmp/cpp_big_w$w"; done

checks=()
for s in small big; do
  if cmp -s "$tmp/cpp_${s}_w1_text_document.bin" "$tmp/cpp_${s}_w2_text_document.bin" &&
    cmp -s "$tmp/cpp_${s}_w1_text_document.idx" "$tmp/cpp_${s}_w2_text_document.idx"; then
    checks+=("preprocess_data, $s input: 1 and 2 workers byte-identical")
  else
    checks+=("preprocess_data, $s input: 1 and 2 workers DIFFER")
  fi
done
if [ "$have_py" = 1 ]; then
  if cmp -s "$tmp/cpp_small_w1_text_document.bin" "$tmp/mc_small_w1_text_document.bin" &&
    cmp -s "$tmp/cpp_small_w1_text_document.idx" "$tmp/mc_small_w1_text_document.idx"; then
    checks+=("preprocess_data's .bin/.idx byte-identical to the Megatron loop's (megatron-core IndexedDatasetBuilder)")
  else
    checks+=("preprocess_data's .bin/.idx DIFFER from the Megatron loop's")
  fi
fi

python3 - "$json" "$out" "$(git rev-parse --short HEAD)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" "$(nproc)" \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$(du -h "$tmp/small.jsonl" | cut -f1)" \
  "$(du -h "$tmp/big.jsonl" | cut -f1)" "$py_repeat" "$repeat" "${checks[@]}" <<'EOF'
import json, sys
src, out, commit, cpu, nproc, load, small, big, prep, rep = sys.argv[1:11]
checks = sys.argv[11:]
runs = [json.loads(l) for l in open(src) if l.strip()]
meta = {"commit": commit, "cpu": cpu, "cores": int(nproc), "loadavg_at_end": load,
        "inputs": {"small": f"brown.jsonl x{prep} ({small})", "big": f"brown.jsonl x{rep} ({big})"},
        "command": "bash benchmarks/run_preprocess.sh", "checks": checks, "runs": runs}
with open(out + ".json", "w") as f:
    json.dump(meta, f, indent=1)
    f.write("\n")
base = {}
for r in runs:
    if r["impl"].startswith("megatron-core") and r["input"] == "small":
        base[r["workers"]] = r["mb_per_s"]
lines = [f"# preprocess_data vs Megatron's preprocess_data.py loop vs HF tokenizers: Brown, GPT-2 BPE, --append-eod",
         "",
         f"Commit {commit}, {cpu}, {nproc} cores (shared; load average {load} at the end of the run).",
         "Command: `bash benchmarks/run_preprocess.sh`; raw numbers in the .json beside this file.",
         f"Inputs: small = {meta['inputs']['small']}, all three implementations; big = {meta['inputs']['big']}, preprocess_data only.",
         "",
         "| implementation | input | workers | MB/s | tokens/s | wall s | x Megatron loop (same workers) |",
         "|---|---|---|---|---|---|---|"]
for r in runs:
    x = ""
    if r["input"] == "small" and r["workers"] in base:
        x = f"{r['mb_per_s'] / base[r['workers']]:.1f}x"
    lines.append(f"| {r['impl']} | {r['input']} | {r['workers']} | {r['mb_per_s']:.2f} | "
                 f"{r['tokens_per_s']:,.0f} | {r['wall_s']:.2f} | {x} |")
lines += [""] + [f"- {c}" for c in checks]
seen = set()
for r in runs:
    keys = [k for k in ("tokenizer", "megatron_core", "transformers", "tokenizers", "numpy") if k in r]
    if keys and r["impl"] not in seen:
        seen.add(r["impl"])
        lines.append(f"- {r['impl']}: " + ", ".join(f"{k} {r[k]}" for k in keys))
lines += ["",
          "The Megatron loop is tools/preprocess_data.py's Encoder and main loop (multiprocessing.Pool.imap,",
          "chunks of 32) around megatron-core 0.16.1's HuggingFaceTokenizer (use_fast=False, as its default)",
          "and IndexedDatasetBuilder; the script itself is not in the wheel (benchmarks/preprocess_python.py).",
          "HF tokenizers: Tokenizer(BPE) + ByteLevel, encode_batch of 1,000 documents, RAYON_NUM_THREADS =",
          "workers, JSON parsing included, nothing written. The machine's 2 cores are shared with other",
          "jobs: compare the rows of one run, not across runs."]
with open(out + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
