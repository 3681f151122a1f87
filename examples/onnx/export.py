#!/usr/bin/env python3
"""Exports torchvision models to ONNX in training mode, for `pebble import`.

    export.py OUTDIR [MODEL ...] [--batch 8] [--image 224] [--classes 1000]
              [--opset 13] [--seed 0] [--no-dropout] [--force]

Writes OUTDIR/<model>.onnx for each model (default: resnet18 resnet50
mobilenet_v2 mobilenet_v3_small densenet121 vgg11_bn squeezenet1_1) as
`pebble import` reads it: `torch.onnx.export(..., training=TRAINING,
do_constant_folding=False, input_names=["input"])`, so that batch norm stays
a training-mode batch norm and the initializers keep their state_dict() names
(`conv1.weight`, `bn1.running_mean`). Then prints, per model, the command
that imports it. The weights are torchvision's random initialisation (seeded),
never downloaded: pebble plans memory, it does not need trained weights.

Needs torch and torchvision (Debian: python3-torch, python3-torchvision) and,
for the summary of ops, onnx. An existing OUTDIR/<model>.onnx is kept
unless --force, where its input is the batch and image asked for; of
another, it is refused (exit 1: --force replaces it). Exit status: 0 every
model exported (or kept), 1 some failed or were refused (each says why), 2 a
usage error.
"""

import argparse
import collections
import os
import shlex
import sys
import warnings

DEFAULT_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small",
                  "densenet121", "vgg11_bn", "squeezenet1_1"]


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Export torchvision models to ONNX in training mode for "
                    "`pebble import`.")
    parser.add_argument("outdir", help="directory for <model>.onnx (created)")
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS,
                        help="torchvision.models builders (default: %s)"
                             % " ".join(DEFAULT_MODELS))
    parser.add_argument("--batch", type=int, default=8,
                        help="batch size (default 8; `pebble import --batch "
                             "N` rewrites it)")
    parser.add_argument("--image", type=int, default=224,
                        help="input height and width (default 224; vgg "
                             "needs a multiple of 224, the others take 32 "
                             "and up)")
    parser.add_argument("--classes", type=int, default=1000,
                        help="num_classes (default 1000)")
    parser.add_argument("--opset", type=int, default=13,
                        help="ONNX opset (default 13; pebble import reads "
                             "11 to 17)")
    parser.add_argument("--seed", type=int, default=0,
                        help="torch seed of the initialisation (default 0)")
    parser.add_argument("--no-dropout", action="store_true",
                        help="set every dropout's p to 0 (as "
                             "tests/torch/import_check.py does)")
    parser.add_argument("--force", action="store_true",
                        help="replace existing .onnx files")
    args = parser.parse_args(argv)
    for name in ("batch", "image", "classes", "opset"):
        if getattr(args, name) < 1:
            parser.error("--%s must be positive" % name)
    return args


def export(torch, torchvision, name, path, args):
    """Exports one model; returns a one-line summary. Raises on failure."""
    builder = getattr(torchvision.models, name, None)
    if name.startswith("_") or builder is None or not callable(builder) \
            or isinstance(builder, type):
        raise ValueError("not a torchvision.models builder")
    torch.manual_seed(args.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = builder(weights=None, num_classes=args.classes)
    if args.no_dropout:
        for m in model.modules():
            if isinstance(m, torch.nn.modules.dropout._DropoutNd):
                m.p = 0.0
    model.train()
    x = torch.randn(args.batch, 3, args.image, args.image)
    with warnings.catch_warnings():
        # One warning per batch norm (its num_batches_tracked update is
        # dropped: pebble leaves that counter out of the graph) and a few
        # about tracing; none matters here.
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, path,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["input"],
                          output_names=["logits"], opset_version=args.opset)
    params = sum(p.numel() for p in model.parameters())
    summary = "%.1fM parameters" % (params / 1e6)
    try:
        import onnx
    except ImportError:
        return summary
    graph = onnx.load(path, load_external_data=False).graph
    ops = collections.Counter(n.op_type for n in graph.node)
    return "%s, %d ONNX nodes: %s" % (
        summary, len(graph.node),
        ", ".join("%s %d" % kv for kv in sorted(ops.items())))


def input_shape(path):
    """The (batch, channels, height, width) of the exported model's graph
    input "input", or None where onnx is missing or the file holds no such
    fixed shape."""
    try:
        import onnx
        graph = onnx.load(path, load_external_data=False).graph
    except Exception:  # noqa: BLE001 (no onnx, or a file that is not one)
        return None
    for value in graph.input:
        if value.name == "input":
            dims = value.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                return tuple(d.dim_value for d in dims)
    return None


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torchvision
    except ImportError as e:
        print("export.py: torch and torchvision are needed (%s)" % e,
              file=sys.stderr)
        return 1
    os.makedirs(args.outdir, exist_ok=True)
    failed = []
    for name in args.models:
        path = os.path.join(args.outdir, name + ".onnx")
        json_path = os.path.join(args.outdir, name + ".json")
        if os.path.exists(path) and not args.force:
            asked = (args.batch, 3, args.image, args.image)
            kept = input_shape(path)
            if kept is not None and kept != asked:
                # (kept silently, every later step planned the old batch)
                print("%s: %s exists with input %s, not the %s asked for: --force "
                      "replaces it" % (name, path, "x".join(map(str, kept)),
                                       "x".join(map(str, asked))))
                failed.append(name)
                continue
            print("%s: %s exists, kept (--force replaces it)" % (name, path))
            print("  pebble import %s --loss cross-entropy --output %s" % (
                shlex.quote(path), shlex.quote(json_path)))
            continue
        try:
            summary = export(torch, torchvision, name, path, args)
        except Exception as e:  # the exporter raises several types
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            first = first.split(" Please feel free")[0]
            hint = ""
            if "adaptive" in first and "factor" in first:
                hint = (" (its adaptive pool exports only where the feature "
                        "map is a multiple of its output: --image a multiple of "
                        "224)")
            print("%s: export failed: %.300s%s" % (name, first, hint))
            failed.append(name)
            if os.path.exists(path):
                os.remove(path)
            continue
        print("%s: %s (%s)" % (name, path, summary))
        print("  pebble import %s --loss cross-entropy --output %s" % (
            shlex.quote(path), shlex.quote(json_path)))
    if failed:
        print("not exported: %s" % " ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
