#!/usr/bin/env python3
"""Trains a small GPT-style language model under a pebble plan, beside eager PyTorch.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch/lm.py \\
        [--layers 4] [--dim 128] [--heads 4] [--seq 128] [--batch 16] \\
        [--policy rotor] [--budget 50%] [--steps 20] [--device cpu|cuda]

The model is written with torch.nn as users write it: token and position
embeddings, a head tied to the token embedding, causal attention masked with
masked_fill, dropout, GELU and layer norms. The text is a fixed synthetic
corpus (no download). Both copies start from the same weights, see the same
batches and draw the same dropout masks (the same torch.manual_seed), and
train with AdamW; the script prints both losses per step (equal but for
rounding), then each one's step peak as the allocator measured it
(pebble.torch.measure) and its median step time.
"""

import argparse
import copy
import math
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import pebble.torch as pt


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, seq, dropout):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("tril", torch.tril(torch.ones(seq, seq)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.tril[:t, :t] == 0, float("-inf"))
        y = self.drop(F.softmax(att, dim=-1)) @ v
        return self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class Block(nn.Module):
    def __init__(self, dim, heads, seq, dropout):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, seq, dropout)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq, dropout=0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, seq, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx):
        x = self.drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def corpus(length, vocab, seed=0):
    """A learnable synthetic text: a few random 'words' repeated in random order."""
    g = torch.Generator().manual_seed(seed)
    words = [torch.randint(1, vocab, (int(torch.randint(3, 9, (1,), generator=g)),),
                           generator=g) for _ in range(40)]
    pieces, n = [], 0
    while n < length:
        w = words[int(torch.randint(0, len(words), (1,), generator=g))]
        pieces += [w, torch.zeros(1, dtype=torch.long)]
        n += len(w) + 1
    return torch.cat(pieces)[:length]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--policy", default="rotor")
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)

    torch.manual_seed(0)
    model = Gpt(args.vocab, args.dim, args.heads, args.layers, args.seq).to(device).train()
    text = corpus(args.batch * (args.seq + 1) * args.steps, args.vocab).to(device)
    windows = text[:args.batch * args.steps * (args.seq + 1)].view(
        args.steps, args.batch, args.seq + 1)
    batches = [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows]

    eager, planned = copy.deepcopy(model), copy.deepcopy(model)
    x0, y0 = batches[0]
    try:
        # measure="never": the script measures every step itself, as it does eager's.
        step = pt.train_step(planned, lm_loss, x0, y0, policy=args.policy, budget=args.budget,
                             measure="never")
    except ValueError as e:  # CaptureError, PlanError: the message names the cause
        print(f"pebble: {e}", file=sys.stderr)
        return 1

    def eager_step(x, y):
        loss = lm_loss(eager(x), y)
        loss.backward()
        return loss.detach()

    results = {}
    for name, net, fn in (("eager", eager, eager_step), ("pebble", planned, step)):
        opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
        rows = results[name] = []
        for k, (x, y) in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(100 + k)  # the same dropout masks for both
            loss, peak, seconds = pt.measure(lambda: fn(x, y), device)
            opt.step()
            rows.append((loss.item(), peak, seconds))

    r = step.report
    print(f"GPT: {args.layers} layers, d={args.dim}, seq {args.seq}, batch {args.batch} on "
          f"{device}; pebble: {r['policy']} at {args.budget}")
    print(f"{'step':>4} {'eager loss':>11} {'pebble loss':>12}")
    for k in range(args.steps):
        print(f"{k:>4} {results['eager'][k][0]:>11.5f} {results['pebble'][k][0]:>12.5f}")
    mib = 2.0 ** 20
    print(f"\n{'':>7} {'step peak MiB':>14} {'step s':>8}")
    for name, rows in results.items():
        peak = max(p for _, p, _ in rows) / mib
        seconds = statistics.median(s for _, _, s in rows[1:])
        print(f"{name:>7} {peak:>14.1f} {seconds:>8.3f}")
    print(f"\nplan: predicted step peak {r['predicted_step_peak_bytes'] / mib:.1f} MiB, "
          f"{r['recomputations']} recomputations; parameters and batch "
          f"{r['persistent_bytes'] / mib:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
