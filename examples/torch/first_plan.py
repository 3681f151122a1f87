#!/usr/bin/env python3
"""A first plan of your own PyTorch model: budget, plan, run, compare with eager.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch/first_plan.py \\
        [--policy dtr] [--budget 60%] [--batch 16] [--steps 3]

The model below stands for yours: any torch.nn.Module and any loss callable.
The script trains two copies from the same weights on the same batches, one
eagerly and one under the pebble plan, and prints each step's two losses and
then what the allocator measured for each (pebble.torch.measure: the most the
step held above what was held before it), beside the plan's prediction.
"""

import argparse
import copy
import sys

import torch
import torch.nn as nn

import pebble.torch as pt


class SmallConvNet(nn.Module):
    """Stands for your model: four convolution blocks and a classifier."""

    def __init__(self, classes=10, width=32):
        super().__init__()
        blocks, channels = [], 3
        for k in range(4):
            out = width * 2 ** min(k, 2)
            blocks += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.GELU()]
            channels = out
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def smoothed_cross_entropy(logits, target, smoothing=0.1):
    """A hand-written loss: any callable (output, target) -> scalar works."""
    log_p = logits.log_softmax(dim=-1)
    picked = log_p.gather(1, target[:, None]).squeeze(1)
    return -((1 - smoothing) * picked + smoothing * log_p.mean(dim=-1)).mean()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="dtr", help="any of pebble.policies() (default dtr)")
    parser.add_argument("--budget", default="60%",
                        help="60%%: of what the unplanned step holds above the parameters "
                        "and inputs, as measured; or 64MiB (the whole step), or min")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.batch < 1 or args.image < 4 or args.steps < 1:
        parser.error("--batch and --steps must be at least 1, --image at least 4")

    torch.manual_seed(0)
    eager = SmallConvNet().train()
    planned = copy.deepcopy(eager)
    batches = [(torch.randn(args.batch, 3, args.image, args.image),
                torch.randint(0, 10, (args.batch,))) for _ in range(args.steps)]

    try:
        step = pt.train_step(planned, smoothed_cross_entropy, batches[0][0], batches[0][1],
                             policy=args.policy, budget=args.budget)
    except (pt.CaptureError, pt.PlanError) as e:
        print(f"first_plan.py: {e}", file=sys.stderr)
        return 1

    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_planned = torch.optim.SGD(planned.parameters(), lr=0.05)
    eager_peak = 0
    for k, (x, y) in enumerate(batches):
        def eager_step():
            loss = smoothed_cross_entropy(eager(x), y)
            loss.backward()
            return loss.detach()

        # Both steps from one generator state: a model with dropout draws
        # the same masks in each (eager's order), so the losses agree.
        generator_state = torch.get_rng_state()
        opt_eager.zero_grad(set_to_none=True)
        loss_eager, peak, _ = pt.measure(eager_step)
        eager_peak = max(eager_peak, peak)
        opt_eager.step()
        torch.set_rng_state(generator_state)
        opt_planned.zero_grad(set_to_none=True)
        loss_planned = step(x, y)
        opt_planned.step()
        print(f"step {k}: loss eager {loss_eager.item():.6f}, planned {loss_planned.item():.6f}")

    r = step.report
    mib = 2.0 ** 20
    print(f"\n{r['policy']} at budget {args.budget}: {r['recomputations']} recomputations, "
          f"compute overhead {100 * r['compute_overhead']:.1f}% (modelled from calibrated "
          f"operator times), set up in {r['setup_time_s']:.1f} s")
    print(f"step peak, measured by the allocator: eager {eager_peak / mib:.2f} MiB, "
          f"planned {r['measured_peak_bytes'] / mib:.2f} MiB "
          f"(predicted {r['predicted_step_peak_bytes'] / mib:.2f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
