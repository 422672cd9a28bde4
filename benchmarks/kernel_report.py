#!/usr/bin/env python3
"""Markdown tables from the Google Benchmark JSON of the kernel benchmarks (--benchmark_out=X.json):
  attention_bench      TFLOP/s per (S, B, NH, NG, HD, dtype, fwd / bwd / fwd+bwd), with the
                       flash-attention reference figures of PERFORMANCE.md beside the GPU rows
  gemm_bench           TFLOP/s of our gemm op and, where the binary has them (CUDA builds), of the
                       raw cublasGemmEx call on the same shape: ours / cuBLAS; the workload rows
                       named (gpt2-124m / llama-1b, QKV / proj / fc1 / fc2 / logits, fwd / dgrad
                       / wgrad)
  fused_kernels_bench  achieved GB/s and the fraction of the measured copy bandwidth (copy_frac)
Uses each benchmark's median aggregate when the run had repetitions, else the run itself.
    python3 benchmarks/kernel_report.py OUT.md a.json [b.json ...]
"""
import json
import os
import re
import sys

# FA3 paper, H100, causal, hdim 128 (PERFORMANCE.md): forward FA3 616, cuDNN 539, FA2 335; backward
# FA3 561, cuDNN 516, FA2 322 TFLOP/s.
FA_REF = {("fwd", 128): "FA3 616 / cuDNN 539 / FA2 335", ("bwd", 128): "FA3 561 / cuDNN 516 / FA2 322"}

WORKLOAD_LINEARS = {
    16384: ("gpt2-124m", {(768, 2304): "QKV", (768, 768): "proj", (768, 3072): "fc1",
                          (3072, 768): "fc2", (768, 50304): "logits"}),
    8192: ("llama-1b", {(2048, 3072): "QKV", (2048, 2048): "proj", (2048, 16384): "fc1",
                        (8192, 2048): "fc2", (2048, 32000): "logits"}),
}


def args_of(name):
    return {k: int(v) for k, v in re.findall(r"([A-Za-z0-9_%]+):(-?\d+)", name)}


def gemm_label(a):
    m, n, k, ta, tb = a["M"], a["N"], a["K"], a["ta"], a["tb"]
    if not ta and tb and m in WORKLOAD_LINEARS:
        w, lin = WORKLOAD_LINEARS[m]
        if (k, n) in lin:
            return f"{w} {lin[(k, n)]} fwd"
    if not ta and not tb and m in WORKLOAD_LINEARS:
        w, lin = WORKLOAD_LINEARS[m]
        if (n, k) in lin:
            return f"{w} {lin[(n, k)]} dgrad"
    if ta and not tb and k in WORKLOAD_LINEARS:
        w, lin = WORKLOAD_LINEARS[k]
        if (n, m) in lin:
            return f"{w} {lin[(n, m)]} wgrad"
    return f"{m}x{n}x{k}" + (" ta" if ta else "") + (" tb" if tb else "")


def load(path):
    d = json.load(open(path))
    runs = {}
    for b in d.get("benchmarks", []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        key = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate" or key not in runs:
            runs[key] = b
    return d.get("context", {}), list(runs.values())


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, paths = sys.argv[1], sys.argv[2:]
    L = []
    for path in paths:
        base = os.path.basename(path)
        try:
            ctx, runs = load(path)
        except (OSError, ValueError) as e:  # a run that crashed mid-way leaves a cut JSON
            L += [f"## {base}", "", f"unreadable ({type(e).__name__}: {e}): the benchmark "
                  "probably crashed; see its .txt", ""]
            continue
        L += [f"## {base}", "",
              f"host {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs, "
              f"date {ctx.get('date', '?')}", ""]
        errors = [r for r in runs if r.get("error_occurred")]
        runs = [r for r in runs if not r.get("error_occurred")]
        names = " ".join(r.get("run_name", r["name"]) for r in runs + errors)
        if "attention/" in names:
            L += ["| S | B | NH | NG | HD | dtype | pass | ms | TFLOP/s | FA reference (H100) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
            for r in runs:
                a = args_of(r["run_name"] if "run_name" in r else r["name"])
                mode = {0: "fwd", 1: "fwd+bwd", 2: "bwd"}.get(a.get("mode", a.get("bwd", 0)))
                if "mode" not in a and "bwd" in a:
                    mode = "fwd+bwd" if a["bwd"] else "fwd"
                ref = FA_REF.get((mode, a.get("HD", 64)), "") if a.get("NH") == a.get("NG") else ""
                L.append(f"| {a.get('S')} | {a.get('B')} | {a.get('NH')} | {a.get('NG')} | "
                         f"{a.get('HD', 64)} | {'bf16' if a.get('bf16') else 'f32'} | {mode} | "
                         f"{r['real_time']:.3f} {r['time_unit']} | {r.get('FLOP/s', 0) / 1e12:.3g} "
                         f"| {ref} |")
        elif "BM_gemm" in names:
            ours = {}
            cublas = {}
            for r in runs:
                name = r.get("run_name", r["name"])
                fam, _, _ = name.partition("/")
                kind = fam.replace("BM_gemm_", "").replace("BM_cublas_", "").replace(
                    "_workload", "")
                if kind == "epilogue":
                    kind = "bf16 + " + r.get("label", "epilogue")
                key = (kind, tuple(sorted(args_of(name).items())))
                (cublas if fam.startswith("BM_cublas") else ours)[key] = r
            L += ["| shape | A,B -> C | ms | ours TFLOP/s | cuBLAS TFLOP/s | ours / cuBLAS |",
                  "|---|---|---|---|---|---|"]
            for key, r in ours.items():
                kind, args = key
                a = dict(args)
                c = cublas.get(key)
                ct = c.get("FLOP/s", 0) / 1e12 if c else None
                ot = r.get("FLOP/s", 0) / 1e12
                L.append(f"| {gemm_label(a)} | {kind.replace('_into_', ' -> ')} | "
                         f"{r['real_time']:.3f} {r['time_unit']} | {ot:.3g} | "
                         f"{'—' if ct is None else f'{ct:.3g}'} | "
                         f"{'—' if not ct else f'{ot / ct:.2f}'} |")
        elif "BM_copy" in names:
            L += ["| kernel | args | time | GB/s | of copy bandwidth |", "|---|---|---|---|---|"]
            for r in runs:
                name = r.get("run_name", r["name"])
                a = args_of(name)
                L.append(f"| {r.get('label', name.split('/')[0])} | "
                         f"{', '.join(f'{k} {v}' for k, v in a.items())} | "
                         f"{r['real_time']:.1f} {r['time_unit']} | "
                         f"{r.get('bytes/s', 0) / 1e9:.3g} | {r.get('copy_frac', 0):.2f} |")
        else:
            L += ["| benchmark | time |", "|---|---|"]
            for r in runs:
                L.append(f"| {r['name']} | {r['real_time']:.3f} {r['time_unit']} |")
        if errors:
            L += ["", f"{len(errors)} skipped/failed: " + "; ".join(
                sorted({r.get('error_message', '?') for r in errors}))]
        L.append("")
    open(out, "w").write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
