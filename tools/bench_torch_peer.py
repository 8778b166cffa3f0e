#!/usr/bin/env python3
"""Peer baseline for the CUDA backend benchmark: a plain PyTorch decoder of the
same shapes, written the gpt-fast way (static KV cache, whole-step
torch.compile(mode="reduce-overhead", fullgraph=True), i.e. CUDA graphs), bf16,
batch 1, greedy decode with the next token fed back on the GPU.

Random weights are generated on the GPU (no files). Time per token = wall time
of T consecutive decode steps (synchronized at the end) / T, context starting
at --context tokens of random KV.

Coordination with tools/gpu_check.sh (so that compile time overlaps our build
but timings do not overlap our benchmark): with --ready-file/--go-file the
script compiles and warms every shape, touches the ready file, waits for the
go file, then times.

Usage: bench_torch_peer.py [--shapes llama3-8b,qwen2.5-1.5b,qwen2.5-0.5b]
       [--context 512] [--steps 100] [--json out.json] [--ready-file F --go-file G]
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {
    "llama3-8b": dict(
        vocab=128256,
        hidden=4096,
        inter=14336,
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        bias=False,
        tie=False,
        theta=500000.0,
    ),
    "qwen2.5-1.5b": dict(
        vocab=151936,
        hidden=1536,
        inter=8960,
        layers=28,
        heads=12,
        kv_heads=2,
        head_dim=128,
        bias=True,
        tie=True,
        theta=1000000.0,
    ),
    "qwen2.5-0.5b": dict(
        vocab=151936,
        hidden=896,
        inter=4864,
        layers=24,
        heads=14,
        kv_heads=2,
        head_dim=64,
        bias=True,
        tie=True,
        theta=1000000.0,
    ),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


class KVCache(nn.Module):
    def __init__(self, max_seq, kv_heads, head_dim, dtype):
        super().__init__()
        shape = (1, kv_heads, max_seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype))
        self.register_buffer("v", torch.zeros(shape, dtype=dtype))

    def update(self, pos, k, v):
        self.k[:, :, pos] = k
        self.v[:, :, pos] = v
        return self.k, self.v


def rope(x, cos, sin):
    # NeoX / HF rotate_half style; x [1, h, 1, d]
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, s, max_seq):
        super().__init__()
        self.h, self.kvh, self.d = s["heads"], s["kv_heads"], s["head_dim"]
        self.wqkv = nn.Linear(s["hidden"], (self.h + 2 * self.kvh) * self.d, bias=s["bias"])
        self.wo = nn.Linear(self.h * self.d, s["hidden"], bias=False)
        self.cache = KVCache(max_seq, self.kvh, self.d, torch.bfloat16)

    def forward(self, x, cos, sin, mask, pos):
        qkv = self.wqkv(x)
        q, k, v = qkv.split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q = q.view(1, 1, self.h, self.d).transpose(1, 2)
        k = k.view(1, 1, self.kvh, self.d).transpose(1, 2)
        v = v.view(1, 1, self.kvh, self.d).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        kc, vc = self.cache.update(pos, k, v)
        kc = kc.repeat_interleave(self.h // self.kvh, dim=1)
        vc = vc.repeat_interleave(self.h // self.kvh, dim=1)
        o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
        return self.wo(o.transpose(1, 2).reshape(1, 1, self.h * self.d))


class FeedForward(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.w1 = nn.Linear(s["hidden"], s["inter"], bias=False)
        self.w3 = nn.Linear(s["hidden"], s["inter"], bias=False)
        self.w2 = nn.Linear(s["inter"], s["hidden"], bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, s, max_seq):
        super().__init__()
        self.attn = Attention(s, max_seq)
        self.ffn = FeedForward(s)
        self.n1 = RMSNorm(s["hidden"])
        self.n2 = RMSNorm(s["hidden"])

    def forward(self, x, cos, sin, mask, pos):
        x = x + self.attn(self.n1(x), cos, sin, mask, pos)
        return x + self.ffn(self.n2(x))


class Transformer(nn.Module):
    def __init__(self, s, max_seq):
        super().__init__()
        self.emb = nn.Embedding(s["vocab"], s["hidden"])
        self.layers = nn.ModuleList(Block(s, max_seq) for _ in range(s["layers"]))
        self.norm = RMSNorm(s["hidden"])
        self.out = nn.Linear(s["hidden"], s["vocab"], bias=False)
        if s["tie"]:
            self.out.weight = self.emb.weight
        d = s["head_dim"]
        inv = 1.0 / (s["theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        t = torch.arange(max_seq, dtype=torch.float32)
        fr = torch.outer(t, inv)  # [max_seq, head_dim/2]
        self.register_buffer("cos", fr.cos().to(torch.bfloat16))
        self.register_buffer("sin", fr.sin().to(torch.bfloat16))
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)))

    def forward(self, tok, pos):
        x = self.emb(tok)  # [1, 1, hidden]
        cos = self.cos[pos].view(1, 1, 1, -1)
        sin = self.sin[pos].view(1, 1, 1, -1)
        mask = self.causal[pos].view(1, 1, 1, -1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, pos)
        return self.out(self.norm(x))


def decode_one_token(model, tok, pos):
    logits = model(tok, pos)
    return torch.argmax(logits[:, -1], dim=-1, keepdim=True).to(torch.int64)


def weight_bytes(s):
    h, i, d = s["hidden"], s["inter"], s["head_dim"]
    per_layer = h * (s["heads"] + 2 * s["kv_heads"]) * d + s["heads"] * d * h + 3 * h * i
    return 2 * (s["layers"] * per_layer + s["vocab"] * h)


def build(name, context, steps):
    s = SHAPES[name]
    max_seq = context + steps + 8
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = Transformer(s, max_seq).to(torch.bfloat16)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.02)
        for blk in m.layers:
            blk.attn.cache.k[:, :, :context].normal_()
            blk.attn.cache.v[:, :, :context].normal_()
    m.eval()
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b,llama3-8b")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--json", default="")
    ap.add_argument("--ready-file", default="")
    ap.add_argument("--go-file", default="")
    ap.add_argument("--go-timeout", type=float, default=480.0)
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = True
    step_fn = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
    results = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "context": args.context,
        "steps": args.steps,
        "shapes": {},
    }
    models = {}
    with torch.no_grad():
        for name in args.shapes.split(","):
            t0 = time.time()
            m = build(name, args.context, args.steps)
            tok = torch.tensor([[1234]], device="cuda", dtype=torch.int64)
            for i in range(4):  # compile + graph capture
                pos = torch.tensor([args.context + i], device="cuda", dtype=torch.int64)
                torch.compiler.cudagraph_mark_step_begin()
                tok = step_fn(m, tok, pos).clone()
            torch.cuda.synchronize()
            results["shapes"][name] = {
                "compile_and_warmup_s": round(time.time() - t0, 2),
                "weight_bytes": weight_bytes(SHAPES[name]),
            }
            print(f"peer {name}: compiled and warmed in {time.time() - t0:.1f} s", flush=True)
            models[name] = m

        if args.ready_file:
            open(args.ready_file, "w").close()
        if args.go_file:
            t0 = time.time()
            while not os.path.exists(args.go_file):
                if time.time() - t0 > args.go_timeout:
                    print("peer: go file never came; timing anyway", flush=True)
                    break
                time.sleep(0.2)

        for name, m in models.items():
            tok = torch.tensor([[1234]], device="cuda", dtype=torch.int64)
            poss = [torch.tensor([args.context + i], device="cuda", dtype=torch.int64) for i in range(args.steps)]
            for i in range(5):
                torch.compiler.cudagraph_mark_step_begin()
                tok = step_fn(m, tok, poss[i]).clone()
            torch.cuda.synchronize()
            reps = []
            for _ in range(3):
                t0 = time.perf_counter()
                for i in range(args.steps):
                    # as gpt-fast: the next token is cloned out of the graph's output buffer
                    torch.compiler.cudagraph_mark_step_begin()
                    tok = step_fn(m, tok, poss[i]).clone()
                torch.cuda.synchronize()
                reps.append((time.perf_counter() - t0) / args.steps * 1e3)
            ms = sorted(reps)[1]
            r = results["shapes"][name]
            r["ms_per_token"] = round(ms, 4)
            r["ms_per_token_reps"] = [round(x, 4) for x in reps]
            print(
                f"peer {name}: {ms:.4f} ms/token (torch.compile reduce-overhead, batch 1, context {args.context})",
                flush=True,
            )

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
