#!/usr/bin/env python3
"""PyTorch reference for `llmtrain bench`: the same LLaMA-style Transformer (docs/spec/
layers-ssm-attn.md section 3: RMSNorm pre-norm blocks, MHA with rotate-half RoPE over the full
head dim, SwiGLU, untied LM head, no biases), built from one of our JSON configs and timed on
random tokens with the same step (forward, backward, global-norm clip, AdamW).

Not part of the training path or the tests: it exists to compare speed on the same GPU.
Usage: python3 bench/torch_reference.py --config configs/mdn-paper/400m/transformer.json
           [--micro-batch N] [--steps 10] [--warmup 2] [--dtype bf16|fp32] [--compile]
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope(x, cos, sin):  # x [B, H, T, Dh]; rotate-half
    x0, x1 = x.chunk(2, dim=-1)
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)


class Block(torch.nn.Module):
    def __init__(self, d, heads, head_dim, ffn, eps):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.attn_norm, self.mlp_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.q, self.k, self.v = (torch.nn.Linear(d, inner, bias=False) for _ in range(3))
        self.o = torch.nn.Linear(inner, d, bias=False)
        self.gate, self.up = torch.nn.Linear(d, ffn, bias=False), torch.nn.Linear(d, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        u = self.attn_norm(x)
        split = lambda t: t.view(B, T, self.heads, self.head_dim).transpose(1, 2)
        q, k, v = split(self.q(u)), split(self.k(u)), split(self.v(u))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, -1))
        u = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(u)) * self.up(u))


class Model(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        d, a = m["d_model"], m["attn"]
        eps = m.get("norm", {}).get("eps", 1e-6)
        self.emb = torch.nn.Embedding(m["vocab_size"], d)
        self.blocks = torch.nn.ModuleList(
            Block(d, a["num_heads"], a["head_dim"], m["mlp"]["intermediate_size"], eps) for _ in range(m["n_layers"]))
        self.norm = RMSNorm(d, eps)
        self.head = torch.nn.Linear(d, m["vocab_size"], bias=False)
        self.theta, self.head_dim = a.get("rope_theta", 10000.0), a["head_dim"]
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=m.get("init", {}).get("std", 0.02))

    def forward(self, ids, targets):
        T = ids.shape[1]
        inv = self.theta ** (-torch.arange(0, self.head_dim, 2, device=ids.device, dtype=torch.float32) / self.head_dim)
        phi = torch.arange(T, device=ids.device, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = phi.cos(), phi.sin()
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--micro-batch", type=int)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    args = ap.parse_args()
    cfg = json.load(open(args.config))
    m, t = cfg["model"], cfg["train"]
    B, T = args.micro_batch or t["micro_batch"], t["seq_len"]
    torch.manual_seed(0)
    model = Model(m).cuda()
    step_model = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t.get("betas", [0.9, 0.95])),
                            eps=t.get("eps", 1e-8), weight_decay=t.get("weight_decay", 0.1), fused=True)
    ids = torch.randint(0, m["vocab_size"], (B, T + 1), device="cuda")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=args.dtype == "bf16"):
            loss = step_model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.get("grad_clip", 1.0))
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step().item()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    n_emb = m["vocab_size"] * m["d_model"]
    n_total = sum(p.numel() for p in model.parameters())
    a = m["attn"]
    flops_per_token = 6 * (n_total - n_emb) + 12 * m["n_layers"] * a["num_heads"] * a["head_dim"] * T
    tps = B * T / med
    print(f"torch reference {args.config}: {args.dtype}{' compiled' if args.compile else ''}, {n_total} params, "
          f"micro_batch {B} x seq_len {T}")
    print(f"median step {med:.4f} s; tokens/s {tps:.0f}; {flops_per_token * tps / 1e12:.1f} TFLOP/s; "
          f"MFU {100 * flops_per_token * tps / (args.peak_tflops * 1e12):.1f}% of {args.peak_tflops}; "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
