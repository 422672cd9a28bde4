#!/usr/bin/env python3
"""The cpu-tiny workload in PyTorch on the CPU: the peer of `pretrain_gpt --mock-data` in
benchmarks/run_cpu_tiny.sh.

The model is the one Megatron-CPP builds from the GPT-2 layer spec with the flags run_cpu_tiny.sh
passes: word + learned absolute position embeddings, L pre-LayerNorm layers (LayerNorm -> QKV linear
with bias -> causal softmax attention, scale 1/sqrt(HD) -> output linear with bias -> residual;
LayerNorm -> fc1 with bias -> GELU (tanh approximation: Megatron's fused bias-GELU) -> fc2 with
bias -> residual), final LayerNorm, output layer tied to the word embedding, token-mean cross entropy.
No dropout. f32. AdamW with weight decay on the weights only (not biases, norms), the global grad
norm clipped to --clip-grad. One timed step = zero_grad + forward + backward + clip + optimizer step.

Prints one JSON object on stdout: config, threads, per-step times (ms) of each variant.
Needs torch (and numpy for nothing): a venv outside the repository, e.g.
    python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch numpy
It is a peer for the benchmark, never a build dependency.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, nh, ffn, eps):
        super().__init__()
        self.nh = nh
        self.ln1 = nn.LayerNorm(h, eps=eps)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h, eps=eps)
        self.fc1 = nn.Linear(h, ffn)
        self.fc2 = nn.Linear(ffn, h)

    def forward(self, x):  # x: [B, S, H]
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q = q.view(b, s, self.nh, -1).transpose(1, 2)
        k = k.view(b, s, self.nh, -1).transpose(1, 2)
        v = v.view(b, s, self.nh, -1).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(a.padded_vocab, a.hidden)
        self.wpe = nn.Embedding(a.seq, a.hidden)
        self.blocks = nn.ModuleList(
            Block(a.hidden, a.heads, a.ffn, a.eps) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.hidden, eps=a.eps)
        std = a.init_std
        for n, p in self.named_parameters():
            if n.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in n:
                nn.init.ones_(p)
            elif n.endswith("proj.weight") or n.endswith("fc2.weight"):
                nn.init.normal_(p, 0.0, std / math.sqrt(2.0 * a.layers))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        s = idx.shape[1]
        pos = torch.arange(s, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output layer
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def run(a, compiled):
    torch.manual_seed(a.seed)
    model = GPT(a)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(a.beta1, a.beta2), eps=a.adam_eps)
    fwd = torch.compile(model) if compiled else model
    g = torch.Generator().manual_seed(a.seed)
    # Random tokens (never zeros); a fresh batch per step, drawn outside the timed region.
    batches = [torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=g)
               for _ in range(4)]
    times, losses = [], []
    t_first = None
    for i in range(a.warmup + a.steps):
        tok = batches[i % len(batches)]
        idx, tgt = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad)
        opt.step()
        dt = (time.perf_counter() - t0) * 1e3
        if i == 0:
            t_first = dt
        if i >= a.warmup:
            times.append(dt)
        losses.append(loss.item())
    return {"impl": "pytorch-compile" if compiled else "pytorch-eager",
            "first_step_ms": t_first, "step_ms": times,
            "median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "loss_first": losses[0], "loss_last": losses[-1],
            "params": sum(p.numel() for p in model.parameters())}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=None)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--padded-vocab", type=int, default=50304)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--compile", action="store_true", help="also time torch.compile")
    a = p.parse_args()
    a.ffn = a.ffn or 4 * a.hidden
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(),
           "mkldnn": torch.backends.mkldnn.is_available(),
           "blas": torch.__config__.show().split("BLAS_INFO=")[-1].split(",")[0]
           if "BLAS_INFO=" in torch.__config__.show() else "?",
           "config": {k: v for k, v in vars(a).items() if k != "compile"},
           "runs": [run(a, False)]}
    if a.compile:
        try:
            out["runs"].append(run(a, True))
        except Exception as e:  # a compiler missing or failing on this host: report, don't die
            out["compile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
