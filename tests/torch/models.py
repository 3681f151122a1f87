"""PyTorch twins of pebble's model zoo (graph/models/*.cc, docs/models.md).

Each builder returns a module whose state_dict() keys are exactly the ids of
the persistent parameter and buffer nodes of pebble's training graph for the
same model spec, with the same shapes and dtypes, and whose forward(input,
target) returns the same scalar loss. Batch norm runs in training mode (batch
statistics), as pebble's training graphs do.

Only numpy and torch are needed; torchvision is not, so ResNet-18 is written
out here with torchvision's layout and names.
"""

import torch
from torch import nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------
# Model specs: "name[:key=value[,key=value...]]" as pebble parses them
# (docs/models.md). Defaults mirror graph/models/models.cc.

DEFAULTS = {
    "conv3d": {"n": "64", "batch": "1"},
    "mnist-cnn": {"batch": "64"},
    "resnet18": {"batch": "32", "image": "224"},
    "unet3d": {"batch": "2", "variant": "large", "dtype": "fp32",
               "depth": "26", "height": "150", "width": "320",
               "classes": "5", "features": "64"},
}


class SpecError(ValueError):
    """A model spec this module cannot build (a usage error)."""


def parse_spec(spec):
    """Returns (name, params) with every declared parameter filled in."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if name not in DEFAULTS:
        raise SpecError("unknown model '%s' (cross-checked models: %s)"
                        % (name, ", ".join(sorted(DEFAULTS))))
    params = dict(DEFAULTS[name])
    given = set()
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise SpecError("malformed parameter '%s' in '%s'" % (item, spec))
        if key not in params:
            raise SpecError("model '%s' has no parameter '%s' (valid: %s)"
                            % (name, key, ", ".join(sorted(params))))
        if key in given:
            raise SpecError("parameter '%s' given twice in '%s'" % (key, spec))
        given.add(key)
        params[key] = value
    return name, params


def _int(params, key):
    try:
        return int(params[key])
    except ValueError:
        raise SpecError("parameter '%s' must be an integer, got '%s'"
                        % (key, params[key])) from None


# ---------------------------------------------------------------------------
# conv3d (graph/models/cnn.cc BuildConv3d)

class Conv3dNet(nn.Module):
    """Three Conv3d(3, padding=1) + ReLU layers 1->4->8->1, MSE loss (mean)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv3d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv3d(4, 8, 3, padding=1)
        self.conv3 = nn.Conv3d(8, 1, 3, padding=1)

    def forward(self, x, target):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return F.mse_loss(x, target)


# ---------------------------------------------------------------------------
# mnist-cnn (graph/models/cnn.cc BuildMnistCnn)

class MnistCnn(nn.Module):
    """Valid 5x5 convolutions, 2x2 max pools, two dense layers, CE loss."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(1024, 1024)
        self.fc2 = nn.Linear(1024, 10)

    def forward(self, x, target):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = self.fc2(F.relu(self.fc1(x)))
        return F.cross_entropy(x, target)


# ---------------------------------------------------------------------------
# resnet18 (graph/models/resnet.cc): torchvision.models.resnet18() layout.

class BasicBlock(nn.Module):
    """torchvision's BasicBlock: conv1/bn1/relu/conv2/bn2 (+ downsample)."""

    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, planes, 1, stride, bias=False),
                nn.BatchNorm2d(planes))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(y + shortcut)


class ResNet18(nn.Module):
    """He et al. 2016, torchvision names; 1000 classes; CE loss."""

    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        cin = 64
        for stage in range(4):
            planes = 64 << stage
            blocks = []
            for b in range(2):
                stride = 2 if stage > 0 and b == 0 else 1
                blocks.append(BasicBlock(cin, planes, stride))
                cin = planes
            self.add_module("layer%d" % (stage + 1), nn.Sequential(*blocks))
        self.fc = nn.Linear(512, classes)

    def forward(self, x, target):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        # AdaptiveAvgPool2d((1, 1)) + flatten: pebble's global_avgpool.
        x = x.mean(dim=(2, 3))
        return F.cross_entropy(self.fc(x), target)


# ---------------------------------------------------------------------------
# unet3d (graph/models/unet3d.cc): milesial/Pytorch-UNet in 3-D, bilinear
# (trilinear) variant, biased convolutions, no mid-channel halving.

class DoubleConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv3d(cin, cout, 3, padding=1), nn.BatchNorm3d(cout),
            nn.ReLU(),
            nn.Conv3d(cout, cout, 3, padding=1), nn.BatchNorm3d(cout),
            nn.ReLU())

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool3d(2),
                                          DoubleConv(cin, cout))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="trilinear",
                              align_corners=True)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x1, x2):  # x2: the skip tensor
        x1 = self.up(x1)
        dz, dy, dx = (x2.shape[i] - x1.shape[i] for i in (2, 3, 4))
        x1 = F.pad(x1, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2,
                        dz // 2, dz - dz // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class OutConv(nn.Module):
    def __init__(self, cin, classes):
        super().__init__()
        self.conv = nn.Conv3d(cin, classes, 1)

    def forward(self, x):
        return self.conv(x)


class UNet3d(nn.Module):
    """Çiçek et al. 2016; per-voxel CE loss over the class axis (dim 1)."""

    def __init__(self, variant, classes, features=64):
        super().__init__()
        f = features  # inc's width; the others scale with it
        self.large = variant == "large"
        self.inc = DoubleConv(1, f)
        self.down1 = Down(f, 2 * f)
        self.down2 = Down(2 * f, 4 * f)
        if self.large:
            self.down3 = Down(4 * f, 8 * f)
            self.down4 = Down(8 * f, 8 * f)
            self.up1 = Up(16 * f, 4 * f)
            self.up2 = Up(8 * f, 2 * f)
            self.up3 = Up(4 * f, f)
            self.up4 = Up(2 * f, f)
        else:
            self.down3 = Down(4 * f, 4 * f)
            self.up1 = Up(8 * f, 4 * f)
            self.up2 = Up(6 * f, 2 * f)
            self.up3 = Up(3 * f, f)
        self.outc = OutConv(f, classes)

    def forward(self, x, target):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        if self.large:
            x5 = self.down4(x4)
            u = self.up4(self.up3(self.up2(self.up1(x5, x4), x3), x2), x1)
        else:
            u = self.up3(self.up2(self.up1(x4, x3), x2), x1)
        return F.cross_entropy(self.outc(u), target)


# ---------------------------------------------------------------------------

class Case:
    """A model with the shapes and ranges of its data batch."""

    def __init__(self, module, input_shape, target_shape, target_classes):
        self.module = module
        self.zero_grads = zero_gradient_names(module)
        self.input_shape = tuple(input_shape)
        self.target_shape = tuple(target_shape)
        # None: a float target (MSE); else class indices in [0, classes).
        self.target_classes = target_classes

    def make_batch(self, generator):
        """Seeded `input` (fp32) and `target` (fp32 or int64) tensors."""
        x = torch.randn(self.input_shape, generator=generator)
        if self.target_classes is None:
            t = torch.randn(self.target_shape, generator=generator)
        else:
            t = torch.randint(0, self.target_classes, self.target_shape,
                              generator=generator, dtype=torch.int64)
        return x, t


def build(spec):
    """The Case of a pebble model spec; SpecError for what it cannot build.

    Parameters are drawn from torch's global RNG (seed it first).
    """
    name, p = parse_spec(spec)
    if name == "conv3d":
        n, batch = _int(p, "n"), _int(p, "batch")
        shape = (batch, 1, n, n, n)
        return Case(Conv3dNet(), shape, shape, None)
    if name == "mnist-cnn":
        batch = _int(p, "batch")
        return Case(MnistCnn(), (batch, 1, 28, 28), (batch,), 10)
    if name == "resnet18":
        batch, image = _int(p, "batch"), _int(p, "image")
        return Case(ResNet18(), (batch, 3, image, image), (batch,), 1000)
    if name == "unet3d":
        if p["variant"] not in ("large", "small"):
            raise SpecError("variant must be large or small, got '%s'"
                            % p["variant"])
        if p["dtype"] != "fp32":
            raise SpecError("the cross-check compares fp32 only; got dtype=%s"
                            % p["dtype"])
        batch, classes = _int(p, "batch"), _int(p, "classes")
        d, h, w = _int(p, "depth"), _int(p, "height"), _int(p, "width")
        model = UNet3d(p["variant"], classes, _int(p, "features"))
        return Case(model, (batch, 1, d, h, w), (batch, d, h, w), classes)
    raise AssertionError(name)


def perturb_batchnorm(module, scale=0.1):
    """Moves every batch norm's weight and bias off their 1 and 0 defaults
    (by scale * N(0, 1), from torch's global RNG), so that a swapped or
    ignored affine parameter changes the loss and the gradients."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine:
                m.weight.add_(scale * torch.randn(m.weight.shape))
                m.bias.add_(scale * torch.randn(m.bias.shape))


def zero_gradient_names(module):
    """Parameters whose gradient is zero in exact arithmetic: the bias of a
    convolution followed directly by a training-mode batch norm, which
    subtracts the batch mean and so removes any constant shift per channel.
    In fp32 such a gradient is rounding noise, not a value to compare."""
    names = set()
    for prefix, m in module.named_modules():
        if not isinstance(m, nn.Sequential):
            continue
        children = list(m.named_children())
        for (name, a), (_, b) in zip(children, children[1:]):
            if (isinstance(a, nn.modules.conv._ConvNd) and a.bias is not None
                    and isinstance(b, nn.modules.batchnorm._BatchNorm)):
                names.add("%s.%s.bias" % (prefix, name) if prefix
                          else "%s.bias" % name)
    return names
