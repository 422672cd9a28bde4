#!/usr/bin/env bash
# The cpu-tiny workload (/work/shared/PERFORMANCE.md: 4 layers, H 256, seq 256 on the CPU): one
# training step of build/bin/pretrain_gpt --mock-data against the identical model in PyTorch eager
# (benchmarks/cpu_tiny_torch.py), same thread count, side by side in one run.
#   bash benchmarks/run_cpu_tiny.sh [build-dir]        (default build; configured if it is not)
# Model: GPT-2 layer spec, 4 layers, H 256, 8 heads, FFN 1024, seq 256, vocab 50257 padded to 50304
# (make-vocab-size-divisible-by 128), learned absolute positions, LayerNorm, bias-GELU (tanh form),
# tied output layer, no dropout, f32, AdamW (beta 0.9/0.95, weight decay 0.1 on weights only),
# grad clip 1.0, micro-batch = global batch = MB (default 4: 1024 tokens per step).
# Protocol: ROUNDS (default 2) alternating rounds of ours then PyTorch, each WARMUP (3) untimed +
# STEPS (12) timed steps; per implementation the median over all timed steps, min/max and the
# quartiles, plus each round's median. Ours: pretrain_gpt's per-iteration "elapsed time per
# iteration" with --log-interval 1 (a whole train step: batch, forward, backward, grad norm, clip,
# AdamW). PyTorch: zero_grad + forward + backward + clip_grad_norm_ + AdamW.step, timed with
# perf_counter; batches made before the timed region. COMPILE=1 also times torch.compile (default 0).
# Threads: THREADS (default 2) = OMP_NUM_THREADS for both and torch.set_num_threads.
# Writes benchmarks/results/<date>-cpu-cpu_tiny.{json,md}; the load average is recorded before and
# after every run (the machine may be shared: compare ratios, not absolute times).
#
# The PyTorch side is a peer, never a build dependency: a venv outside the repository,
#   python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch numpy
# and MG_BENCH_PYTHON pointing at its python (default /tmp/venv-torch/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${THREADS:-2}
warmup=${WARMUP:-3}
steps=${STEPS:-12}
rounds=${ROUNDS:-2}
mb=${MB:-4}
compile=${COMPILE:-0}
py=${MG_BENCH_PYTHON:-/tmp/venv-torch/bin/python}
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "run_cpu_tiny: no torch at $py; set it up with" >&2
  echo "  python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch numpy" >&2
  exit 1
fi
[ -f "$build/build.ninja" ] ||
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMG_CUDA=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target pretrain_gpt >/dev/null

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=$threads
iters=$((warmup + steps))
model_flags=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --ffn-hidden-size 1024
  --seq-length 256 --max-position-embeddings 256 --micro-batch-size "$mb" --global-batch-size "$mb"
  --hidden-dropout 0 --attention-dropout 0 --tokenizer-type NullTokenizer --vocab-size 50257
  --make-vocab-size-divisible-by 128 --lr 6e-4 --min-lr 6e-4 --lr-decay-style constant
  --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0
  --init-method-std 0.02 --seed 1234)
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

run_ours() {  # round
  local before after
  before=$(loadavg)
  "$build/bin/pretrain_gpt" --platform cpu --mock-data "${model_flags[@]}" --train-iters "$iters" \
    --log-interval 1 --eval-iters 0 > "$tmp/ours_$1.log" 2>&1
  after=$(loadavg)
  python3 - "$1" "$warmup" "$before" "$after" "$tmp/ours_$1.log" >> "$tmp/runs.jsonl" <<'EOF'
import json, re, sys
rnd, warmup, before, after, log = sys.argv[1:]
text = open(log).read()
ms = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", text)]
loss = [float(x) for x in re.findall(r"lm loss: ([0-9.Ee+-]+)", text)]
params = re.search(r"number of parameters[^0-9]*([0-9]+)", text)
print(json.dumps({"impl": "megatron-cpp", "round": int(rnd), "first_step_ms": ms[0],
                  "step_ms": ms[int(warmup):], "loss_first": loss[0], "loss_last": loss[-1],
                  "params": int(params.group(1)) if params else None,
                  "loadavg_before": before, "loadavg_after": after}))
EOF
}

run_torch() {  # round
  local before after extra=()
  [ "$compile" = 1 ] && extra=(--compile)
  before=$(loadavg)
  "$py" benchmarks/cpu_tiny_torch.py --threads "$threads" --warmup "$warmup" --steps "$steps" \
    --micro-batch "$mb" "${extra[@]}" > "$tmp/torch_$1.json" 2> "$tmp/torch_$1.err"
  after=$(loadavg)
  python3 - "$1" "$before" "$after" "$tmp/torch_$1.json" >> "$tmp/runs.jsonl" <<'EOF'
import json, sys
rnd, before, after, path = sys.argv[1:]
d = json.load(open(path))
for r in d["runs"]:
    r.update({"round": int(rnd), "loadavg_before": before, "loadavg_after": after,
              "torch": d["torch"], "torch_threads": d["threads"], "torch_blas": d["blas"]})
    for k in ("median_ms", "min_ms", "max_ms"):
        r.pop(k, None)
    print(json.dumps(r))
if "compile_error" in d:
    print(json.dumps({"impl": "pytorch-compile", "round": int(rnd), "error": d["compile_error"]}))
EOF
}

: > "$tmp/runs.jsonl"
for r in $(seq "$rounds"); do
  echo "round $r/$rounds: megatron-cpp (load $(loadavg))" >&2
  run_ours "$r"
  echo "round $r/$rounds: pytorch (load $(loadavg))" >&2
  run_torch "$r"
done

