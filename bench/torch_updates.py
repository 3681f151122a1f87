#!/usr/bin/env python3
"""pebble.torch with the optimizer in the plan: where its state lives and its
updates run, measured against eager PyTorch.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_updates.py
        [--device cpu|cuda] [--model gpt|mlp] [--layers N] [--policy P]
        [--budget B] [--steps N]

Trains one model with Adam nine ways from the same initialisation, one
step each after a warm-up step (so that the state exists):

- eager: loss.backward(); optimizer.step() (foreach=False);
- device: train_step(..., optimizer=opt), everything on the device;
- state=host: the state on the host, streamed through device updates;
- updates=host: every update on the host, the gradients kept in .grad;
- both auto: the plan places the state and the updates per tensor;
- ZeRO-Offload: its whole rule, every update on the host and each gradient
  sent there as soon as it is complete (optimizer_gradients="drop");
- all auto, dropped: both placed by the plan, the gradients dropped;
- parameters=host: ZeRO-Offload's rule with the parameters on the host
  between steps too, fetched for their uses (FSDP's CPUOffload);
- everything auto: the plan places the state, the updates and the
  parameters (the gradients dropped, as parameters off the device need).

Each pebble row is planned by --policy at --budget ("min" by default: the
least peak each reaches). Prints a Markdown table: the whole step's peak
(parameters, resident state and gradients included) as the allocator
measured it (on the CPU: the profiler) beside the plan's prediction, the
bytes copied, the wall time of a third, unmeasured step, and where the
updates ran. The
device's memory is what is compared: on the CPU device the "host" is the
same memory (allow_cpu_offload), so the rows show what a GPU would hold,
while the times are the CPU's. Every row's parameters must equal eager's
after the step (the script exits 1 otherwise).
"""

import argparse
import copy
import sys
import time


def gpt(torch, layers, dim=256, heads=4, seq=128, vocab=1000):
    """A GPT-2-style decoder of torch.nn blocks: token and position
    embeddings, pre-norm attention and MLP blocks, a head tied to nothing."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

        def forward(self, ids):
            x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
            return self.head(self.ln(self.blocks(x))).flatten(0, 1)

    def batch(g, device, size=2):
        ids = torch.randint(0, vocab, (size, seq), generator=g)
        return ids.to(device), torch.randint(0, vocab, (size * seq,), generator=g).to(device)

    return GPT(), batch


def mlp(torch, layers, width=1024):
    nn = torch.nn
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*blocks, nn.Linear(width, 10))

    def batch(g, device, size=32):
        return (torch.randn(size, width, generator=g).to(device),
                torch.randint(0, 10, (size,), generator=g).to(device))

    return model, batch


ROWS = (  # (name, train_step's placement options; None: eager)
    ("eager", None),
    ("device", dict()),
    ("state=host", dict(optimizer_state="host")),
    ("updates=host", dict(optimizer_updates="host")),
    ("both auto", dict(optimizer_updates="auto", optimizer_state="auto")),
    ("ZeRO-Offload", dict(optimizer_updates="host", optimizer_gradients="drop")),
    ("all auto, dropped", dict(optimizer_updates="auto", optimizer_state="auto",
                               optimizer_gradients="drop")),
    ("parameters=host", dict(optimizer_updates="host", optimizer_parameters="host")),
    ("everything auto", dict(optimizer_updates="auto", optimizer_state="auto",
                             optimizer_parameters="auto")),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", choices=("gpt", "mlp"), default="gpt")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--policy", default="rotor")
    parser.add_argument("--budget", default="min")
    args = parser.parse_args()
    import torch
    import pebble.torch as pt
    device = torch.device(args.device)
    torch.manual_seed(0)
    make = gpt if args.model == "gpt" else mlp
    base, make_batch = make(torch, args.layers)
    base = base.to(device)
    g = torch.Generator().manual_seed(1)
    batches = [make_batch(g, device) for _ in range(2)]
    loss_fn = torch.nn.functional.cross_entropy
    param_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    print(f"{args.model}, {args.layers} layers: {param_bytes / 2**20:.1f} MiB of parameters; "
          f"Adam; policy {args.policy} at {args.budget}; device {device}")
    print()
    print("| row | peak predicted | peak measured | bytes copied | step time | updates on "
          "the host |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    reference = None
    failed = False
    for name, placement in ROWS:
        model = copy.deepcopy(base)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
        if placement is None:
            def eager(x, y):
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                return loss
            eager(*batches[0])
            opt.zero_grad(set_to_none=True)  # before the measure: its level excludes them
            # Held when the step begins, as a plan's persistent_bytes counts it:
            # the parameters, buffers, the state (not Adam's CPU step counts)
            # and the batch.
            held = param_bytes + sum(t.numel() * t.element_size() for t in model.buffers())
            held += sum(t.numel() * t.element_size() for s in opt.state.values()
                        for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
            held += sum(t.numel() * t.element_size() for t in batches[1])
            _, peak, _ = pt.measure(lambda: eager(*batches[1]), device)
            reference = copy.deepcopy(model)
            opt.zero_grad(set_to_none=True)  # the time of a third step, unmeasured
            started = time.perf_counter()
            eager(*batches[1])
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            print(f"| {name} | | {(held + peak) / 2**20:.2f} MiB | 0 | "
                  f"{seconds * 1e3:.1f} ms | |")
            continue
        x0, y0 = batches[0]
        try:
            step = pt.train_step(model, loss_fn, (x0,), y0, optimizer=opt, policy=args.policy,
                                 budget=args.budget, measure="always",
                                 allow_cpu_offload=device.type == "cpu", **placement)
        except pt.PlanError as e:
            least = str(e).split("it reaches ", 1)[-1].split(" (", 1)[0]
            print(f"| {name} | does not fit ({least} above the persistent tensors at least) "
                  "| | | | |")
            continue
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            step(x, y)
        r = dict(step.report)
        ran = r["optimizer_updates"]
        same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-7)
                   for a, b in zip(model.parameters(), reference.parameters()))
        # The time of a third step, unmeasured (the CPU profiler slows a step).
        step.measure_mode = "never"
        opt.zero_grad(set_to_none=True)
        started = time.perf_counter()
        step(*batches[1])
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        failed = failed or not same
        print(f"| {name} | {r['predicted_peak_bytes'] / 2**20:.2f} MiB | "
              f"{r['measured_total_peak_bytes'] / 2**20:.2f} MiB | "
              f"{r['transfer_bytes'] / 2**20:.1f} MiB | {seconds * 1e3:.1f} ms | "
              f"{ran['host_parameters']} of {ran['host_parameters'] + ran['device_parameters']}"
              f"{'' if same else ' (parameters differ from eager)'} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
