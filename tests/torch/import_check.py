#!/usr/bin/env python3
"""Cross-checks `pebble import` of a torchvision model against PyTorch.

    import_check.py --pebble PATH --model NAME [--batch 2] [--image 64]
                    [--policy rotor] [--budget 70%] [--seed 0]
                    [--workdir DIR] [--all-policies] [--export-batch K]
                    [--dynamic-batch]
                    [--classes 10] [--opset 13] [--fp64] [--fp64-judge]

Builds torchvision.models.NAME (10 classes by default) with a seeded
initialisation (ResNets with zero_init_residual=True, which keeps resnet50's
fp32 gradients well-conditioned), every dropout's p set to 0 (pebble's
dropout draws its own seeded mask, not PyTorch's), batch-norm affine
parameters moved off 1 and 0 (models.perturb_batchnorm);
exports it in training mode to DIR/model.onnx; runs

    pebble import DIR/model.onnx --loss cross-entropy --output DIR/graph.json

and checks:

- the graph's "parameter" nodes hold 4 x (the model's parameter count) bytes;
- its persistent nodes are exactly the state_dict() entries (parameters with
  role "parameter", batch-norm running statistics and num_batches_tracked with
  role "buffer", as docs/import.md says; without num_batches_tracked where
  NUM_BATCHES_TRACKED is False) plus `input` and `target` (role "input"), with
  the same shapes and dtypes; its outputs are `loss` and `grad:<p>` for every
  parameter p (a mismatch is explained against the ONNX file's initializers);
- one training step, `pebble run --graph DIR/graph.json --policy P --budget B
  --backend cpu --inputs DIR/inputs --dump DIR/out` (--backend cuda on a GPU;
  at `min` where the plan
  is infeasible at B), reads every persistent tensor from DIR/inputs, and its
  loss and gradients match PyTorch autograd (training mode, mean
  cross-entropy) within crosscheck.py's tolerance (docs/crosscheck.md);
- the run's measured peak equals the plan's predicted peak;
- with --export-batch K (not --batch): the file is exported at batch K and
  imported with `--batch N`, which must rewrite it;
- with --freeze GLOBS: those parameters are frozen (requires_grad=False)
  before the export; the model's frozen parameters and buffers but batch
  norms' statistics are passed to `pebble import --frozen` and must import
  as buffers, without gradients;
- with --dynamic-batch: the file is exported with a symbolic batch
  (dynamic_axes) and imported with `--batch N`;
- with --fp64-judge: a tensor over the tolerance passes where PyTorch's own
  fp32 result is ill-conditioned (ILL_CONDITIONED off its fp64 one) and
  pebble's is at most FP64_FACTOR times further off fp64;
- with --all-policies: `pebble plan --graph DIR/graph.json` at B succeeds for
  every policy `pebble policies` lists but `exact` (an infeasible plan is
  fine, an error exit or a hang is not; exact-order, checkmate,
  checkmate-lp, revolve and tree may refuse a graph outside their domain,
  with the words in OUT_OF_DOMAIN, as some refuse pebble's own resnet18).

Exit status as crosscheck.py: 0 everything matches, 1 a mismatch or a failed
pebble command, 2 a usage error (torch.onnx.export refusing the model at this
size included), 77 when numpy, torch, torchvision or onnx cannot be imported,
or when the pebble binary has no `import` command.
"""

import argparse
import collections
import copy
import fnmatch
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crosscheck as cc  # noqa: E402  (only the standard library at import)

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_SKIP = (
    cc.EXIT_OK, cc.EXIT_FAIL, cc.EXIT_USAGE, cc.EXIT_SKIP)
Failure, UsageError, log = cc.Failure, cc.UsageError, cc.log

# Whether the graph holds each batch norm's num_batches_tracked (an i64 scalar
# buffer) beside its running statistics, so that its persistent tensors are
# exactly the state_dict(), as docs/import.md ("Names") has it and pebble's
# built-in models do. False: the graph must leave them out.
NUM_BATCHES_TRACKED = True
# --fp64-judge: a tensor is ill-conditioned in fp32 where PyTorch's own fp32
# result is this far (relative, as REL_TOL) from its fp64 one; it then passes
# where pebble's fp32 result is at most FP64_FACTOR times further from fp64.
ILL_CONDITIONED = 1e-5
FP64_FACTOR = 10.0
# ... and where PyTorch's fp32 result is more than this far from fp64 (a
# gradient that is zero in exact arithmetic, such as a batch norm's bias
# whose output only a later normalisation reads), both fp32 results are
# rounding noise, and their ratio against fp64 is noise too: pebble's then
# passes as crosscheck.py judges such a gradient, its largest magnitude at
# most cc.ZERO_NOISE_FACTOR times PyTorch's.
ZERO_IN_FP64 = 1e3
# Tensor mismatches listed at the end (the table above lists them all).
MAX_TENSOR_LINES = 10
# `exact` enumerates every schedule: it handles only tiny graphs.
ALL_POLICIES_SKIP = ("exact",)
# Policies that refuse, by design, graphs outside their domain, and the words
# of that refusal (scheduler/*.cc); pebble's own resnet18 graph gets the same
# from exact-order, revolve and tree. Such an exit is reported as "n/a", not
# as a failure; any other error exit fails.
OUT_OF_DOMAIN = {
    "exact-order": ("more than its limit",      # too many nodes
                    "passed its limit",         # too many states (too wide)
                    "no optimum within the time limit"),
    "checkmate": ("the MILP takes at most",),   # too many nodes for the MILP
    "checkmate-lp": ("the LP takes at most",),  # too many nodes for the LP
    "revolve": ("needs an adjoint chain",),     # a single forward chain only
    "tree": ("takes in-trees only",),           # every tensor read at most once
}


class NoImport(Exception):
    """The pebble binary has no `import` command: exit 77 (skip)."""


def tensor_file_name(node_id):
    """The file name `pebble run` reads a persistent node from and dumps an
    output to: TensorFileName in runtime/executor.cc."""
    if node_id in (".", ".."):
        return "%2E.npy" if node_id == "." else "%2E%2E.npy"
    return node_id.replace("%", "%25").replace("/", "%2F") + ".npy"


def check_has_import(pebble):
    """NoImport unless `pebble import --help` describes the import command.
    (A pebble without it prints its main help for `import --help` and exits
    0, so the exit status alone does not tell.)"""
    proc = subprocess.run([pebble, "import", "--help"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0 or "--loss" not in text or "--output" not in text:
        raise NoImport(
            "this pebble binary has no `import` command (`%s import --help` "
            "exited %d without describing --loss and --output)"
            % (pebble, proc.returncode))


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Cross-check `pebble import` of a torchvision model: "
                    "the graph's persistent tensors, then one training step "
                    "(loss, every gradient, peak memory) against PyTorch.")
    parser.add_argument("--pebble", required=True, help="the pebble binary")
    parser.add_argument("--model", required=True,
                        help="a torchvision.models builder, e.g. resnet18")
    parser.add_argument("--batch", type=int, default=2,
                        help="batch size of the step (default 2)")
    parser.add_argument("--export-batch", type=int, default=None,
                        help="batch size the ONNX file is exported at "
                             "(default: --batch); where it differs, the "
                             "import gets --batch to rewrite it")
    parser.add_argument("--dynamic-batch", action="store_true",
                        help="export with a symbolic batch (dynamic_axes on "
                             "dim 0 of the input and the logits), which the "
                             "import gets --batch to set")
    parser.add_argument("--image", type=int, default=64,
                        help="input height and width (default 64)")
    parser.add_argument("--classes", type=int, default=10,
                        help="num_classes of the model (default 10; 0: the "
                             "builder's default)")
    parser.add_argument("--opset", type=int, default=13,
                        help="ONNX opset of the export (default 13)")
    parser.add_argument("--policy", default="rotor",
                        help="policy of the run (default rotor)")
    parser.add_argument("--budget", default="70%",
                        help="budget of the run and of --all-policies "
                             "(default 70%%; the run falls back to `min` "
                             "where infeasible; one-shot policies run at "
                             "100%%, as in crosscheck.py)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the initialisation and the batch")
    parser.add_argument("--workdir", default=None,
                        help="where model.onnx, graph.json, inputs/ and out/ "
                             "go (default: a temporary directory, removed "
                             "afterwards)")
    parser.add_argument("--classifier-width", type=int, default=0,
                        help="make the Linear layers inside a torchvision "
                             "classifier (VGG's) this wide (default: as built)")
    parser.add_argument("--all-policies", action="store_true",
                        help="also plan the imported graph with every "
                             "registered policy but exact")
    parser.add_argument("--time-limit", type=float, default=20,
                        help="--time-limit of each --all-policies plan "
                             "(default 20 s)")
    parser.add_argument("--step-time-limit", type=float, default=None,
                        help="--time-limit of the plans of the step run against "
                             "PyTorch (default: pebble's)")
    parser.add_argument("--fp64", action="store_true",
                        help="also run PyTorch in fp64 and print its own "
                             "fp32 error (column torch32/64), for scale")
    parser.add_argument("--fp64-judge", action="store_true",
                        help="(implies --fp64) a tensor over the 1e-4 "
                             "tolerance still passes where it is "
                             "ill-conditioned in fp32, i.e. PyTorch's own "
                             "fp32 result is at least %g off its fp64 one, "
                             "and pebble's is at most %g times further off "
                             "fp64 than PyTorch's (densenet121, mobilenet_v2 "
                             "at small sizes)" % (ILL_CONDITIONED,
                                                  FP64_FACTOR))
    parser.add_argument("--freeze", default="",
                        help="comma-separated globs (fnmatch) of parameters "
                             "to freeze (requires_grad=False) before the "
                             "export, e.g. 'conv1.*,layer1.*': a backbone "
                             "kept fixed while the rest trains")
    parser.add_argument("--default-init", action="store_true",
                        help="ResNets with torchvision's default init "
                             "(zero_init_residual=False): resnet50's fp32 "
                             "gradients are then ill-conditioned")
    cc.add_threads_option(parser)
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cpu",
                        help="backend of the `pebble run` (default cpu; "
                             "PyTorch's reference always runs on the CPU)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on errors, 0 on --help
        raise UsageError() if e.code else e
    for name in ("batch", "image", "opset"):
        if getattr(args, name) < 1:
            parser.print_usage(sys.stderr)
            print("import_check: --%s must be positive" % name,
                  file=sys.stderr)
            raise UsageError()
    if args.export_batch is not None and args.export_batch < 1:
        print("import_check: --export-batch must be positive", file=sys.stderr)
        raise UsageError()
    return args


def loss_of(net):
    """The loss `pebble import --loss` adds for `net`: cross-entropy, or
    a model's own `pebble_loss` ("nll" where it ends in log_softmax, "bce"
    for logits of independent labels)."""
    return getattr(net, "pebble_loss", "cross-entropy")


def make_with_loss(torch):
    """The class of net + its mean loss (loss_of: cross-entropy, or
    nll_loss): the `module(input, target) -> loss` that
    crosscheck.torch_reference and count_kinks call. Its parameters are the
    net's, named `net.<name>`."""
    class _WithLoss(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x, t):
            out = self.net(x)
            if not torch.is_tensor(out):
                raise UsageError(
                    "the model returns %s in training mode, not one tensor of "
                    "logits (aux_logits?)" % type(out).__name__)
            if loss_of(self.net) == "nll":
                return torch.nn.functional.nll_loss(out, t)
            if loss_of(self.net) == "bce":
                return torch.nn.functional.binary_cross_entropy_with_logits(out, t)
            return torch.nn.functional.cross_entropy(out, t)
    return _WithLoss


def activations_net(torch, num_classes=10, image=None):
    """A small CNN with every piecewise-linear activation the importer maps
    (ReLU6 = Clip, Hardswish, Hardsigmoid, LeakyReLU, and a Clip with one
    bound): --model activations."""
    nn = torch.nn

    class Activations(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.act1 = nn.ReLU6()
            self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)
            self.act2 = nn.Hardswish()
            self.gate = nn.Hardsigmoid()
            self.act3 = nn.LeakyReLU(0.1)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(8, num_classes)

        def forward(self, x):
            x = self.act1(self.bn1(self.conv1(x)))
            x = self.act2(self.conv2(x))
            x = x * self.gate(x)  # same shapes: no broadcast
            x = torch.clamp(self.act3(x), min=-0.05)
            return self.fc(torch.flatten(self.pool(x), 1))

    return Activations()


def smooth_net(torch, num_classes=10, image=None):
    """A small CNN with the smooth activations and PReLU the importer maps
    (ELU, SELU, CELU as pebble's elu; Softplus of beta 1 and 2; nn.PReLU
    with one slope and with one per channel, and on a linear layer's
    output), and those PyTorch writes with Abs, Exp and Log (Mish,
    LogSigmoid, Softsign, torch.exp); GPT-2's GELU written out (a Pow by 3)
    and powers by -0.5, -1 and -2 of a positive tensor: --model smooth."""
    nn = torch.nn

    class Smooth(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.act1 = nn.ELU(alpha=0.7)
            self.prelu1 = nn.PReLU()
            self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
            self.act2 = nn.SELU()
            self.prelu2 = nn.PReLU(8, init=0.1)
            self.act3 = nn.CELU(alpha=0.5)
            self.mish = nn.Mish()
            self.fc1 = nn.Linear(8, 16)
            self.prelu3 = nn.PReLU(16, init=0.3)
            self.logsigmoid = nn.LogSigmoid()
            self.softsign = nn.Softsign()
            self.fc2 = nn.Linear(16, num_classes)

        def forward(self, x):
            x = self.prelu1(self.act1(self.conv1(x)))
            x = self.prelu2(self.act2(self.conv2(x)))
            x = self.act3(x) + torch.nn.functional.softplus(x) \
                - torch.nn.functional.softplus(x, beta=2.0)
            x = self.mish(x) + torch.exp(-x.abs())
            x = self.prelu3(self.fc1(x.mean(dim=(2, 3))))
            x = 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))
            positive = 1.0 + x * x
            x = x + positive ** -0.5 + positive.pow(-1) + positive ** -2
            return self.fc2(self.logsigmoid(x) + self.softsign(x))

    return Smooth()


