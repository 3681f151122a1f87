#!/usr/bin/env python3
"""The PyTorch cross-checks of the CUDA backend, in one place.

    crosscheck_cuda.py --pebble PATH [--workdir DIR] [--no-import-cases]

Runs crosscheck.py --backend cuda on each case of CASES: every gradient and
the loss of `pebble run --backend cuda` against PyTorch, every policy bitwise
equal to the baseline; then import_check.py --backend cuda on each model of
IMPORT_CASES: an ONNX export imported by `pebble import` and run on the GPU
against PyTorch (grouped, depthwise, dilated and transposed convolutions,
broadcast gates, group norms, embeddings), skipped where onnx cannot be imported. ctest registers it as torch_crosscheck_cuda;
scripts/gpu-check runs it from a build tree or from prebuilt binaries.

The models are small on purpose: the more ReLU and max-pool values a step
has, the likelier one lies at a kink, where two correct backends differ
(docs/cuda.md, "Values at kinks"). Each case runs with --avoid-kinks: the
first seed from 0 whose PyTorch forward has no value at a kink (seed 0 for
conv3d, 1 for mnist-cnn, whose seed 0 has a ReLU input and a max-pool
window within 1e-6 relative).

Exit 0 when every case passes, 1 when one fails, 77 when the first case
skips (no CUDA device without PEBBLE_REQUIRE_CUDA, or no numpy/torch).
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [
    ("conv3d", ["--model", "conv3d:n=16",
                "--policies", "baseline,best-order,sqrtn,dtr,checkmate-lp",
                "--optional-policies", "vdnn,swap,hybrid", "--expect-recompute"]),
    ("mnist", ["--model", "mnist-cnn:batch=8",
               "--optional-policies", "vdnn,swap,hybrid",
               "--expect-recompute", "--expect-offload"]),
]
IMPORT_CASES = [
    ("import_grouped", ["--model", "grouped"]),
    ("import_mobilenet_v2", ["--model", "mobilenet_v2", "--fp64-judge"]),
    ("import_efficientnet_b0", ["--model", "efficientnet_b0", "--fp64-judge"]),
    # Transposed convolutions (cuDNN's backward data as a forward node, its
    # gradients a convolution and a weight gradient), group and instance
    # norms, embedding look-ups: none has run on a GPU yet.
    ("import_upconv", ["--model", "upconv", "--image", "16"]),
    ("import_normed", ["--model", "normed", "--image", "16"]),
    ("import_text", ["--model", "text", "--opset", "17", "--image", "16"]),
    ("import_token_lm", ["--model", "token_lm", "--opset", "17", "--image", "16"]),
    # elu, softplus, abs, exp, log, border padding, averaging pools without
    # the padding, reductions by max pooling, a loss that takes the last
    # log_softmax (2026-12-07): host emulation only so far.
    ("import_smooth", ["--model", "smooth", "--image", "16"]),
    ("import_padded", ["--model", "padded", "--image", "12"]),
    ("import_pooled", ["--model", "pooled", "--image", "16"]),
    ("import_misc", ["--model", "misc", "--image", "8", "--opset", "17"]),
    ("import_mnist", ["--model", "mnist", "--image", "12"]),
    # compare and masked_fill: masks computed in the model, a padding mask
    # from the token ids (2026-12-07, host emulation only so far).
    ("import_masked", ["--model", "masked", "--image", "12"]),
    ("import_text_padded", ["--model", "text_padded", "--opset", "17", "--image", "12"]),
    # log_softmax (the softmax kernel's log form), maximum, minimum and
    # their backwards, a sign (2026-12-07, host emulation only so far).
    ("import_extrema", ["--model", "extrema", "--image", "12"]),
    # upsample to sizes, by fractional factors and bicubic (2026-12-07,
    # host emulation only so far).
    ("import_resized", ["--model", "resized", "--image", "24"]),
    # Strided slices and torch.flip, recurrent layers, 2-norms (2026-12-07:
    # these imported models have not run on a GPU).
    ("import_focus", ["--model", "focus", "--image", "14"]),
    ("import_recurrent", ["--model", "recurrent", "--image", "6"]),
    ("import_normalized", ["--model", "normalized", "--image", "12"]),
    # bce_with_logits (2026-12-07, host emulation only so far).
    ("import_labels", ["--model", "labels", "--image", "12"]),
    # Buffers and a frozen stem (--frozen), the constant and random
    # operators, Pow as exp of p log x (2026-12-07, host emulation only so
    # far).
    ("import_standardized", ["--model", "standardized", "--image", "10"]),
    ("import_constants", ["--model", "constants", "--opset", "17", "--image", "9"]),
    ("import_powers", ["--model", "powers", "--image", "8"]),
    ("import_vae", ["--model", "vae", "--image", "8"]),
    # The cast operator (2026-12-07, host emulation only so far).
    ("import_casts", ["--model", "casts", "--opset", "17", "--image", "8"]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pebble", required=True, help="a pebble built with CUDA")
    ap.add_argument("--workdir", help="inputs and dumps go to WORKDIR/<case>")
    ap.add_argument("--no-import-cases", action="store_true",
                    help="CASES only, not IMPORT_CASES (for the host emulation, whose "
                         "cuDNN runs no grouped or dilated convolution)")
    args = ap.parse_args()
    failed, skipped = [], []
    runs = [(name, "crosscheck.py", ["--avoid-kinks"] + case) for name, case in CASES]
    if not args.no_import_cases:
        runs += [(name, "import_check.py", case) for name, case in IMPORT_CASES]
    for k, (name, script, case) in enumerate(runs):
        cmd = [sys.executable, os.path.join(HERE, script), "--pebble", args.pebble,
               "--backend", "cuda"] + case
        if args.workdir:
            cmd += ["--workdir", os.path.join(args.workdir, name)]
        print(f"== {name}: {' '.join(cmd[2:])}", flush=True)
        code = subprocess.call(cmd)
        if code == 77 and k == 0:
            return 77
        if code == 77 and script == "import_check.py":
            skipped.append(name)  # no onnx or torchvision here
        elif code != 0:
            failed.append(f"{name} (exit {code})")
    if failed:
        print("FAIL: " + ", ".join(failed))
        return 1
    print(f"PASS: {len(runs) - len(skipped)} cases"
          + (f" (skipped, no onnx: {', '.join(skipped)})" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
