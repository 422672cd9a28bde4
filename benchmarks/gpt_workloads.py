"""The workloads of PERFORMANCE.md as benchmarks/torch_gpt.py and run_gpu_e2e.sh build them, and
Megatron's training FLOP formula (no torch needed: the e2e script's report imports this)."""


WORKLOADS = {
    # name: (arch, layers, hidden, heads, query groups, ffn, seq, vocab padded)
    "gpt2-124m": dict(arch="gpt2", layers=12, hidden=768, heads=12, groups=12, ffn=3072,
                      seq=1024, vocab=50257, padded_vocab=50304, micro_batch=16),
    "llama-1b": dict(arch="llama", layers=16, hidden=2048, heads=32, groups=8, ffn=8192,
                     seq=2048, vocab=32000, padded_vocab=32000, micro_batch=4),
    # The e2e script's --cpu-tiny shapes: the whole pipeline on the CPU in seconds.
    "gpt2-tiny": dict(arch="gpt2", layers=2, hidden=64, heads=4, groups=4, ffn=256, seq=64,
                      vocab=1000, padded_vocab=1024, micro_batch=2),
    "llama-tiny": dict(arch="llama", layers=2, hidden=64, heads=4, groups=2, ffn=128, seq=64,
                       vocab=1024, padded_vocab=1024, micro_batch=2),
}


def num_flops(arch, layers, hidden, heads, groups, ffn, seq, padded_vocab, batch, kv_channels=None):
    """Megatron's num_floating_point_operations (core >= 0.12, dense), as gpt_flops.cpp: per step
    B*S*(12 L H F g + 12 L H^2 (1 + NG/NH + S/(2H)) (NH*HD/H) + 6 H V)."""
    hd = kv_channels or hidden // heads
    gated = 1.5 if arch == "llama" else 1.0
    query_ratio = heads * hd / hidden
    expansion = 3.0 * 2.0 * 2.0
    mlp = expansion * layers * hidden * ffn * gated
    attn = expansion * layers * hidden * hidden * (
        (1.0 + groups / heads + seq / hidden / 2.0) * query_ratio)
    logits = 3.0 * 2.0 * hidden * padded_vocab
    return float(batch) * seq * (mlp + attn + logits)