def padded_net(torch, num_classes=10, image=None):
    """Border padding as fast neural style transfer and CycleGAN's
    generators write it: nn.ReflectionPad2d before a convolution, a
    convolution of padding_mode "reflect" and one of "replicate", an
    uneven nn.ReplicationPad2d, and nn.ReflectionPad1d over a (N, C, L)
    view, with instance norms between: --model padded."""
    nn = torch.nn

    class Padded(nn.Module):
        def __init__(self):
            super().__init__()
            self.pad1 = nn.ReflectionPad2d(2)
            # (no bias: an instance norm's input's bias has a gradient of
            # 0 in exact arithmetic, rounding noise in fp32)
            self.conv1 = nn.Conv2d(3, 8, 5, bias=False)
            self.norm1 = nn.InstanceNorm2d(8, affine=True)
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")
            self.conv3 = nn.Conv2d(8, 8, 3, padding=1, padding_mode="replicate")
            self.pad4 = nn.ReplicationPad2d((0, 2, 1, 0))
            self.pad5 = nn.ReflectionPad1d((3, 1))
            self.fc = nn.Linear(8, num_classes)

        def forward(self, x):
            x = torch.relu(self.norm1(self.conv1(self.pad1(x))))
            x = torch.relu(self.conv3(self.conv2(x)))
            x = self.pad4(x)
            x = self.pad5(x.flatten(2))
            return self.fc(x.mean(dim=2))

    return Padded()


def grouped_net(torch, num_classes=10, image=None):
    """A small CNN with the convolutions and broadcasts of the mobile
    networks: grouped, depthwise and dilated convolutions (one of them
    strided), a squeeze-excitation gate (N, C, 1, 1) times (N, C, H, W), a
    per-channel (C, 1, 1) parameter added, subtracted from and divided by,
    a max pool in ceil mode whose last window reaches past the input
    (GoogLeNet's), a padded one whose last window would start in the
    padding (PyTorch drops it, ONNX's shape inference keeps it: 9 columns,
    not 10, at --image 64), and the broadcasts that are not one block of dims: a
    channel mean (N, 1, H, W) gating every channel (CBAM's spatial
    attention), a product of (N, 1, H, W) and (N, C, 1, 1) (both operands
    broadcast), and a mean over (C, W) put back as (N, 1, H, 1): --model
    grouped."""
    nn = torch.nn

    class Grouped(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.ceil_pool = nn.MaxPool2d(3, 2, ceil_mode=True)
            self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.grouped = nn.Conv2d(8, 12, 3, padding=2, dilation=2, groups=4,
                                     bias=False)
            self.strided = nn.Conv2d(12, 12, 3, stride=2, padding=2,
                                     dilation=(2, 1), groups=3)
            self.padded_pool = nn.MaxPool2d(2, 2, padding=1, ceil_mode=True)
            self.squeeze = nn.Conv2d(12, 4, 1)
            self.excite = nn.Conv2d(4, 12, 1)
            self.shift = nn.Parameter(torch.randn(12, 1, 1) * 0.1)
            self.offset = nn.Parameter(torch.randn(12, 1, 1) * 0.1)
            self.scale = nn.Parameter(1 + torch.rand(12, 1, 1) * 0.5)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(12, num_classes)

        def forward(self, x):
            x = self.ceil_pool(torch.relu(self.bn1(self.conv1(x))))
            x = torch.relu(self.depthwise(x))
            x = self.padded_pool(self.strided(self.grouped(x)))
            gate = torch.sigmoid(self.excite(torch.relu(self.squeeze(
                self.pool(x)))))
            x = x * gate + self.shift
            x = (self.offset - x) / self.scale  # broadcast first, then second
            chan = x.mean(dim=1, keepdim=True)  # ReduceMean over the channels
            x = x * torch.sigmoid(chan)
            x = x - chan * x.mean(dim=(2, 3), keepdim=True) / 4
            x = x + x.mean(dim=(1, 3))[:, None, :, None]
            return self.fc(torch.flatten(self.pool(x), 1))

    return Grouped()


def sequence_net(torch, num_classes=10, image=8):
    """A small 1-D network over the image's pixels as a sequence (export it
    at opset 17, where LayerNorm is one ONNX op): a dilated Conv1d, batch
    norm, SiLU (Sigmoid and Mul), MaxPool1d, a transpose to (N, L, C),
    nn.Linear on the last dim (MatMul and a broadcast Add), GELU (written out
    with Erf and constants), LayerNorm, a softmax over the sequence (not the
    last dim) gating the features, and a linear classifier: --model
    sequence."""
    nn = torch.nn

    class Sequence(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(3, 8, 3, padding=2, dilation=2, bias=False)
            self.bn = nn.BatchNorm1d(8)
            self.pool = nn.MaxPool1d(2)
            self.proj = nn.Linear(8, 8)
            self.norm = nn.LayerNorm(8)
            # (image^2 + 2 pad - 4 dilated taps + 1) pixels, halved by the pool.
            self.fc = nn.Linear(8 * (image * image // 2), num_classes)

        def forward(self, x):
            x = torch.flatten(x, 2)
            x = self.pool(nn.functional.silu(self.bn(self.conv(x))))
            x = self.norm(nn.functional.gelu(self.proj(x.transpose(1, 2))))
            x = x * torch.softmax(x, dim=1)
            return self.fc(torch.flatten(x, 1))

    return Sequence()


def vit_tiny_net(torch, num_classes=10, image=64):
    """torchvision's VisionTransformer, two layers of width 16 over 16x16
    patches (export it at opset 17, where LayerNorm is one ONNX op): patch
    embedding, class token (Expand), position embedding, multi-head
    attention, GELU MLPs, the class token's output (Gather): --model
    vit_tiny. torchvision starts the head at zero, which leaves every
    gradient before it 0: the head is drawn at random here, so that the
    encoder's gradients are compared too."""
    import torchvision
    net = torchvision.models.vision_transformer.VisionTransformer(
        image_size=image, patch_size=16, num_layers=2, num_heads=2,
        hidden_dim=16, mlp_dim=32, num_classes=num_classes)
    torch.nn.init.normal_(net.heads.head.weight, std=0.2)
    torch.nn.init.normal_(net.heads.head.bias, std=0.2)
    return net


def normed_net(torch, num_classes=10, image=None):
    """A small CNN with the normalizations ONNX writes as
    InstanceNormalization: nn.GroupNorm (over 4-D and 3-D tensors; its
    export views x as (N, groups, -1) and applies its affine after),
    nn.InstanceNorm2d with affine parameters and nn.InstanceNorm1d without;
    and nn.BatchNorm2d(affine=False), whose weight and bias export as
    constants: --model normed."""
    nn = torch.nn

    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(8, affine=False)
            self.gn1 = nn.GroupNorm(2, 8)
            # No bias: the instance norm after it removes any per-channel
            # shift, so its gradient would be rounding noise around 0.
            self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)
            self.inorm = nn.InstanceNorm2d(8, affine=True)
            self.gn2 = nn.GroupNorm(4, 8)
            self.inorm1d = nn.InstanceNorm1d(8)
            self.fc = nn.Linear(8, num_classes)
            with torch.no_grad():  # off the init's ones and zeros
                for m in (self.gn1, self.inorm, self.gn2):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)

        def forward(self, x):
            x = torch.relu(self.gn1(torch.sigmoid(self.bn(self.conv1(x)))))
            x = torch.relu(self.inorm(self.conv2(x)))
            x = torch.flatten(x, 2)  # (N, C, L): the 3-D forms
            # (A norm without affine right before the mean would make the
            # loss constant: its mean over L is 0.)
            x = torch.tanh(self.gn2(self.inorm1d(x)))
            return self.fc(x.mean(dim=2))

    return Normed()


def pooled_net(torch, num_classes=10, image=None):
    """A small CNN of the reductions ONNX writes as GlobalMaxPool and
    ReduceSum: CBAM's channel attention (nn.AdaptiveMaxPool2d(1) beside
    nn.AdaptiveAvgPool2d(1) through a shared MLP), a sum over the channels
    (keepdim) as a spatial gate, nn.AdaptiveMaxPool1d(1) over the flattened
    map, sums over the spatial dims and over everything; and averaging
    pools that leave the padding out (count_include_pad=False: Inception's
    and NASNet's 3x3 of stride 1, ResNet-D's 2x2 of stride 2 in ceil mode
    over an odd map, and one of stride 2 with padding in ceil mode), and one
    that counts the padding in ceil mode:
    --model pooled (opset 11 writes ReduceSum's axes as an attribute, 13 as
    an input)."""
    nn = torch.nn

    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.mlp = nn.Sequential(nn.Conv2d(8, 2, 1), nn.Tanh(), nn.Conv2d(2, 8, 1))
            self.fc = nn.Linear(16, num_classes)

        def forward(self, x):
            x = torch.tanh(self.conv(x))
            f = nn.functional
            x = f.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)
            # Counting the padding in ceil mode: exported as a Pad and a pool.
            x = f.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True)
            # Ceil mode adds a last window clipped to the map: an odd map
            # of 2 * k + 1 and an even one of 2 * k, both to k + 1.
            odd = f.pad(x, (0, 1, 0, 1), value=0.5)
            x = (f.avg_pool2d(odd, 2, stride=2, ceil_mode=True, count_include_pad=False) +
                 f.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True,
                              count_include_pad=False))
            gate = torch.sigmoid(self.mlp(nn.functional.adaptive_max_pool2d(x, 1)) +
                                 self.mlp(nn.functional.adaptive_avg_pool2d(x, 1)))
            x = x * gate
            x = x * torch.sigmoid(x.sum(dim=1, keepdim=True) / 4)
            peak = nn.functional.adaptive_max_pool1d(torch.flatten(x, 2), 1).flatten(1)
            total = x.sum(dim=(2, 3)) / x.shape[2] + x.sum() / x.numel()
            return self.fc(torch.cat([peak, total], 1))

    return Pooled()


