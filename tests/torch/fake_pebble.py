"""A stand-in for `pebble` that tests the cross-check harness itself.

    fake_pebble.py --real PEBBLE [--corrupt ID] [--flip POLICY:ID]
                   [--drop ID] [--extra ID] [--ignore-input] [--no-run]
                   [--no-device]
                   -- ARGS...

Every command but `run` is passed on to the real binary PEBBLE (`policies`,
`plan`, `describe`). `run` is done here with PyTorch in fp64 (the exact
answer, rounded once to fp32): it reads --inputs DIR, computes the loss and
the gradients of the model's PyTorch twin and writes them to --dump DIR the
way `pebble run` does. The options plant one fault each, which the
cross-check must catch:

  --corrupt ID      multiplies output ID by (1 + 1e-3): a wrong gradient
  --flip POLICY:ID  flips the lowest mantissa bit of one element of output
                    ID under POLICY only: not bitwise identical to baseline
  --drop ID         leaves output ID out of the dump
  --extra ID        writes one more output ID
  --ignore-input    reports one persistent tensor generated, not loaded
  --no-run          has no `run` command at all (an unfinished runtime)
  --no-device       `run --backend cuda` fails as on a machine without a GPU
"""

import argparse
import json
import os
import subprocess
import sys


def fake_run(argv, opts):
    import numpy as np
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models

    parser = argparse.ArgumentParser(prog="pebble run")
    parser.add_argument("--model", required=True)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--budget", required=True)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--inputs", required=True,
                        help="directory of <id>.npy persistent tensors")
    parser.add_argument("--dump", required=True,
                        help="directory for <id>.npy outputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float)
    parser.add_argument("--own-order", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)

    case = models.build(args.model)
    state = {}
    for name in case.module.state_dict():
        state[name] = torch.from_numpy(
            np.load(os.path.join(args.inputs, name + ".npy")))
    case.module.load_state_dict(state)
    x = torch.from_numpy(np.load(os.path.join(args.inputs, "input.npy")))
    t = torch.from_numpy(np.load(os.path.join(args.inputs, "target.npy")))
    module = case.module.double().train()
    loss = module(x.double(), t.double() if t.is_floating_point() else t)
    loss.backward()
    outputs = {"loss": loss.detach()}
    for name, p in module.named_parameters():
        outputs["grad:" + name] = p.grad
    if opts.extra:
        outputs[opts.extra] = torch.zeros(1)
    os.makedirs(args.dump, exist_ok=True)
    for name, value in outputs.items():
        if name == opts.drop:
            continue
        array = value.numpy().astype(np.float32)
        if name == opts.corrupt:
            array = array * np.float32(1 + 1e-3)
        if opts.flip == "%s:%s" % (args.policy, name):
            bits = array.reshape(-1).view(np.uint32)
            bits[0] ^= 1
        np.save(os.path.join(args.dump, name + ".npy"), array)
    print(json.dumps({"loss": float(outputs["loss"]), "predicted": {},
                      "measured": {},
                      "generated_inputs": int(opts.ignore_input),
                      "loaded_inputs": len(state) + 2 - opts.ignore_input}))
    return 0


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        print("usage: fake_pebble.py --real PEBBLE [faults] -- ARGS...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--real", required=True)
    parser.add_argument("--corrupt")
    parser.add_argument("--flip")
    parser.add_argument("--drop")
    parser.add_argument("--extra")
    parser.add_argument("--ignore-input", action="store_true")
    parser.add_argument("--no-run", action="store_true")
    parser.add_argument("--no-device", action="store_true")
    opts = parser.parse_args(argv[:split])
    rest = argv[split + 1:]
    if rest and rest[0] == "run":
        if opts.no_run:
            print("pebble: unknown command 'run'", file=sys.stderr)
            return 2
        if "--help" in rest:
            print("pebble run --model M --policy P --budget B --inputs DIR "
                  "--dump DIR --json")
            return 0
        if opts.no_device and "cuda" in rest:
            print("pebble: no CUDA device: no CUDA-capable device is detected "
                  "(cudaErrorNoDevice); use --backend cpu", file=sys.stderr)
            return 1
        return fake_run(rest[1:], opts)
    return subprocess.call([opts.real] + rest)


if __name__ == "__main__":
    sys.exit(main())
