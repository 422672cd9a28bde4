#!/usr/bin/env bash
# cuDNN fused attention on the lent GPU (a part of scripts/gpu_session.sh; alone: source
# scripts/gpu_env.sh first). Writes into ${RESULTS_DIR:-/tmp/cudnn_out}:
#   1. tests.txt: cuda_cudnn_attention_test (cuDNN fwd/bwd vs the CPU's f32 attention) and our
#      kernels' attention tests (cuda_attention_mma_test, cuda_ops_test's attention cases)
#   2. sweep-*.txt/json: attention_bench, bf16 causal head dim 128, S 1k/2k/4k (16k tokens per
#      call, NH 16), forward, backward and both, with cuDNN (MG_OP_PROVIDERS=...cuda:cudnn) and with
#      ours; PyTorch SDPA on the same shapes (benchmarks/attention_sweep_torch.py)
#   3. train-*.log: pretrain_gpt gpt2-124m --bf16 (seq 1024, micro-batch $MB, $ITERS iterations)
#      with --attention-backend fused and local; tokens/s from the median iteration time after
#      the first $WARMUP; and a tiny fused-vs-local loss comparison
#   4. cudnn.md: the tables
# CUDNN_PARTS (a comma list of tests,sweep,train; default all three) picks steps 1-3.
# Without a GPU (a test of this script): BIN_DIR=build/bin PLATFORM=cpu bash scripts/gpu_run_cudnn.sh
# (runs what the CPU can: the tests skip, the sweep and training run tiny shapes on the CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${RESULTS_DIR:-/tmp/cudnn_out}
bindir=${BIN_DIR:-.gpu_bundle/bin}
platform=${PLATFORM:-cuda}
MB=${MB:-16}
ITERS=${ITERS:-30}
WARMUP=${WARMUP:-5}
mkdir -p "$out"
status=0
py=${PYTHON:-python3}
# Each step runs under min(its own limit, what is left of BUDGET less 20 s for the tables), so
# that a slow step costs its own results only and the tables are always written.
budget=${BUDGET:-330}
begin=$SECONDS
lim() {
  local l=$((budget - 20 - (SECONDS - begin)))
  [ "$l" -lt 1 ] && l=1
  [ "$1" -lt "$l" ] && l=$1
  echo "$l"
}

# CUDNN_PARTS (default tests,sweep,train) picks the steps 1-3 that run; the tables are always made.
parts=",${CUDNN_PARTS:-tests,sweep,train},"

# ---- 1. tests ----
[[ $parts == *",tests,"* ]] && {
  echo "== libcudnn: $(ldd "$bindir/../lib/libmegatron_cuda.so" 2>/dev/null | grep libcudnn | tr -s ' \t' ' ')"
  for t in cuda_cudnn_attention_test cuda_attention_mma_test; do
    echo "== $t"
    timeout "$(lim 120)" "$bindir/$t" > "$out/test-$t.log" 2>&1
    echo "rc=$?"
    grep -vE '^\[ +(RUN|OK) +\]' "$out/test-$t.log" | tail -40
  done
  echo "== cuda_ops_test (attention)"
  timeout "$(lim 60)" "$bindir/cuda_ops_test" --gtest_filter='*ttention*' 2>&1 | tail -5
  echo "rc=${PIPESTATUS[0]}"
} > "$out/tests.txt" 2>&1
[ -f "$out/tests.txt" ] && grep -q '^rc=[^0]' "$out/tests.txt" && status=1

# ---- 2. the attention sweep ----
if [ "$platform" = cuda ]; then
  filter='attention/S:(1024|2048|4096)/B:[0-9]+/NH:16/NG:16/HD:128/'
else
  filter='attention/S:(128|256)/B:1/NH:8/NG:2/HD:64/bf16:1/'
fi
whos="cudnn ours"
[ "$platform" = cuda ] || whos=ours  # cuda:cudnn exists on the CUDA platform only
[[ $parts == *",sweep,"* ]] || whos=""
for who in $whos; do
  providers=""
  [ $who = cudnn ] && providers="attention_fwd=cuda:cudnn,attention_bwd=cuda:cudnn"
  MG_OP_PROVIDERS=$providers MG_BENCH_PLATFORM=$platform timeout "$(lim 90)" "$bindir/attention_bench" \
    --benchmark_min_time=0.2 --benchmark_filter="$filter" \
    --benchmark_out="$out/sweep-$who.json" --benchmark_out_format=json > "$out/sweep-$who.txt" 2>&1 ||
    { echo "attention_bench ($who) failed" >> "$out/sweep-$who.txt"; status=1; }
done
if [ "$platform" = cuda ] && [[ $parts == *",sweep,"* ]]; then
  timeout "$(lim 90)" "$py" benchmarks/attention_sweep_torch.py --hd 128 --seqs 1024,2048,4096 \
    --out "$out/sweep-torch.json" > "$out/sweep-torch.txt" 2>&1 || status=1
fi

# ---- 3. training ----
if [ "$platform" = cuda ]; then
  model=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --ffn-hidden-size 3072
    --seq-length 1024 --max-position-embeddings 1024 --vocab-size 50257)
else
  MB=2
  model=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 256
    --seq-length 64 --max-position-embeddings 64 --vocab-size 1000)