def shuffled_net(torch, num_classes=10, image=None):
    """Sub-pixel convolutions: nn.PixelShuffle (ONNX's DepthToSpace, mode
    CRD) up and nn.PixelUnshuffle (a reshape, transpose and reshape) down:
    --model shuffled."""
    nn = torch.nn

    class Shuffled(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.up = nn.PixelShuffle(2)
            self.mix = nn.Conv2d(4, 4, 3, padding=1)
            self.down = nn.PixelUnshuffle(2)
            self.fc = nn.Linear(16, num_classes)

        def forward(self, x):
            x = self.mix(torch.tanh(self.up(self.conv(x))))
            return self.fc(torch.tanh(self.down(x)).mean(dim=(2, 3)))

    return Shuffled()


def misc_net(torch, num_classes=10, image=8):
    """Operators a model writes in passing: -x (Neg), torch.reciprocal
    (Reciprocal) of a positive tensor, nn.LayerNorm over (C, H, W) (at
    opset 17 one LayerNormalization of axis -3, written out before),
    x.max(dim) (ReduceMax), x.repeat (Tile) and torch.amin (ReduceMin):
    --model misc."""
    nn = torch.nn

    class Misc(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.norm = nn.LayerNorm([4, image, image])
            self.fc = nn.Linear(4, num_classes)

        def forward(self, x):
            x = self.norm(self.conv(x))
            x = -torch.tanh(x) + torch.reciprocal(torch.sigmoid(x) + 1.0)
            x = x * x.max(dim=1, keepdim=True)[0].repeat(1, 4, 1, 1)
            return self.fc(x.mean(dim=(2, 3)) + torch.amin(x, dim=(2, 3)))

    return Misc()


def mnist_net(torch, num_classes=10, image=None):
    """PyTorch's MNIST example (pytorch/examples, mnist/main.py) without its
    dropout: two convolutions, a max pool, two linear layers and
    F.log_softmax, trained by F.nll_loss (`pebble import --loss nll`, which
    takes the last log_softmax into the loss): --model mnist."""
    nn = torch.nn
    F = torch.nn.functional

    class Net(nn.Module):
        pebble_loss = "nll"

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, 1)
            self.conv2 = nn.Conv2d(8, 16, 3, 1)
            side = ((image or 8) - 4) // 2
            self.fc1 = nn.Linear(16 * side * side, 32)
            self.fc2 = nn.Linear(32, num_classes)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
            x = F.relu(self.fc1(torch.flatten(x, 1)))
            return F.log_softmax(self.fc2(x), dim=1)

    return Net()


def upconv_net(torch, num_classes=10, image=None):
    """A small decoder of transposed convolutions (ONNX's ConvTranspose):
    nn.ConvTranspose2d with stride, padding and output_padding (back to the
    input's size), grouped without bias, dilated; nn.ConvTranspose1d over
    the flattened map; nn.ConvTranspose3d over it viewed as one frame:
    --model upconv."""
    nn = torch.nn

    class Upconv(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
            self.grouped = nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2, bias=False)
            self.dilated = nn.ConvTranspose2d(4, 4, 3, dilation=2, padding=2)
            self.up1d = nn.ConvTranspose1d(4, 4, 4, stride=2, padding=1)
            self.up3d = nn.ConvTranspose3d(4, 2, (1, 3, 3), stride=(1, 2, 2),
                                           padding=(0, 1, 1))
            self.fc = nn.Linear(6, num_classes)

        def forward(self, x):
            x = torch.relu(self.up(torch.relu(self.down(x))))
            x = self.dilated(torch.tanh(self.grouped(x)))
            line = self.up1d(torch.flatten(x, 2))
            frames = self.up3d(x.unsqueeze(2))
            return self.fc(torch.cat([frames.mean(dim=(2, 3, 4)),
                                      torch.tanh(line).mean(dim=2)], 1))

    return Upconv()


def resized_net(torch, num_classes=10, image=12):
    """Resizing to sizes and by fractional factors (ONNX's Resize): a
    pyramid pooling module (PSPNet's: adaptive pools to 1, 2, 3 and 6 bins,
    each upsampled bilinearly back to the feature map's size, given as a
    size), F.interpolate by scale_factor 1.5 (nearest) and 0.6 (bilinear,
    downsampling), to a size (5, 7) with align_corners, and bicubic by 1.5
    and to a size with align_corners; the image's size must be a multiple
    of 12 (PyTorch exports adaptive pools whose bins divide the map only):
    --model resized."""
    nn = torch.nn
    F = torch.nn.functional

    class Resized(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.reduce = nn.ModuleList(nn.Conv2d(8, 2, 1) for _ in range(4))
            self.fuse = nn.Conv2d(8 + 8, 8, 3, padding=1)
            self.fc = nn.Linear(8 * 3, num_classes)

        def forward(self, x):
            f = torch.relu(self.stem(x))
            size = f.shape[-2:]
            pyramid = [F.interpolate(conv(F.adaptive_avg_pool2d(f, bins)), size=size,
                                     mode="bilinear", align_corners=False)
                       for conv, bins in zip(self.reduce, (1, 2, 3, 6))]
            y = torch.relu(self.fuse(torch.cat([f] + pyramid, 1)))
            a = F.interpolate(y, scale_factor=1.5, mode="nearest")
            b = F.interpolate(y, scale_factor=0.6, mode="bilinear", align_corners=False)
            c = F.interpolate(y, size=(5, 7), mode="bilinear", align_corners=True)
            d = F.interpolate(y, scale_factor=1.5, mode="bicubic", align_corners=False)
            e = F.interpolate(torch.tanh(y), size=(7, 5), mode="bicubic", align_corners=True)
            return self.fc(torch.cat([a.mean(dim=(2, 3)), b.mean(dim=(2, 3)),
                                      c.mean(dim=(2, 3)) + d.amax(dim=(2, 3)) + e.mean(dim=(2, 3))],
                                     1))

    return Resized()


def token_batch(torch, vocab, batch, image, classes, gen, padded=False):
    """Token ids (batch, image) of a vocabulary of `vocab` and class
    targets; `padded`: id 0 pads about a third of the ids after the first,
    which never is 0."""
    if not padded:
        return (torch.randint(0, vocab, (batch, image), generator=gen),
                torch.randint(0, classes, (batch,), generator=gen))
    ids = torch.randint(1, vocab, (batch, image), generator=gen)
    ids[:, 1:] *= (torch.rand((batch, image - 1), generator=gen) > 0.3).long()
    return ids, torch.randint(0, classes, (batch,), generator=gen)


def text_net(torch, num_classes=10, image=8, padding_mask=False):
    """A small text classifier over `image` token ids of a vocabulary of 50
    (nn.Embedding, Gather in ONNX): token embeddings, position embeddings at
    a slice of a non-persistent buffer of position ids (a constant 0, 1, ...
    the importer makes an arange), one nn.TransformerEncoderLayer (batch
    first, GELU, dropout 0), the mean over the sequence and a linear
    classifier (export it at opset 17, where LayerNorm is one ONNX op):
    --model text. With `padding_mask`, id 0 pads (token_batch) and the
    layer's src_key_padding_mask is ids == 0, a mask computed from the
    input: --model text_padded."""
    nn = torch.nn

    class Text(nn.Module):
        vocab = 50

        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(self.vocab, 16)
            self.pos = nn.Embedding(2 * image, 16)
            self.register_buffer("position_ids",
                                 torch.arange(2 * image).expand(1, -1),
                                 persistent=False)
            self.layer = nn.TransformerEncoderLayer(
                16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)
            self.fc = nn.Linear(16, num_classes)

        def forward(self, ids):
            h = self.tok(ids) + self.pos(self.position_ids[:, :ids.shape[1]])
            if padding_mask:
                h = self.layer(h, src_key_padding_mask=ids == 0)
            else:
                h = self.layer(h)
            return self.fc(h.mean(dim=1))

        def make_batch(self, torch, batch, classes, gen):
            """Token ids (batch, image), padded where `padding_mask`, and
            class targets."""
            return token_batch(torch, self.vocab, batch, image, classes, gen,
                               padded=padding_mask)

    return Text()


def token_lm_net(torch, num_classes=10, image=8, bool_mask=False):
    """A small next-token model over `image` token ids of a vocabulary of
    50: positions from torch.arange in the forward, one causal
    nn.TransformerEncoderLayer (its mask nn.Transformer's
    generate_square_subsequent_mask, a constant of the export that the
    importer makes the softmax's causal attr), its output layer tied to the
    input embedding (one parameter read by Gather and by MatMul: their
    gradients add); the logits flattened to (batch x image, vocabulary), so
    that the imported cross-entropy's classes are the vocabulary (export it
    at opset 17, where LayerNorm is one ONNX op): --model token_lm. With
    `bool_mask`, the mask is boolean (True where a key is hidden), which a
    symbolic batch exports as a Where of it: --model token_lm_bool."""
    nn = torch.nn

    class TokenLm(nn.Module):
        vocab = 50

        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(self.vocab, 16)
            self.pos = nn.Embedding(image, 16)
            self.layer = nn.TransformerEncoderLayer(
                16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
            mask = nn.Transformer.generate_square_subsequent_mask(image)
            self.register_buffer("mask", mask < 0 if bool_mask else mask,
                                 persistent=False)
            self.out = nn.Linear(16, self.vocab)
            self.out.weight = self.tok.weight

        def forward(self, ids):
            h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
            h = self.layer(h, src_mask=self.mask[:ids.shape[1], :ids.shape[1]])
            return self.out(h).flatten(0, 1)

        def make_batch(self, torch, batch, classes, gen):
            """Token ids (batch, image) and the next token of each."""
            ids = torch.randint(0, self.vocab, (batch, image + 1), generator=gen)
            return ids[:, :-1].contiguous(), ids[:, 1:].reshape(-1).contiguous()

    return TokenLm()


def normalized_net(torch, num_classes=10, image=None):
    """2-norms (ONNX's ReduceL2): F.normalize of features, and of features
    that a shifted ReLU makes all zero (PyTorch's gradient there is 0),
    x.norm(dim=1, keepdim=True), and a norm over the spatial dims of a
    feature map without keepdim: --model normalized."""
    nn = torch.nn
    F = torch.nn.functional

    class Normalized(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.fc = nn.Linear(8, 6)
            self.head = nn.Linear(6 + 1 + 1, num_classes)

        def forward(self, x):
            maps = torch.relu(self.conv(x))
            f = self.fc(maps.mean(dim=(2, 3)))
            dead = torch.relu(f - 100.0)
            unit = F.normalize(f, dim=1) + F.normalize(dead, dim=1)
            spatial = maps.norm(dim=(2, 3)).mean(dim=1, keepdim=True)
            return self.head(torch.cat([unit, f.norm(dim=1, keepdim=True), spatial], 1))

    return Normalized()


def recurrent_net(torch, num_classes=10, image=8):
    """Recurrent layers over `image` token ids of a vocabulary of 30 (ONNX's
    LSTM, GRU and RNN, unrolled at import): a two-layer nn.LSTM (batch
    first), a bidirectional nn.GRU over its outputs (sequence first), an
    nn.RNN with ReLU whose initial state is computed from the input; the
    classifier reads the GRU's last step, the RNN's last state and the
    LSTM's last cell state: --model recurrent."""
    nn = torch.nn

    class Recurrent(nn.Module):
        vocab = 30

        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(self.vocab, 8)
            self.lstm = nn.LSTM(8, 12, num_layers=2, batch_first=True)
            self.gru = nn.GRU(12, 6, bidirectional=True)
            self.start = nn.Linear(8, 5)
            self.rnn = nn.RNN(12, 5, nonlinearity="relu", batch_first=True)
            self.fc = nn.Linear(12 + 5 + 12, num_classes)

        def forward(self, ids):
            x = self.emb(ids)
            y, (_, c) = self.lstm(x)
            g, _ = self.gru(y.transpose(0, 1))
            h0 = torch.tanh(self.start(x.mean(dim=1))).unsqueeze(0)
            _, h = self.rnn(y, h0)
            return self.fc(torch.cat([g[-1], h[0], c[-1]], 1))

        def make_batch(self, torch, batch, classes, gen):
            """Token ids (batch, image) and class targets."""
            return token_batch(torch, self.vocab, batch, image, classes, gen)

    return Recurrent()


def focus_net(torch, num_classes=10, image=8):
    """Strided slices of computed tensors: YOLOv5's Focus layer (the four
    pixel phases x[..., ::2, ::2], x[..., 1::2, ::2], ... concatenated on
    the channels), a step of 3 over a size it does not divide, steps on
    two dims at once with offsets, and torch.flip (a Slice by a step of -1
    in ONNX) of one dim and of two: --model focus."""
    nn = torch.nn

    class Focus(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3, padding=1)
            self.conv = nn.Conv2d(16, 8, 3, padding=1)
            self.fc = nn.Linear(8 + 4, num_classes)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            phases = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2],
                                x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)
            y = torch.tanh(self.conv(phases))[:, :, ::3]
            z = x[:, :, 1:-1:2, 2::3]
            mirrored = torch.flip(x, [3]) * x
            z = z + torch.flip(z, [2, 3])[:, :, :, :1] + mirrored[:, :, 1:-1:2, 2::3]
            return self.fc(torch.cat([y.mean(dim=(2, 3)), z.mean(dim=(2, 3))], 1))

    return Focus()


def masked_net(torch, num_classes=10, image=8):
    """A small text classifier over `image` token ids of a vocabulary of 50
    where id 0 pads: attention whose scores are masked_fill-ed with -inf at
    the padded keys (a mask computed from the ids: Equal, Unsqueeze and
    Where in ONNX), then the masks of element values: torch.where(a > 0, a,
    0.1 a), masked_fill(~(a < 0.5), 0), nn.Hardshrink and nn.Softshrink
    (comparisons, Or, Where), a mask cast to float and
    multiplied in, torch.where of two computed tensors and a logical and:
    --model masked."""
    nn = torch.nn

    class Masked(nn.Module):
        vocab = 50

        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(self.vocab, 16)
            self.q = nn.Linear(16, 16)
            self.shrink = nn.Hardshrink(0.3)
            self.soft = nn.Softshrink(0.2)
            self.fc = nn.Linear(16, num_classes)

        def forward(self, ids):
            x = self.tok(ids)
            scores = self.q(x) @ x.transpose(1, 2) / 4.0
            pad = ids == 0
            scores = scores.masked_fill(pad[:, None, :], float("-inf"))
            a = scores.softmax(-1) @ x
            a = torch.where(a > 0, a, 0.1 * a)
            a = a.masked_fill(~(a < 0.5), 0.0)
            b = self.shrink(a) + (a > 0.1).float() * a + self.soft(a)
            both = (a > -0.2) & (b < 0.3)
            c = torch.where(both, torch.tanh(b), torch.sigmoid(a))
            return self.fc(c.masked_fill(pad[:, :, None], 0.0).sum(dim=1))

        def make_batch(self, torch, batch, classes, gen):
            """Token ids (batch, image), padded, and class targets."""
            return token_batch(torch, self.vocab, batch, image, classes, gen, padded=True)

    return Masked()


def extrema_net(torch, num_classes=10, image=None):
    """Log-softmax inside the model (over the channels of a feature map and
    over its last dim), torch.maximum and torch.minimum of computed tensors,
    of a tensor and a constant, and of a tensor with itself (a tie
    everywhere: half the gradient each way), torch.sign: --model extrema."""
    nn = torch.nn
    F = torch.nn.functional

    class Extrema(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.gate = nn.Conv2d(3, 8, 1)
            self.fc = nn.Linear(8 * 3, num_classes)

        def forward(self, x):
            a = self.conv(x)
            b = self.gate(x)
            p = F.log_softmax(a, dim=1)
            q = torch.log_softmax(b, dim=-1)
            m = torch.maximum(p, q) + torch.minimum(a, torch.relu(b))
            tie = torch.maximum(a, a) + torch.minimum(b, torch.tensor(0.25))
            s = torch.sign(b) * a
            feats = [m.mean(dim=(2, 3)), (tie + s).mean(dim=(2, 3)),
                     torch.max(p, q).amax(dim=(2, 3))]
            return self.fc(torch.cat(feats, 1))

    return Extrema()


def labels_net(torch, num_classes=10, image=None, binary=False):
    """Logits of independent labels under nn.BCEWithLogitsLoss (`pebble
    import --loss bce`): `num_classes` labels of soft targets in [0, 1]
    (multi-label tagging: --model labels), or one logit per image, its
    (N, 1) output squeezed to (N,), against 0/1 targets (a binary
    classifier, a GAN's discriminator: --model binary)."""
    nn = torch.nn

    class Labels(nn.Module):
        pebble_loss = "bce"

        def __init__(self):
            super().__init__()
            # No bias before the norm (it would get a gradient of ~1e-9).
            self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 1 if binary else num_classes)

        def forward(self, x):
            y = torch.nn.functional.leaky_relu(self.bn(self.conv(x)), 0.2)
            logits = self.fc(y.mean(dim=(2, 3)))
            return logits.squeeze(1) if binary else logits

        def make_batch(self, torch, batch, classes, gen):
            """Images and targets: 0/1 per image, or a probability per label
            (some exactly 0 or 1)."""
            x = torch.randn((batch, 3, image, image), generator=gen)
            if binary:
                return x, torch.randint(0, 2, (batch,), generator=gen).float()
            t = torch.rand((batch, classes), generator=gen)
            t[0, 0], t[-1, -1] = 0.0, 1.0
            return x, t

    return Labels()


def standardized_net(torch, num_classes=10, image=None):
    """Not everything an ONNX file holds is trained (`pebble import
    --frozen`): the input standardized by buffers (register_buffer: a
    mean and a standard deviation per channel, read by Sub and Div), and
    a frozen stem (requires_grad=False: a convolution and its batch norm's
    affine parameters; the norm's statistics still move) before a trained
    convolution and classifier: --model standardized."""
    nn = torch.nn

    class Standardized(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer(
                "mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
            self.register_buffer(
                "std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(8), nn.ReLU())
            for p in self.stem.parameters():
                p.requires_grad_(False)
            self.conv = nn.Conv2d(8, 8, 3, stride=2, padding=1)
            self.fc = nn.Linear(8, num_classes)

        def forward(self, x):
            y = self.stem((x - self.mean) / self.std)
            return self.fc(torch.relu(self.conv(y)).mean(dim=(2, 3)))

    return Standardized()


def constants_net(torch, num_classes=10, image=8):
    """Constants the forward computes, which the exporter writes into the
    file (ONNX Constant tensors read by computations: pebble's `constant`):
    sinusoidal tables of positions from torch.arange (Sin, Cos, Exp and
    arithmetic of constants, folded), a band mask of tril and triu of ones
    (Trilu, Not: folded; from opset 14) and tril(ones) == 0 (a comparison of
    constants) filled into the features, a table truncated by .long() (a
    Cast that changes values), a per-channel scale from torch.tensor
    multiplied in and a fixed channel mask in torch.where, a table of
    relative positions and a causal mask by broadcasting, a table cast to
    float and divided. Exported with a symbolic batch, the aranges are
    Ranges (of floats too) and the tables are folded at import:
    --model constants."""
    nn = torch.nn

    class Constants(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4, num_classes)

        def forward(self, x):
            y = self.conv(x)
            w = y.shape[-1]
            y = y + torch.sin(torch.arange(w, dtype=torch.float32) / 3.0)
            # A transformer's table: frequencies exp(2i * -log(1e4) / d).
            position = torch.arange(w, dtype=torch.float32).unsqueeze(1)
            frequency = torch.exp(torch.arange(0, 4, 2, dtype=torch.float32)
                                  * (-math.log(10000.0) / 4))
            table = torch.cat([torch.sin(position * frequency),
                               torch.cos(position * frequency)], 1)  # (w, 4)
            y = y + table.t().unsqueeze(2)
            band = torch.ones(w, w, dtype=torch.bool).tril(1).triu(-1)
            y = y.masked_fill(~band, -1.5)
            y = y.masked_fill(torch.tril(torch.ones(w, w)) == 0, 0.25)
            y = y + (torch.arange(w) * 0.7).long()  # truncated, then promoted
            y = y * (1 + torch.arange(w).float() / w)  # not an integer division
            r = torch.arange(w)
            y = y + 0.1 * (r[:, None] - r[None, :]).float()  # relative positions
            y = y.masked_fill(r[:, None] >= r[None, :], 0.5)  # a broadcast comparison
            y = y * torch.tensor([0.5, 1.0, 2.0, -1.0]).view(1, 4, 1, 1)
            keep = torch.tensor([True, False, True, True]).view(1, 4, 1, 1)
            y = torch.where(keep, y, torch.zeros_like(y))
            return self.fc(torch.relu(y).mean(dim=(2, 3)))

    return Constants()


def powers_net(torch, num_classes=10, image=8):
    """Pow by other exponents (Note [Pow of a positive base] in
    graph/import/onnx_elementwise_ops.cc): GeM pooling (Radenovic et al.),
    a learnable exponent p of features clamped positive and the mean to
    the 1/p, both exp(p log x); x ** 4 and x ** -3 of any sign by products;
    sigmoid(x) ** 1.7 and softplus(x) ** -1.5 of positive bases, a sigmoid
    that underflows to 0, x ** 0: --model powers."""
    nn = torch.nn
    F = torch.nn.functional

    class Powers(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.p = nn.Parameter(torch.ones(1) * 3.0)
            self.fc = nn.Linear(16, num_classes)

        def forward(self, x):
            y = self.conv(x)
            gem = F.avg_pool2d(y.clamp(min=1e-6).pow(self.p),
                               (y.size(-2), y.size(-1))).pow(1.0 / self.p)
            z = (0.1 * y) ** 4 - 1.0 / (2.0 + torch.sigmoid(y)) ** 3
            z = z + torch.sigmoid(y) ** 1.7 + F.softplus(y).pow(-1.5)
            # A sigmoid that underflows to 0 for most values (clipped
            # before the log: no NaN gradient) and x ** 0.
            z = z + torch.sigmoid(60 * y - 20) ** 1.7 + y ** 0
            return self.fc(torch.cat([gem.flatten(1), z.mean(dim=(2, 3))], 1))

    return Powers()


def vae_net(torch, num_classes=10, image=8):
    """A variational autoencoder's reparameterization, z = mu + eps * std
    with eps = torch.randn_like(std), and torch.rand_like noise (ONNX's
    RandomNormalLike, RandomUniformLike: pebble's seeded `random` noise,
    not PyTorch's stream). The noise is scaled by 0 here, so that the
    step's values are comparable; its shape, memory and place in the plan
    are the model's: --model vae."""
    nn = torch.nn

    class Vae(nn.Module):
        noise_scale = 0.0

        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(3 * image * image, 32)
            self.mu = nn.Linear(32, 8)
            self.logvar = nn.Linear(32, 8)
            self.dec = nn.Linear(8, num_classes)

        def forward(self, x):
            h = torch.relu(self.enc(x.flatten(1)))
            mu, logvar = self.mu(h), self.logvar(h)
            std = torch.exp(0.5 * logvar)
            z = mu + self.noise_scale * torch.randn_like(std) * std
            z = z + self.noise_scale * torch.rand_like(mu)
            return self.dec(z)

    return Vae()


def casts_net(torch, num_classes=10, image=8):
    """Casts of computed tensors (ONNX's Cast, pebble's `cast`): a uint8
    image made float inside the model (x.float() / 255), through int64 and
    back, a feature map through float16 and back (its gradient cast back,
    as autograd casts it), scaled and shifted there by float16 constants
    (a scalar and a folded table), and truncated to int64 (no gradient
    there, as in PyTorch): --model casts."""
    nn = torch.nn

    class Casts(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 6, 3, padding=1)
            self.fc = nn.Linear(6, num_classes)

        def forward(self, x):
            pixels = x.float() / 255 + x.long().float() / 1024
            h = torch.relu(self.conv(pixels))
            table = torch.tensor([1, 3, 5, 7, 9, 11], dtype=torch.float16).view(1, 6, 1, 1) / 8
            h = (h.half() * 0.375 + table).float() * 2 + (torch.sigmoid(h) * 3).long().float()
            return self.fc(h.mean(dim=(2, 3)))

        def make_batch(self, torch, batch, classes, gen):
            """uint8 images (batch, 3, image, image) and class targets."""
            return (torch.randint(0, 256, (batch, 3, image, image), generator=gen,
                                  dtype=torch.uint8),
                    torch.randint(0, classes, (batch,), generator=gen))

    return Casts()


# Models of this file, beside torchvision's. A model with a `make_batch`
# method (torch, batch, classes, generator) -> (input, target) makes its
# own batch; the others take (batch, 3, image, image) images and a class
# index each.
LOCAL_MODELS = {"activations": activations_net, "smooth": smooth_net,
                "padded": padded_net,
                "grouped": grouped_net,
                "sequence": sequence_net, "vit_tiny": vit_tiny_net,
                "misc": misc_net, "normed": normed_net, "pooled": pooled_net,
                "shuffled": shuffled_net, "mnist": mnist_net,
                "upconv": upconv_net, "masked": masked_net, "focus": focus_net,
                "recurrent": recurrent_net, "normalized": normalized_net,
                "extrema": extrema_net, "resized": resized_net,
                "labels": labels_net, "standardized": standardized_net,
                "constants": constants_net, "powers": powers_net, "vae": vae_net,
                "casts": casts_net,
                "binary": lambda torch, classes, image: labels_net(
                    torch, classes, image, binary=True),
                "text": text_net, "token_lm": token_lm_net,
                "text_padded": lambda torch, classes, image: text_net(
                    torch, classes, image, padding_mask=True),
                "token_lm_bool": lambda torch, classes, image: token_lm_net(
                    torch, classes, image, bool_mask=True)}


def make_batch(torch, net, batch, image, classes, gen):
    """(input, target) of `batch` samples for `net`."""
    if hasattr(net, "make_batch"):
        return net.make_batch(torch, batch, classes, gen)
    return (torch.randn((batch, 3, image, image), generator=gen),
            torch.randint(0, classes, (batch,), generator=gen,
                          dtype=torch.int64))


def build_model(torch, torchvision, models, args):
    """The seeded torchvision model (or one of LOCAL_MODELS) in training mode,
    dropout p = 0, batch-norm affine parameters perturbed
    (models.perturb_batchnorm); with the count of dropouts and whether the
    residual branches start at zero."""
    if args.model in LOCAL_MODELS:
        torch.manual_seed(args.seed)
        net = LOCAL_MODELS[args.model](torch, args.classes or 10, args.image)
        net.train()
        models.perturb_batchnorm(net)
        freeze(net, args.freeze)
        return net, 0, False
    builder = getattr(torchvision.models, args.model, None)
    if (args.model.startswith("_") or builder is None or not callable(builder)
            or isinstance(builder, type)):
        raise UsageError("--model %s: not a torchvision.models builder "
                         "(e.g. resnet18, mobilenet_v2)" % args.model)
    kwargs = {"weights": None}
    if args.classes:
        kwargs["num_classes"] = args.classes
    if args.model in ("googlenet", "inception_v3"):
        # One output for the loss: no auxiliary classifiers.
        kwargs.update(aux_logits=False, init_weights=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if args.default_init:
                    raise TypeError("--default-init")
                # ResNets: the last batch norm of each residual branch starts
                # at 0 (then perturb_batchnorm moves it off). With
                # torchvision's default init, resnet50's own fp32 gradients
                # are 1e-2 off its fp64 ones (any batch, image 64 to 128),
                # too far for the 1e-4 tolerance; with this, 1.1e-5.
                torch.manual_seed(args.seed)
                net = builder(zero_init_residual=True, **kwargs)
                zero_init = True
            except TypeError:  # not a ResNet
                torch.manual_seed(args.seed)
                net = builder(**kwargs)
                zero_init = False
    except (TypeError, ValueError) as e:
        raise UsageError("--model %s: torchvision.models.%s(%s) failed: %s" % (
            args.model, args.model,
            ", ".join("%s=%r" % kv for kv in kwargs.items()), e)) from None
    if not isinstance(net, torch.nn.Module):
        raise UsageError("--model %s: torchvision.models.%s() is not a module"
                         % (args.model, args.model))
    if args.classifier_width:
        _narrow_classifier(torch, net, args.classifier_width, args.seed)
    freeze(net, args.freeze)
    dropouts = 0
    # Stochastic depth (EfficientNet, ConvNeXt) drops whole samples at
    # random in training mode, which torch.onnx.export cannot write
    # (Bernoulli): at p = 0 it is the identity, like a dropout of 0.
    stochastic_depth = getattr(getattr(torchvision, "ops", None), "StochasticDepth", ())
    for m in net.modules():
        if isinstance(m, (torch.nn.modules.dropout._DropoutNd, stochastic_depth)):
            m.p = 0.0
            dropouts += 1
    models.perturb_batchnorm(net)
    net.train()
    return net, dropouts, zero_init


def freeze(net, patterns):
    """Sets requires_grad=False on the parameters that one of the
    comma-separated fnmatch `patterns` matches (--freeze); a pattern that
    matches none is a UsageError."""
    for pattern in filter(None, (p.strip() for p in patterns.split(","))):
        matched = [p for name, p in net.named_parameters()
                   if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise UsageError("--freeze %s matches no parameter of the model"
                             % pattern)
        for p in matched:
            p.requires_grad_(False)


def _narrow_classifier(torch, net, width, seed):
    """The Linear layers of `net.classifier` (VGG's, AlexNet's) made `width`
    wide inside: the first keeps its inputs, the last its outputs, every
    other layer (ReLU, Dropout) stays. VGG's classifier holds 119M of its
    133M parameters: the import checks the same operators at a sliver of
    the export's and the run's time (the suite's time). UsageError where the
    model has no such classifier."""
    head = getattr(net, "classifier", None)
    linears = [i for i, m in enumerate(head or ()) if isinstance(m, torch.nn.Linear)]
    if not isinstance(head, torch.nn.Sequential) or len(linears) < 2:
        raise UsageError("--classifier-width: the model has no classifier of several "
                         "Linear layers (nn.Sequential)")
    torch.manual_seed(seed + 1)
    for k, i in enumerate(linears):
        inputs = head[i].in_features if k == 0 else width
        outputs = head[i].out_features if k == len(linears) - 1 else width
        head[i] = torch.nn.Linear(inputs, outputs)


def export_onnx(torch, net, x, path, opset, model_name, dynamic_batch=False):
    """torch.onnx.export in training mode (with a symbolic batch where
    `dynamic_batch`); returns the list of warnings' texts. UsageError where
    the exporter refuses the model at this size."""
    options = dict(training=torch.onnx.TrainingMode.TRAINING,
                   do_constant_folding=False, input_names=["input"],
                   output_names=["logits"], opset_version=opset)
    if dynamic_batch:
        options["dynamic_axes"] = {"input": {0: "batch"}, "logits": {0: "batch"}}
    # PyTorch 2.9 and later export through torch.export by default; the
    # TorchScript exporter (the only one of PyTorch 1.13) keeps training-mode
    # batch norm and dropout as this check expects.
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        options["dynamo"] = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.onnx.export(copy.deepcopy(net), x, path, **options)
        except Exception as e:  # the exporter raises several types
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            first = first.split(" Please feel free")[0].split("  [Caused by")[0]
            hint = ""
            if "adaptive" in first and "factor" in first:
                hint = (" (the exporter needs the feature map to be a multiple "
                        "of the adaptive pool's output: for vgg and alexnet, "
                        "--image a multiple of 224)")
            raise UsageError("torch.onnx.export of %s (input %s, opset %d) "
                             "failed: %.400s%s" % (
                                 model_name, tuple(x.shape), opset, first,
                                 hint)) from None
    return [str(w.message) for w in caught]


def summarize_warnings(texts):
    if not texts:
        return
    nbt = [t for t in texts if "num_batches_tracked" in t]
    others = collections.Counter(
        t.strip().splitlines()[0][:200] for t in texts if t not in nbt)
    parts = []
    if nbt:
        parts.append("%d about num_batches_tracked's update removed" % len(nbt))
    log("torch.onnx.export warned %d times%s" % (
        len(texts), (": " + ", ".join(parts)) if parts else ""))
    for text, n in others.most_common():
        log("  %s%s" % (text, " (x%d)" % n if n > 1 else ""))


def onnx_summary(np, onnx, path):
    """{initializers: {name: array}, inputs: [names], opset, ops: Counter}."""
    from onnx import numpy_helper
    model = onnx.load(path)
    g = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    opset = max((o.version for o in model.opset_import
                 if o.domain in ("", "ai.onnx")), default=None)
    return {"initializers": inits,
            "inputs": [i.name for i in g.input if i.name not in inits],
            "outputs": [o.name for o in g.output],
            "opset": opset,
            "ops": collections.Counter(n.op_type for n in g.node),
            "nodes": len(g.node)}


def batchnorm_buffers(torch, net, names):
    """The ids `<module>.<name>` of every batch norm of `net`, for each of
    `names` (its buffers: running_mean, running_var, num_batches_tracked)."""
    return {(prefix + "." if prefix else "") + name
            for prefix, m in net.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
            for name in names}


def expected_persistent(np, torch, net, x, t):
    """The persistent tensors pebble's graph must hold: {id: (tensor, role)},
    and the batch norms' num_batches_tracked ids. state_dict() (without
    num_batches_tracked unless NUM_BATCHES_TRACKED), plus input and target."""
    nbt = batchnorm_buffers(torch, net, ["num_batches_tracked"])
    params = dict(net.named_parameters())
    # A tied parameter is in state_dict() under each of its names, once in
    # named_parameters() and in the ONNX file.
    param_storage = {p.data_ptr(): name for name, p in params.items()}
    expected = collections.OrderedDict()
    for name, value in net.state_dict().items():
        if name in nbt and not NUM_BATCHES_TRACKED:
            continue
        if name not in params and param_storage.get(value.data_ptr()) is not None:
            continue
        # (a frozen parameter is a buffer: pebble import --frozen)
        trained = name in params and params[name].requires_grad
        expected[name] = (value, "parameter" if trained else "buffer")
    expected["input"] = (x, "input")
    expected["target"] = (t, "input")
    return expected, sorted(nbt)


def frozen_initializers(torch, net, initializers):
    """The ONNX file's initializers that `pebble import --frozen` must name:
    the buffers but batch norms' running statistics (which the importer
    knows) and the frozen parameters (requires_grad=False), sorted."""
    stats = batchnorm_buffers(
        torch, net, ["running_mean", "running_var", "num_batches_tracked"])
    frozen = {name for name, _ in net.named_buffers() if name not in stats}
    frozen |= {name for name, p in net.named_parameters() if not p.requires_grad}
    return sorted(name for name in frozen if name in initializers)


def write_inputs(np, expected, inputs_dir):
    """Writes every expected persistent tensor as inputs_dir/<file>.npy;
    returns {id: (shape, dtype name)} as crosscheck.check_graph_matches
    takes it."""
    written = {}
    for name, (value, _) in expected.items():
        array = value.detach().cpu().numpy()
        if array.dtype not in (np.float32, np.int64, np.uint8):
            raise AssertionError("%s: unexpected dtype %s" % (name, array.dtype))
        array = np.array(array, order="C", copy=True)
        np.save(os.path.join(inputs_dir, tensor_file_name(name)), array)
        written[name] = (tuple(array.shape), cc.npy_dtype_name(np, array.dtype))
    return written


def explain_mismatch(desc, expected, written, summary, nbt):
    """Lines that say where each id on one side only comes from, ids with
    the same reason grouped on one line, and shape disagreements beside the
    ONNX initializer's own shape."""
    persistent = {n["id"]: n for n in desc["nodes"] if n.get("persistent")}
    inits = summary["initializers"]
    reasons = collections.OrderedDict()

    def add(why, name):
        reasons.setdefault(why, []).append(name)

    for name in sorted(set(persistent) - set(written)):
        if name in nbt:
            add("pebble has them, this check does not expect them: batch-norm "
                "num_batches_tracked (NUM_BATCHES_TRACKED is False: the "
                "graph must leave them out)", name)
        elif name in inits:
            add("pebble has them, torch does not: initializers of the ONNX "
                "file that are no state_dict() entries of the model", name)
        elif name in summary["inputs"]:
            add("pebble has them, torch does not: graph inputs of the ONNX "
                "file", name)
        else:
            add("pebble has them, torch does not: neither ONNX initializers "
                "nor ONNX graph inputs (the importer made them)", name)
    for name in sorted(set(written) - set(persistent)):
        if name in nbt:
            add("torch has them, pebble does not: batch-norm "
                "num_batches_tracked, which docs/import.md puts in the graph "
                "beside running_mean (ONNX has no initializer for them)", name)
        elif name == "input":
            add("torch has it, pebble does not: the ONNX graph input, "
                "exported with input_names=['input'] (ONNX graph inputs: %s)"
                % summary["inputs"], name)
        elif name == "target":
            add("torch has it, pebble does not: the target of --loss "
                "cross-entropy", name)
        elif name in inits:
            add("torch has them, pebble does not: %ss that are initializers "
                "of the ONNX file (the importer dropped or renamed them)"
                % expected[name][1], name)
        else:
            add("torch has them, pebble does not: %ss that are not in the "
                "ONNX file (the exporter left them out: unused by the "
                "forward pass?)" % expected[name][1], name)
    lines = ["%s (%d): %s" % (why, len(names), ", ".join(names))
             for why, names in reasons.items()]
    for name in sorted(set(persistent) & set(written)):
        got = (tuple(persistent[name].get("shape") or ()),
               persistent[name].get("dtype"))
        if got != written[name]:
            lines.append("'%s': pebble %s %s, torch %s %s%s" % (
                name, got[1], list(got[0]), written[name][1],
                list(written[name][0]),
                ", ONNX initializer %s %s" % (inits[name].dtype,
                                              list(inits[name].shape))
                if name in inits else ""))
    return lines


def check_graph(np, desc, expected, written, order, summary, nbt, n_params):
    """The graph's persistent nodes, roles, outputs and parameter bytes.
    Returns failure lines."""
    failures = []
    try:
        cc.check_graph_matches(desc, written, order)
    except Failure as e:
        # crosscheck's message names each id; keep its lines on the outputs
        # and say where the persistent ids on one side only come from.
        lines = [l.strip() for l in str(e).splitlines()[1:]]
        outputs = [l for l in lines if l.startswith("graph outputs differ")]
        failures.append(
            "the imported graph's persistent nodes are not the model's "
            "state_dict() entries%s plus input and target:\n  " % (
                "" if NUM_BATCHES_TRACKED else " (without num_batches_tracked)")
            + "\n  ".join(
                explain_mismatch(desc, expected, written, summary, nbt)
                + outputs))
    bad_roles = []
    for n in desc["nodes"]:
        if n.get("persistent") and n["id"] in expected:
            want = expected[n["id"]][1]
            if n.get("role") != want:
                bad_roles.append("'%s' is %s, should be %s" % (
                    n["id"], n.get("role"), want))
    if bad_roles:
        failures.append("persistent nodes with the wrong role:\n  "
                        + "\n  ".join(bad_roles))
    param_nodes = [n for n in desc["nodes"] if n.get("role") == "parameter"]
    param_bytes = sum(int(n["bytes"]) for n in param_nodes)
    log("graph: %d nodes, %d persistent, %d outputs; %d parameter nodes, "
        "%d bytes (torch: %d parameters, %d bytes as fp32)" % (
            len(desc["nodes"]),
            sum(1 for n in desc["nodes"] if n.get("persistent")),
            sum(1 for n in desc["nodes"] if n.get("output")),
            len(param_nodes), param_bytes, n_params, 4 * n_params))
    if param_bytes != 4 * n_params:
        failures.append("the graph's parameter nodes hold %d bytes, the "
                        "model's %d parameters %d bytes as fp32" % (
                            param_bytes, n_params, 4 * n_params))
    summary_bytes = (desc.get("summary") or {}).get("parameter_bytes")
    if summary_bytes is not None and summary_bytes != param_bytes:
        failures.append("pebble describe's summary says %s parameter bytes, "
                        "its nodes %d" % (summary_bytes, param_bytes))
    return failures


def _time_limit(seconds):
    return [] if seconds is None else ["--time-limit", "%g" % seconds]


def pick_budget(pebble, graph, policy, kind, budget, time_limit=None, backend=None):
    """crosscheck.pick_budget for a graph file: 100% for one-shot policies,
    else `budget`, or `min` (with a note) where that is infeasible;
    `time_limit`: each plan's --time-limit (None: pebble's default);
    `backend`: planned with its workspace figures, as `run` plans (without
    them a plan could fit the budget where run's does not)."""
    if kind == "one-shot":
        budget = "100%"
    plan_args = ["plan", "--graph", graph, "--policy", policy] + _time_limit(time_limit) + \
        (["--backend", backend] if backend else [])
    plan = cc.pebble_json(pebble, plan_args + ["--budget", budget],
                          "pebble plan --policy %s --budget %s" % (policy,
                                                                   budget),
                          infeasible_ok=True)
    if not plan.get("feasible", False):
        log("note: %s cannot meet --budget %s (%s); running it at --budget min"
            % (policy, budget, plan.get("message", "infeasible")))
        budget = "min"
        plan = cc.pebble_json(pebble, plan_args + ["--budget", budget],
                              "pebble plan --policy %s --budget min" % policy)
        if not plan.get("feasible", False):
            raise Failure("policy %s: the plan at --budget min is infeasible: "
                          "%s" % (policy, plan.get("message")))
    return budget, plan


def run_step(args, np, pebble, graph, policy, kind, inputs_dir, dump_dir,
             written, order, ref32, ref64, zero_grads):
    """One `pebble run`, compared with PyTorch. Returns failure lines."""
    failures = []
    budget, plan = pick_budget(pebble, graph, policy, kind, args.budget, args.step_time_limit,
                               args.backend)
    report = plan.get("report", {})
    log("\n== policy %s (%s), --budget %s: planned peak %s bytes (baseline "
        "%s), %s recomputations, %s bytes transferred" % (
            policy, kind, budget, report.get("peak_bytes"),
            plan.get("baseline_peak_bytes"), report.get("recomputations"),
            report.get("transfer_bytes")))
    if os.path.isdir(dump_dir):
        shutil.rmtree(dump_dir)
    result = cc.pebble_json(pebble, [
        "run", "--graph", graph, "--policy", policy, "--budget", budget,
        *_time_limit(args.step_time_limit),
        "--backend", args.backend, "--inputs", inputs_dir, "--dump", dump_dir,
        "--seed", str(args.seed)],
        "pebble run --policy %s --budget %s" % (policy, budget))
    predicted = result.get("predicted") or {}
    measured = result.get("measured") or {}
    log("pebble run: loss %s; %s recomputations, %s bytes transferred; peak "
        "predicted %s, measured %s bytes; time %s s; %s inputs loaded, %s "
        "generated" % (
            result.get("loss"), predicted.get("recomputations"),
            predicted.get("transfer_bytes"), predicted.get("peak_bytes"),
            measured.get("peak_bytes"), measured.get("time_s"),
            result.get("loaded_inputs"), result.get("generated_inputs")))
    if (result.get("loaded_inputs") != len(written)
            or result.get("generated_inputs") != 0):
        failures.append("pebble loaded %s of the %d input tensors and "
                        "generated %s (all must be read from %s)" % (
                            result.get("loaded_inputs"), len(written),
                            result.get("generated_inputs"), inputs_dir))
    if (measured.get("peak_bytes") is None
            or measured.get("peak_bytes") != predicted.get("peak_bytes")
            or result.get("peak_equal") is not True):
        failures.append("measured peak %s bytes, predicted %s (peak_equal %s)"
                        % (measured.get("peak_bytes"),
                           predicted.get("peak_bytes"),
                           result.get("peak_equal")))
    # The dump holds <file name>.npy; load_dump compares the stems.
    stems = {tensor_file_name(n)[:-len(".npy")]: n for n in order}
    got_files = cc.load_dump(np, dump_dir, list(stems), policy)
    got = {stems[s]: a for s, a in got_files.items()}
    if result.get("loss") is not None:
        json_loss, npy_loss = float(result["loss"]), float(got["loss"])
        if abs(json_loss - npy_loss) > 1e-6 * max(abs(npy_loss), 1e-30):
            failures.append("the JSON loss %r differs from loss.npy %r" % (
                json_loss, npy_loss))
    tensor_failures = cc.compare(np, got, ref32, ref64, order, zero_grads,
                                 policy)
    if args.fp64_judge and tensor_failures:
        tensor_failures = judge_by_fp64(np, got, ref32, ref64, order,
                                        tensor_failures, policy)
    return failures + tensor_failures


def judge_by_fp64(np, got, ref32, ref64, order, failures, policy):
    """--fp64-judge: drops the failure lines of tensors that are
    ill-conditioned in fp32 (PyTorch's own fp32 result at least
    ILL_CONDITIONED off fp64) where pebble's result is at most FP64_FACTOR
    times further off fp64 than PyTorch's, and of tensors zero in fp64
    (ZERO_IN_FP64) where pebble's is noise of PyTorch's order; prints what
    it decided."""
    def rel(a, exact):
        scale = float(np.max(np.abs(exact))) if exact.size else 0.0
        err = (float(np.max(np.abs(a.astype(np.float64) - exact)))
               if exact.size else 0.0)
        return err / max(scale, cc.TINY)

    log("\n--fp64-judge: tensors over the tolerance, against PyTorch's fp64 "
        "result")
    log("%-48s %12s %12s  %s" % ("tensor", "pebble/64", "torch32/64",
                                  "verdict"))
    excused = set()
    worst = 0.0
    for name in order:
        prefix = "policy %s, %s:" % (policy, name)
        if not any(line.startswith(prefix) for line in failures):
            continue
        a, b, exact = got[name], ref32[name], ref64[name]
        if (a.shape != exact.shape or a.dtype != b.dtype
                or not np.all(np.isfinite(a))):
            continue
        ours, theirs = rel(a, exact), rel(b, exact)
        if theirs >= ZERO_IN_FP64:
            noise = float(np.max(np.abs(b))) if b.size else 0.0
            ok = (float(np.max(np.abs(a))) if a.size else 0.0) <= \
                cc.ZERO_NOISE_FACTOR * max(noise, cc.TINY)
            verdict = "ok (zero in fp64: noise)" if ok else "FAIL (zero in fp64)"
        else:
            ok = theirs >= ILL_CONDITIONED and ours <= FP64_FACTOR * theirs
            verdict = "ok (ill-conditioned in fp32)" if ok else "FAIL"
        log("%-48s %12.3e %12.3e  %s" % (name, ours, theirs, verdict))
        if ok:
            excused.add(prefix)
            worst = max(worst, ours / max(theirs, cc.TINY))
    log("--fp64-judge: %d tensors over the tolerance pass as ill-conditioned "
        "in fp32 (pebble's error against fp64 at most %.2f times PyTorch's "
        "fp32 one)" % (len(excused), worst))
    return [l for l in failures
            if not any(l.startswith(p) for p in excused)]


def plan_all(args, pebble, graph, registered):
    """`pebble plan` with every policy but `exact`. Returns failure lines."""
    failures = []
    log("\n== every policy at --budget %s (--time-limit %g)" % (
        args.budget, args.time_limit))
    log("%-14s %-11s %-10s %14s %10s %14s %8s" % (
        "policy", "kind", "feasible", "peak bytes", "recomputes",
        "transferred", "wall s"))
    for policy in sorted(registered):
        if policy in ALL_POLICIES_SKIP:
            log("%-14s %-11s skipped (only tiny graphs)" % (
                policy, registered[policy]))
            continue
        cmd = [pebble, "plan", "--graph", graph, "--policy", policy,
               "--budget", args.budget, "--time-limit", "%g" % args.time_limit,
               "--json"]
        start = time.time()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE,
                                  universal_newlines=True,
                                  timeout=args.time_limit + 120)
        except subprocess.TimeoutExpired:
            failures.append("pebble plan --policy %s did not finish within "
                            "%g s (--time-limit %g)" % (
                                policy, args.time_limit + 120,
                                args.time_limit))
            log("%-14s %-11s TIMEOUT" % (policy, registered[policy]))
            continue
        wall = time.time() - start
        if proc.returncode == 1 and any(
                words in proc.stderr for words in OUT_OF_DOMAIN.get(policy, ())):
            log("%-14s %-11s n/a: %s" % (policy, registered[policy],
                                         proc.stderr.strip()[:300]))
            continue
        # A plan that does not fit exits 1 and still prints its document.
        infeasible = proc.returncode == 1 and '"feasible": false' in proc.stdout
        if proc.returncode != 0 and not infeasible:
            how = ("killed by signal %d" % -proc.returncode
                   if proc.returncode < 0 else "exit %d" % proc.returncode)
            failures.append("pebble plan --policy %s failed (%s): %s" % (
                policy, how, (proc.stderr.strip() or proc.stdout.strip())[:500]))
            log("%-14s %-11s ERROR (%s)" % (policy, registered[policy], how))
            continue
        try:
            plan = json.loads(proc.stdout)
        except ValueError as e:
            failures.append("pebble plan --policy %s printed no JSON "
                            "document (%s)" % (policy, e))
            continue
        report = plan.get("report") or {}
        log("%-14s %-11s %-10s %14s %10s %14s %8.1f" % (
            policy, registered[policy], plan.get("feasible"),
            report.get("peak_bytes"), report.get("recomputations"),
            report.get("transfer_bytes"), wall))
    return failures


def import_check(args, np, torch, torchvision, onnx, models):
    pebble = os.path.abspath(args.pebble)
    if not (os.path.isfile(pebble) and os.access(pebble, os.X_OK)):
        raise UsageError("--pebble %s: not an executable file" % args.pebble)
    check_has_import(pebble)
    cc.check_has_run(pebble)
    registered = {p["name"]: p["kind"] for p in
                  cc.pebble_json(pebble, ["policies"], "pebble policies")}
    if args.policy not in registered:
        raise UsageError("unknown policy %s (registered: %s)" % (
            args.policy, ", ".join(sorted(registered))))
    torch.set_num_threads(max(1, args.threads))

    workdir = args.workdir
    own_workdir = workdir is None
    if own_workdir:
        workdir = tempfile.mkdtemp(prefix="pebble-import-check-")
    else:
        os.makedirs(workdir, exist_ok=True)
    try:
        return check_in(args, np, torch, torchvision, onnx, models, pebble,
                        registered, workdir)
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def check_in(args, np, torch, torchvision, onnx, models, pebble, registered,
             workdir):
    net, dropouts, zero_init = build_model(torch, torchvision, models, args)
    classes = args.classes or 1000  # torchvision's default num_classes
    gen = torch.Generator().manual_seed(args.seed + 1)
    x, t = make_batch(torch, net, args.batch, args.image, classes, gen)
    export_batch = args.export_batch or args.batch
    x_export = x if export_batch == args.batch else make_batch(
        torch, net, export_batch, args.image, classes, gen)[0]

    onnx_path = os.path.join(workdir, "model.onnx")
    summarize_warnings(export_onnx(torch, net, x_export, onnx_path, args.opset,
                                   args.model, args.dynamic_batch))
    summary = onnx_summary(np, onnx, onnx_path)
    n_params = sum(p.numel() for p in net.parameters() if p.requires_grad)
    log("exported %s (%d parameters, %d dropouts set to p=0%s) to %s: opset "
        "%s, %d nodes, %d initializers, inputs %s; ops: %s" % (
            args.model, n_params, dropouts,
            ", zero_init_residual" if zero_init else "", onnx_path,
            summary["opset"],
            summary["nodes"], len(summary["initializers"]), summary["inputs"],
            ", ".join("%s %d" % kv for kv in sorted(summary["ops"].items()))))
    # The torch side of the contract: initializers named by state_dict keys,
    # holding the parameters' values (a check of the export, not of pebble).
    for name, p in net.named_parameters():
        init = summary["initializers"].get(name)
        if init is not None and not np.array_equal(
                init, p.detach().numpy()):
            raise Failure("the ONNX file's initializer %s differs from the "
                          "model's parameter: the export did not write the "
                          "weights compared against" % name)

    graph = os.path.join(workdir, "graph.json")
    if os.path.exists(graph):
        os.remove(graph)
    import_args = ["import", onnx_path, "--loss", loss_of(net),
                   "--output", graph]
    frozen = frozen_initializers(torch, net, summary["initializers"])
    if frozen:
        import_args += ["--frozen", ",".join(frozen)]
    if export_batch != args.batch or args.dynamic_batch:
        import_args += ["--batch", str(args.batch)]
    start = time.time()
    out = cc.run_pebble(pebble, import_args, "pebble " + " ".join(import_args))
    log("pebble import: %.1f s%s" % (time.time() - start, (
        "; it printed:\n  " + "\n  ".join(out.strip().splitlines()[:20]))
        if out.strip() else ""))
    if not os.path.isfile(graph):
        raise Failure("pebble import exited 0 but wrote no %s" % graph)
    desc = cc.pebble_json(pebble, ["describe", "--graph", graph],
                          "pebble describe --graph " + graph)

    expected, nbt = expected_persistent(np, torch, net, x, t)
    inputs_dir = cc.fresh_dir(os.path.join(workdir, "inputs"))
    written = write_inputs(np, expected, inputs_dir)
    order = ["loss"] + ["grad:" + n for n, p in net.named_parameters()
                        if p.requires_grad]
    failures = check_graph(np, desc, expected, written, order, summary, nbt,
                           n_params)

    # The reference runs after the inputs are written: training-mode batch
    # norm updates the running statistics in place.
    with_loss = make_with_loss(torch)(net)

    def reference(module, dtype):
        ref = cc.torch_reference(torch, module, x, t, dtype)
        return {("grad:" + k[len("grad:net."):] if k.startswith("grad:net.")
                 else k): v for k, v in ref.items()}

    ref64 = (reference(copy.deepcopy(with_loss), torch.float64)
             if args.fp64 or args.fp64_judge else None)
    kink_module = copy.deepcopy(with_loss)  # before the step moves the stats
    ref32 = reference(with_loss, torch.float32)
    log("model %s, batch %d, image %d, seed %d: %d persistent tensors, %d "
        "outputs; torch loss %.8g" % (args.model, args.batch, args.image,
                                      args.seed, len(written), len(order),
                                      float(ref32["loss"])))
    zero_grads = {"grad:" + n for n in models.zero_gradient_names(net)}

    step_failures = []
    try:
        step_failures = run_step(
            args, np, pebble, graph, args.policy, registered[args.policy],
            inputs_dir, os.path.join(workdir, "out"), written, order, ref32,
            ref64, zero_grads)
    except Failure as e:
        step_failures = ["the training step: %s" % e]
    failures += step_failures
    if args.all_policies:
        failures += plan_all(args, pebble, graph, registered)

    log("")
    if failures:
        # The per-tensor table above has every tensor; a long list of them
        # here is cut short.
        tensor_lines = [l for l in failures if l.startswith("policy ")]
        for line in failures:
            if line in tensor_lines[MAX_TENSOR_LINES:]:
                continue
            log("MISMATCH: " + line)
        if len(tensor_lines) > MAX_TENSOR_LINES:
            log("MISMATCH: ... and %d more tensors (see the table)" % (
                len(tensor_lines) - MAX_TENSOR_LINES))
        if tensor_lines:
            log(cc.kink_note(torch, kink_module, x, t))
        return EXIT_FAIL
    log("PASS: %s (batch %d, image %d, opset %s) imported: %d persistent "
        "tensors as in PyTorch; policy %s: loss and %d gradients within %.0e "
        "of PyTorch, measured peak = predicted%s" % (
            args.model, args.batch, args.image, summary["opset"], len(written),
            args.policy, len(order) - 1, cc.REL_TOL,
            "; every policy plans it (but exact; n/a where out of its domain)" if args.all_policies else ""))
    return EXIT_OK


def main(argv):
    try:
        args = parse_args(argv)
    except UsageError:
        return EXIT_USAGE
    try:
        import numpy as np
        import torch
        import torchvision
        import onnx
    except ImportError as e:
        log("SKIP: numpy, torch, torchvision and onnx are needed (%s)" % e)
        return EXIT_SKIP
    import models
    try:
        return import_check(args, np, torch, torchvision, onnx, models)
    except UsageError as e:
        print("import_check: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except NoImport as e:
        log("SKIP: %s" % e)
        return EXIT_SKIP
    except Failure as e:
        log("FAIL: %s" % e)
        return EXIT_FAIL
    except OSError as e:  # pebble could not be started (being relinked?)
        log("FAIL: %s" % e)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
