#!/usr/bin/env python3
"""The PyTorch peer of `pretrain_gpt --bf16 --mock-data` for the GPU workloads of PERFORMANCE.md
(gpt2-124m, llama-1b), run by benchmarks/run_gpu_e2e.sh on the same GPU in the same script. Also
runs on the CPU with tiny shapes (the e2e script's --cpu-tiny mode), which is how it is tested
without a GPU.

Models (the same shapes and parameter count as the Megatron-CPP model that pretrain_gpt builds
from the flags run_gpu_e2e.sh passes; the script checks the two counts):
  gpt2   word + learned absolute position embeddings; L pre-LayerNorm layers: LayerNorm -> QKV
         linear with bias -> causal attention -> proj with bias -> residual; LayerNorm -> fc1 with
         bias -> GELU (tanh form: Megatron's bias-GELU fusion) -> fc2 with bias -> residual; final
         LayerNorm; output layer tied to the word embedding.
  llama  word embedding only; RMSNorm; QKV without bias, grouped-query attention (NG key/value
         heads), rotary embeddings (non-interleaved halves, base 10000) on q and k; SwiGLU MLP
         (fc1 H -> 2F = [gate | up], silu(gate) * up, fc2 F -> H) without biases; final RMSNorm;
         untied output layer.
  Both: token-mean cross entropy, no dropout, AdamW (weight decay on >= 2-D weights only), the
  global grad norm clipped to --clip-grad.

Precision: bf16 autocast over fp32 parameters, fp32 grads and fp32 AdamW state (PyTorch's standard
mixed-precision recipe, as llm.c's and nanoGPT's PyTorch baselines use). Megatron-CPP --bf16 keeps
bf16 parameters plus fp32 main grads and fp32 master weights and moments: both run every GEMM and
attention in bf16 with fp32 accumulation and update fp32 master copies, so the arithmetic per step
is the same; memory differs slightly (16 B/param + autocast's bf16 weight copies vs 18 B/param).
Attention: F.scaled_dot_product_attention with is_causal, restricted on CUDA to the flash backend
(--sdpa-backend, default flash); GQA expands K/V to NH heads first (repeat_interleave, as
torchtitan's llama does), since the flash backend's enable_gqa support varies by version.
Optimizer: torch.optim.AdamW(fused=True) on CUDA (foreach on the CPU).

Timing (PERFORMANCE.md): --warmup untimed steps, then --steps timed steps; a step is zero_grad +
forward + backward + clip_grad_norm_ + AdamW.step, bracketed by device synchronisation and timed
with perf_counter (the same wall-clock step pretrain_gpt's log reports with --log-interval 1).
Median, min, max, quartiles. Batches are random tokens (never zeros), made before the timed region.
Peak memory: torch.cuda.max_memory_allocated over the run (reset before the model is built).

FLOPs: num_flops() is Megatron's formula exactly as megatron/core/models/gpt/gpt_flops.cpp computes
it (the figure pretrain_gpt's "throughput per GPU (TFLOP/s/GPU)" divides by the step time), and it
is checked at start against a count from the model's own Linear shapes (hand_count_flops). MFU =
TFLOP/s / --peak-tflops (default 989 on an H100/H200, none elsewhere).

Prints one JSON object on stdout (or writes --out).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_workloads import WORKLOADS, num_flops  # noqa: E402


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.arch, self.nh, self.ng, self.hd = a.arch, a.heads, a.groups, a.hidden // a.heads
        llama = a.arch == "llama"
        norm = (lambda: nn.RMSNorm(a.hidden, eps=a.eps)) if llama else (
            lambda: nn.LayerNorm(a.hidden, eps=a.eps))
        self.ln1, self.ln2 = norm(), norm()
        self.qkv = nn.Linear(a.hidden, (self.nh + 2 * self.ng) * self.hd, bias=not llama)
        self.proj = nn.Linear(self.nh * self.hd, a.hidden, bias=not llama)
        self.fc1 = nn.Linear(a.hidden, (2 if llama else 1) * a.ffn, bias=not llama)
        self.fc2 = nn.Linear(a.ffn, a.hidden, bias=not llama)

    def forward(self, x, rope):  # x: [B, S, H]; rope: (cos, sin) [S, HD/2] or None
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(
            [self.nh * self.hd, self.ng * self.hd, self.ng * self.hd], dim=2)
        q = q.view(b, s, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, s, self.ng, self.hd).transpose(1, 2)
        v = v.view(b, s, self.ng, self.hd).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.ng != self.nh:
            k = k.repeat_interleave(self.nh // self.ng, dim=1)
            v = v.repeat_interleave(self.nh // self.ng, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, self.nh * self.hd))
        h = self.fc1(self.ln2(x))
        if self.arch == "llama":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return x + self.fc2(h)


def apply_rope(x, cos, sin):  # x [B, NH, S, HD]; rotate halves (Megatron's non-interleaved form)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.arch = a.arch
        self.wte = nn.Embedding(a.padded_vocab, a.hidden)
        self.wpe = nn.Embedding(a.seq, a.hidden) if a.arch == "gpt2" else None
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.ln_f = nn.RMSNorm(a.hidden, eps=a.eps) if a.arch == "llama" else nn.LayerNorm(
            a.hidden, eps=a.eps)
        self.out = nn.Linear(a.hidden, a.padded_vocab, bias=False) if a.arch == "llama" else None
        hd = a.hidden // a.heads
        if a.arch == "llama":
            inv = 1.0 / (a.rotary_base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            ang = torch.outer(torch.arange(a.seq, dtype=torch.float32), inv)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)
        for n, p in self.named_parameters():  # Megatron's init: N(0, std), scaled for outputs
            if n.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in n:
                nn.init.ones_(p)
            elif n.endswith("proj.weight") or n.endswith("fc2.weight"):
                nn.init.normal_(p, 0.0, a.init_std / math.sqrt(2.0 * a.layers))
            else:
                nn.init.normal_(p, 0.0, a.init_std)

    def forward(self, idx, targets):
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        rope = (self.cos, self.sin) if self.arch == "llama" else None
        for blk in self.blocks:
            x = blk(x, rope)
        x = self.ln_f(x)
        logits = self.out(x) if self.out is not None else F.linear(x, self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))  # f32 by autocast


def hand_count_flops(model, a, batch):
    """FLOPs of one training step counted from the model itself: 6 per weight element of every
    matmul (the Linear layers and the logits, tied or not) per token, plus core attention
    (QK^T and PV: 2 * 2 * NH * HD per allowed (query, key) pair, S/2 pairs per query on average
    with the causal halving, times 3 for forward + backward)."""
    tokens = batch * a.seq
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    if model.out is None:
        matmul += model.wte.weight.numel()  # tied logits
    attn = a.layers * 3 * 2 * 2 * a.heads * (a.hidden // a.heads) * (a.seq / 2)
    return 6.0 * tokens * matmul + tokens * attn


def device_name(dev):
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return "cpu"


def run(a, compiled, dev):
    torch.manual_seed(a.seed)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    model = GPT(a).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt_kw = {"fused": True} if dev.type == "cuda" else {"foreach": True}
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(a.beta1, a.beta2), eps=a.adam_eps, **opt_kw)
    fwd = torch.compile(model) if compiled else model
    g = torch.Generator().manual_seed(a.seed)
    batches = []
    for _ in range(4):
        tok = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=g)
        batches.append((tok[:, :-1].contiguous().to(dev), tok[:, 1:].contiguous().to(dev)))
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    times, losses = [], []
    first_ms = None
    sync()
    for i in range(a.warmup + a.steps):
        idx, tgt = batches[i % len(batches)]
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad, foreach=True)
        opt.step()
        sync()
        dt = (time.perf_counter() - t0) * 1e3
        if i == 0:
            first_ms = dt
        if i >= a.warmup:
            times.append(dt)
        losses.append(loss.item())  # after the timer: the step's own sync is the one above
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    med = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [med, med, med]
    tokens = a.micro_batch * a.seq
    tflops = a.flops / (med / 1e3) / 1e12
    return {"impl": "pytorch-compile" if compiled else "pytorch-eager",
            "first_step_ms": first_ms, "step_ms": times, "median_ms": med, "min_ms": min(times),
            "max_ms": max(times), "p25_ms": q[0], "p75_ms": q[2],
            "tokens_per_s": tokens / (med / 1e3), "tflops": tflops,
            "mfu": tflops / a.peak_tflops if a.peak_tflops else None,
            "peak_mem_mb": peak / 2**20 if peak is not None else None,
            "loss_first": losses[0], "loss_last": losses[-1],
            "params": sum(p.numel() for p in model.parameters())}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="gpt2-124m")
    for k in ("layers", "hidden", "heads", "groups", "ffn", "seq", "vocab", "padded-vocab",
              "micro-batch"):
        p.add_argument("--" + k, type=int, default=None, help="override the workload's value")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16",
                   help="bf16: autocast over fp32 params (default); f32: no autocast")
    p.add_argument("--modes", default="eager,compile", help="comma list of eager, compile")
    p.add_argument("--sdpa-backend", choices=["flash", "cudnn", "efficient", "any"],
                   default="flash", help="CUDA SDPA backend allowed (default flash)")
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--rotary-base", type=float, default=10000.0)
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for MFU (default 989 on an H100/H200)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default=None, help="write the JSON here instead of stdout")
    a = p.parse_args()
    w = dict(WORKLOADS[a.workload])
    for k in list(w):
        v = getattr(a, k, None)
        if v is not None:
            w[k] = v
    for k, v in w.items():
        setattr(a, k, v)
    if a.hidden % a.heads or a.heads % a.groups:
        p.error(f"--hidden {a.hidden} must divide by --heads {a.heads}, and --heads by --groups "
                f"{a.groups}")
    if a.arch == "gpt2" and a.groups != a.heads:
        p.error("gpt2 has no grouped-query attention: --groups must equal --heads")
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    modes = [m for m in a.modes.split(",") if m]
    if not modes or any(m not in ("eager", "compile") for m in modes):
        p.error(f"--modes {a.modes!r}: a comma list of eager, compile")
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.threads:
        torch.set_num_threads(a.threads)
    name = device_name(dev)
    if a.peak_tflops is None and ("H100" in name or "H200" in name):
        a.peak_tflops = 989.0
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # bf16 GEMMs either way; f32 stays f32
        b = a.sdpa_backend
        torch.backends.cuda.enable_flash_sdp(b in ("flash", "any"))
        torch.backends.cuda.enable_cudnn_sdp(b in ("cudnn", "any"))
        torch.backends.cuda.enable_mem_efficient_sdp(b in ("efficient", "any"))
        torch.backends.cuda.enable_math_sdp(b == "any")
    a.flops = num_flops(a.arch, a.layers, a.hidden, a.heads, a.groups, a.ffn, a.seq,
                        a.padded_vocab, a.micro_batch)
    # The formula against a count from the model's own shapes (built on the meta device: free).
    with torch.device("meta"):
        counted = hand_count_flops(GPT(a), a, a.micro_batch)
    if abs(counted - a.flops) > 1e-9 * a.flops:
        sys.exit(f"torch_gpt: FLOP formula {a.flops:.6e} != count from the model {counted:.6e}")
    out = {"torch": torch.__version__, "device": name, "device_type": dev.type,
           "cuda": torch.version.cuda, "threads": torch.get_num_threads(),
           "config": {k: v for k, v in vars(a).items() if k not in ("out",)},
           "flops_per_step": a.flops, "tokens_per_step": a.micro_batch * a.seq, "runs": []}
    for m in modes:
        try:
            out["runs"].append(run(a, m == "compile", dev))
        except Exception as e:  # a compiler missing or failing on this host: report, don't die
            out["runs"].append({"impl": f"pytorch-{m}",
                                "error": f"{type(e).__name__}: {str(e)[:400]}"})
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    text = json.dumps(out)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