fi
common=(--platform "$platform" --bf16 --mock-data --micro-batch-size "$MB" --global-batch-size "$MB"
  --hidden-dropout 0 --attention-dropout 0 --tokenizer-type NullTokenizer
  --make-vocab-size-divisible-by 128 --lr 6e-4 --min-lr 6e-4 --lr-decay-style constant
  --adam-beta1 0.9 --adam-beta2 0.95 --weight-decay 0.1 --clip-grad 1.0 --init-method-std 0.02
  --seed 1234 --log-interval 1 --eval-iters 0 --eval-interval 1000000)
backends="fused local"
[[ $parts == *",train,"* ]] || backends=""
for backend in $backends; do
  echo "$bindir/pretrain_gpt ${model[*]} ${common[*]} --train-iters $ITERS --attention-backend $backend" > "$out/train-$backend.log"
  timeout "$(lim 90)" "$bindir/pretrain_gpt" "${model[@]}" "${common[@]}" --train-iters "$ITERS" \
    --attention-backend "$backend" >> "$out/train-$backend.log" 2>&1 || status=1
done
# Tiny model, 30 iterations: fused and local losses side by side (same data, same init).
tiny=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 512
  --seq-length 256 --max-position-embeddings 256 --vocab-size 1000)
for backend in $backends; do
  timeout "$(lim 45)" "$bindir/pretrain_gpt" "${tiny[@]}" "${common[@]}" --train-iters 30 \
    --attention-backend "$backend" > "$out/tiny-$backend.log" 2>&1 || status=1
done

# ---- 4. the tables ----
"$py" - "$out" "$MB" "$WARMUP" "$platform" <<'PY' > "$out/cudnn.md"
import json, os, re, statistics, sys
out, mb, warmup, platform = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("## Attention sweep (bf16, causal, TFLOP/s; flash-attention's FLOP convention)\n")
rows = {}
for who in ("cudnn", "ours"):
    try:
        doc = json.load(open(f"{out}/sweep-{who}.json"))
    except Exception as e:
        print(f"- {who}: no results ({e})")
        continue
    for b in doc["benchmarks"]:
        m = re.search(r"S:(\d+)/B:(\d+)/NH:(\d+)/NG:(\d+)/HD:(\d+)/bf16:\d/mode:(\d)", b["name"])
        if not m:
            continue
        s, mode = int(m.group(1)), {"0": "fwd", "1": "fwd+bwd", "2": "bwd"}[m.group(6)]
        note = "" if who != "cudnn" or b.get("cudnn_calls", 0) > 0 else " (fell back: no cuDNN calls)"
        rows.setdefault((s, mode), {})[who] = f"{b['FLOP/s'] / 1e12:.1f}{note}"
try:
    for r in json.load(open(f"{out}/sweep-torch.json"))["rows"]:
        rows.setdefault((r["S"], r["mode"]), {})["torch-" + r["backend"]] = (
            f"{r['tflops']:.1f}" if "tflops" in r else "n/a")
except Exception as e:
    print(f"- torch: no results ({e})\n")
cols = ["cudnn", "ours", "torch-default", "torch-flash", "torch-cudnn", "torch-efficient"]
print("| S | pass | " + " | ".join(cols) + " |")
print("|---|---|" + "---|" * len(cols))
for (s, mode) in sorted(rows, key=lambda k: (k[0], ["fwd", "bwd", "fwd+bwd"].index(k[1]))):
    print(f"| {s} | {mode} | " + " | ".join(rows[(s, mode)].get(c, "") for c in cols) + " |")

def iters(path):
    ms, losses = [], []
    for line in open(path, errors="replace"):
        m = re.search(r"elapsed time per iteration \(ms\): ([0-9.]+)", line)
        if m:
            ms.append(float(m.group(1)))
        m = re.search(r"lm loss: ([0-9.Ee+-]+)", line)
        if m:
            losses.append(float(m.group(1)))
    return ms, losses

print("\n## Training, pretrain_gpt --bf16 (tokens/s from the median iteration after the first "
      f"{warmup})\n")
print("| model | attention backend | micro-batch | median ms/iter | tokens/s | start-up line |")
print("|---|---|---|---|---|---|")
for b in ("fused", "local"):
    p = f"{out}/train-{b}.log"
    if not os.path.exists(p):
        continue
    ms, _ = iters(p)
    line = next((l.strip() for l in open(p, errors="replace") if l.startswith("attention backend:")), "")
    seq = 1024 if platform == "cuda" else 64
    if len(ms) > warmup:
        med = statistics.median(ms[warmup:])
        print(f"| {'gpt2-124m' if platform == 'cuda' else 'tiny'} | {b} | {mb} | {med:.1f} | "
              f"{mb * seq / med * 1e3:,.0f} | {line[:120]} |")
    else:
        print(f"| | {b} | {mb} | failed ({len(ms)} iterations logged) | | {line[:120]} |")
print("\n## Tiny model, 30 iterations: lm loss, fused vs local\n")
try:
    _, lf = iters(f"{out}/tiny-fused.log")
    _, ll = iters(f"{out}/tiny-local.log")
    print("| iteration | fused | local | difference |")
    print("|---|---|---|---|")
    for i in (0, 4, 9, 19, 29):
        if i < len(lf) and i < len(ll):
            print(f"| {i + 1} | {lf[i]:.6f} | {ll[i]:.6f} | {lf[i] - ll[i]:+.2e} |")
except Exception as e:
    print(f"- no tiny runs ({e})")
PY
echo "cudnn part: $((SECONDS - begin)) s" >> "$out/cudnn.md"
cat "$out/cudnn.md"
[ -f "$out/tests.txt" ] && grep -E '^(\[  (PASSED|FAILED|SKIPPED) |rc=|== )' "$out/tests.txt"
exit $status
