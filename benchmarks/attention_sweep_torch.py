#!/usr/bin/env python3
"""PyTorch scaled-dot-product attention on the GPU: the baseline of the cuDNN attention sweep
(scripts/gpu_run_cudnn.sh), same shapes and FLOP convention as benchmarks/attention_bench.cpp on
CUDA: bf16, causal, 16k tokens per call (B = 16384 / S), NH = 2048 / HD, no GQA; forward
4 * B * NH * HD * S^2 / 2 FLOPs (causal), backward 2.5x, forward + backward 3.5x. Each PyTorch SDPA
backend that runs (flash, cudnn, efficient; `default` is PyTorch's own choice) is timed with CUDA
events: the median of --iters calls after --warmup.

  python3 benchmarks/attention_sweep_torch.py --hd 128 --seqs 1024,2048,4096 --out sweep.json
"""
import argparse
import json
import statistics
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--seqs", default="1024,2048,4096")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--device", default="cuda", help="cpu: a test of this script (tiny timings)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per call: B = tokens / S")
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    rows = []
    dev = torch.device(a.device)
    import time

    def timed(fn):
        if a.device != "cuda":
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / 1e3
    for s in [int(x) for x in a.seqs.split(",")]:
        b, nh, hd = max(1, a.tokens // s), 2048 // a.hd, a.hd
        g = torch.Generator(device=dev).manual_seed(1)
        q, k, v, do = (torch.empty(b, nh, s, hd, device=dev, dtype=torch.bfloat16)
                       .uniform_(-1, 1, generator=g).requires_grad_(i < 3) for i in range(4))
        fwd_flops = 4.0 * b * nh * hd * s * s / 2.0
        for name, be in backends.items():
            for mode in ("fwd", "bwd", "fwd+bwd"):
                def step():
                    if mode == "bwd":
                        torch.autograd.grad(saved, (q, k, v), do)
                        return
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    if mode == "fwd+bwd":
                        torch.autograd.grad(o, (q, k, v), do)
                try:
                    ctx = sdpa_kernel([be]) if be is not None else sdpa_kernel(list(backends.values())[1:])
                    with ctx:
                        saved = None
                        if mode == "bwd":
                            saved = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        for _ in range(a.warmup):
                            if mode == "bwd":
                                torch.autograd.grad(saved, (q, k, v), do, retain_graph=True)
                            else:
                                step()
                        if mode == "bwd":
                            def call():
                                torch.autograd.grad(saved, (q, k, v), do, retain_graph=True)
                        else:
                            call = step
                        times = [timed(call) for _ in range(a.iters)]
                except Exception as ex:  # a backend that does not serve the shape
                    rows.append({"backend": name, "S": s, "B": b, "NH": nh, "HD": hd, "mode": mode,
                                 "error": str(ex).splitlines()[0][:200]})
                    continue
                t = statistics.median(times)
                mult = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[mode]
                rows.append({"backend": name, "S": s, "B": b, "NH": nh, "HD": hd, "mode": mode,
                             "ms": t * 1e3, "tflops": mult * fwd_flops / t / 1e12})
    for r in rows:
        if "error" in r:
            print(f"torch-{r['backend']:9s} S {r['S']:5d} {r['mode']:8s} error: {r['error']}")
        else:
            print(f"torch-{r['backend']:9s} S {r['S']:5d} {r['mode']:8s} {r['ms']:8.3f} ms "
                  f"{r['tflops']:7.1f} TFLOP/s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"torch": torch.__version__, "cuda": torch.version.cuda,
                       "cudnn": torch.backends.cudnn.version(), "device": a.device, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