date=$(date -u +%Y-%m-%d)
out="benchmarks/results/$date-cpu-cpu_tiny"
mkdir -p benchmarks/results
# MG_BENCH_COMMIT: the commit when run from an exported tree (git archive), which has no .git.
commit=${MG_BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
dirty=$(git status --porcelain -- megatron benchmarks pretrain_gpt.cpp 2>/dev/null | grep -qv '^??' &&
  echo "+dirty" || true)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
python3 - "$tmp/runs.jsonl" "$out" "$commit$dirty" "$cpu" "$threads" "$mb" "$warmup" "$steps" \
  "$rounds" "$date" "$(nproc)" <<'EOF'
import json, statistics, sys
runs_path, out, commit, cpu, threads, mb, warmup, steps, rounds, date, nproc = sys.argv[1:]
runs = [json.loads(l) for l in open(runs_path)]

def q(xs, p):  # linear-interpolated quantile
    xs = sorted(xs); k = (len(xs) - 1) * p; i = int(k)
    return xs[i] + (xs[min(i + 1, len(xs) - 1)] - xs[i]) * (k - i)

summary = {}
for impl in ("megatron-cpp", "pytorch-eager", "pytorch-compile"):
    rs = [r for r in runs if r["impl"] == impl and "step_ms" in r]
    if not rs:
        continue
    allms = [x for r in rs for x in r["step_ms"]]
    summary[impl] = {"median_ms": statistics.median(allms), "min_ms": min(allms),
                     "max_ms": max(allms), "p25_ms": q(allms, 0.25), "p75_ms": q(allms, 0.75),
                     "round_medians_ms": [statistics.median(r["step_ms"]) for r in rs],
                     "steps": len(allms),
                     "tokens_per_s": int(mb) * 256 / (statistics.median(allms) / 1e3)}
ratios = {}
ours = summary["megatron-cpp"]["median_ms"]
for impl in ("pytorch-eager", "pytorch-compile"):
    if impl in summary:
        ratios[impl] = summary[impl]["median_ms"] / ours
        # per round: the pair run back to back
        ratios[impl + "_per_round"] = [
            t / o for t, o in zip(summary[impl]["round_medians_ms"],
                                  summary["megatron-cpp"]["round_medians_ms"])]
config = {"workload": "cpu-tiny", "layers": 4, "hidden": 256, "heads": 8, "ffn": 1024, "seq": 256,
          "vocab": 50257, "padded_vocab": 50304, "micro_batch": int(mb), "global_batch": int(mb),
          "tokens_per_step": int(mb) * 256, "dtype": "f32", "dropout": 0,
          "activation": "gelu (tanh form)", "norm": "LayerNorm", "positions": "learned absolute",
          "tied_embeddings": True, "optimizer": "AdamW b1 0.9 b2 0.95 eps 1e-8 wd 0.1 (weights)",
          "clip_grad": 1.0, "warmup_steps": int(warmup), "timed_steps_per_round": int(steps),
          "rounds": int(rounds)}
doc = {"name": "cpu_tiny", "date": date, "commit": commit, "cpu": cpu, "nproc": int(nproc),
       "threads": int(threads), "command": "bash benchmarks/run_cpu_tiny.sh", "config": config,
       "summary": summary, "ratio_pytorch_over_ours": ratios, "runs": runs}
json.dump(doc, open(out + ".json", "w"), indent=1)

lines = [f"# cpu-tiny training step: Megatron-CPP vs PyTorch, {cpu}, {threads} threads", "",
         f"Commit {commit}, {date}. Command: `bash benchmarks/run_cpu_tiny.sh`. "
         f"GPT-2 spec, 4 layers, H 256, 8 heads, seq 256, vocab 50304 (padded), micro-batch {mb} "
         f"({int(mb) * 256} tokens/step), f32, AdamW, clip 1.0, no dropout. {rounds} alternating "
         f"rounds of {warmup} warm-up + {steps} timed steps per implementation; figures over all "
         f"timed steps. Full data in `{out.split('/')[-1]}.json`.", "",
         "| implementation | median ms/step | p25 | p75 | min | max | round medians | tokens/s |",
         "|---|---|---|---|---|---|---|---|"]
for impl, s in summary.items():
    lines.append(f"| {impl} | {s['median_ms']:.1f} | {s['p25_ms']:.1f} | {s['p75_ms']:.1f} | "
                 f"{s['min_ms']:.1f} | {s['max_ms']:.1f} | "
                 f"{', '.join(f'{x:.1f}' for x in s['round_medians_ms'])} | {s['tokens_per_s']:.0f} |")
lines.append("")
for impl in ("pytorch-eager", "pytorch-compile"):
    if impl in ratios:
        lines.append(f"- **{impl} / Megatron-CPP median step time: {ratios[impl]:.2f}x** "
                     f"(per round: {', '.join(f'{x:.2f}' for x in ratios[impl + '_per_round'])})")
for r in runs:
    if "error" in r:
        lines.append(f"- {r['impl']} round {r['round']}: failed: {r['error']}")
lines.append("- load average (1/5/15 min) before → after each run: " + "; ".join(
    f"{r['impl']} r{r['round']}: {r.get('loadavg_before')} → {r.get('loadavg_after')}"
    for r in runs if "loadavg_before" in r))
lines.append("- losses (first → last step): " + "; ".join(
    f"{r['impl']} r{r['round']}: {r['loss_first']:.3f} → {r['loss_last']:.3f}"
    for r in runs if "loss_first" in r))
t = next((r for r in runs if r["impl"] == "pytorch-eager"), None)
if t:
    lines.append(f"- PyTorch {t['torch']} (BLAS {t['torch_blas']}), {t['torch_threads']} threads; "
                 f"parameters: ours {next(r for r in runs if r['impl'] == 'megatron-cpp')['params']}"
                 f", PyTorch {t['params']}")
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
