"""Ordinary PyTorch training steps for pebble.torch's tests and benchmarks.

Each case is a function `name(device) -> Case`: a module built from torch.nn
(and torchvision), its example batch, its target and a loss callable, at
sizes that run in well under a second on a CPU. They cover what users bring:
embeddings and tied heads, causal masks written with masked_fill, dropout,
LSTMs and GRUs, transposed 3-D convolutions, batch, layer and group norms,
hand-written and several-output losses, label smoothing, frozen backbones,
integer inputs, a Conformer's convolution module, masked_scatter.
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "torch"))
import lm as lm_example  # noqa: E402


class Case:
    def __init__(self, model, inputs, target, loss_fn, random=False):
        self.model = model
        self.inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        self.target = target
        self.loss_fn = loss_fn
        self.random = random  # the step draws random numbers (dropout)


# --- language models ------------------------------------------------------------

# The GPT-2-style decoder of examples/torch/lm.py (token and position
# embeddings, pre-norm blocks, causal masked_fill, dropout, the head tied to
# the token embedding), so that the example's model is the one checked.
Gpt, lm_loss = lm_example.Gpt, lm_example.lm_loss


def gpt(device):
    torch.manual_seed(0)
    return Case(Gpt(vocab=96, dim=32, heads=4, layers=2, seq=16).to(device), torch.randint(0, 96, (4, 16), device=device),
                torch.randint(0, 96, (4, 16), device=device), lm_loss, random=True)


class Bert(nn.Module):
    """A BERT-style encoder: embeddings, post-norm encoder layers with a
    padding mask, a pooled classifier."""

    def __init__(self, vocab=64, dim=32, heads=4, layers=2, classes=3):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim, padding_idx=0)
        self.pos = nn.Parameter(torch.zeros(1, 12, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.pool = nn.Linear(dim, dim)
        self.cls = nn.Linear(dim, classes)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, :idx.shape[1]]
        x = self.encoder(x, src_key_padding_mask=idx == 0)
        return self.cls(torch.tanh(self.pool(x[:, 0])))


def bert(device):
    torch.manual_seed(1)
    idx = torch.randint(1, 64, (4, 12), device=device)
    idx[:, 9:] = 0  # padding
    return Case(Bert().to(device), idx, torch.randint(0, 3, (4,), device=device),
                nn.CrossEntropyLoss(), random=True)


class LstmClassifier(nn.Module):
    def __init__(self, vocab=50, dim=16, hidden=24, classes=4, cell=nn.LSTM, **rnn_options):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = cell(dim, hidden, num_layers=2, batch_first=True, **rnn_options)
        width = rnn_options.get("proj_size", 0) or hidden
        self.fc = nn.Linear(width * (2 if rnn_options.get("bidirectional") else 1), classes)

    def forward(self, idx):
        h, _ = self.rnn(self.emb(idx))
        return self.fc(h[:, -1])


def lstm(device):
    torch.manual_seed(2)
    return Case(LstmClassifier().to(device), torch.randint(0, 50, (4, 9), device=device),
                torch.randint(0, 4, (4,), device=device), F.cross_entropy)


def lstm_projected(device):
    """A bidirectional LSTM with projections (proj_size: ONNX cannot export
    it, pebble.torch takes it)."""
    torch.manual_seed(4)
    return Case(LstmClassifier(proj_size=8, bidirectional=True).to(device),
                torch.randint(0, 50, (4, 9), device=device),
                torch.randint(0, 4, (4,), device=device), F.cross_entropy)


def gru(device):
    torch.manual_seed(3)
    return Case(LstmClassifier(cell=nn.GRU).to(device),
                torch.randint(0, 50, (4, 9), device=device),
                torch.randint(0, 4, (4,), device=device), F.cross_entropy)


class CellLoop(nn.Module):
    """An LSTMCell unrolled by hand over the sequence."""

    def __init__(self, dim=8, hidden=12):
        super().__init__()
        self.cell = nn.LSTMCell(dim, hidden)
        self.out = nn.Linear(hidden, dim)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)
        c = torch.zeros_like(h)
        outs = []
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
            outs.append(self.out(h))
        return torch.stack(outs, dim=1)


def lstm_cell(device):
    torch.manual_seed(4)
    return Case(CellLoop().to(device), torch.randn(3, 6, 8, device=device),
                torch.randn(3, 6, 8, device=device), F.mse_loss)


class TokenTagger(nn.Module):
    """Integer inputs, log-probabilities and NLLLoss."""

    def __init__(self, vocab=40, dim=16, tags=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)
        self.norm = nn.BatchNorm1d(dim)
        self.out = nn.Linear(dim, tags)

    def forward(self, idx):
        x = self.emb(idx).transpose(1, 2)
        x = F.relu(self.norm(self.conv(x))).transpose(1, 2)
        return F.log_softmax(self.out(x), dim=-1)


def tagger(device):
    torch.manual_seed(5)
    return Case(TokenTagger().to(device), torch.randint(0, 40, (4, 10), device=device),
                torch.randint(0, 5, (4, 10), device=device),
                lambda out, t: F.nll_loss(out.reshape(-1, out.shape[-1]), t.reshape(-1)))


class BagOfWords(nn.Module):
    def __init__(self, vocab=60, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 32), nn.SiLU(), nn.Linear(32, 1))

    def forward(self, idx):
        return self.mlp(self.emb(idx).mean(dim=1)).squeeze(-1)


def bag_of_words(device):
    torch.manual_seed(6)
    return Case(BagOfWords().to(device), torch.randint(0, 60, (8, 7), device=device),
                torch.randn(8, device=device),
                lambda out, t: ((out - t) ** 2).mean() + 0.01 * out.abs().sum())


# --- convolutional networks -----------------------------------------------------

class Seed3d(nn.Module):
    """The seed network: three 3x3x3 Conv3d + ReLU (1 -> 4 -> 8 -> 1 channels)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv3d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv3d(4, 8, 3, padding=1)
        self.conv3 = nn.Conv3d(8, 1, 3, padding=1)

    def forward(self, x):
        return F.relu(self.conv3(F.relu(self.conv2(F.relu(self.conv1(x))))))


def seed_conv3d(device):
    torch.manual_seed(7)
    return Case(Seed3d().to(device), torch.randn(1, 1, 12, 12, 12, device=device),
                torch.randn(1, 1, 12, 12, 12, device=device), F.mse_loss)


class UNet3d(nn.Module):
    """Two levels of a 3-D U-Net: max pooling down, ConvTranspose3d up, a skip
    concatenation, batch norms."""

    def __init__(self, c=4):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv3d(i, o, 3, padding=1), nn.BatchNorm3d(o), nn.ReLU())
        self.down = block(1, c)
        self.bottom = block(c, 2 * c)
        self.up = nn.ConvTranspose3d(2 * c, c, 2, stride=2)
        self.merge = block(2 * c, c)
        self.out = nn.Conv3d(c, 1, 1)

    def forward(self, x):
        d = self.down(x)
        b = self.bottom(F.max_pool3d(d, 2))
        return self.out(self.merge(torch.cat([d, self.up(b)], dim=1)))


def unet3d(device):
    torch.manual_seed(8)
    return Case(UNet3d().to(device), torch.randn(2, 1, 8, 8, 8, device=device),
                torch.randn(2, 1, 8, 8, 8, device=device), F.mse_loss)


class Autoencoder(nn.Module):
    """ConvTranspose2d decoder with a sigmoid and binary cross-entropy."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.LeakyReLU(0.1),
                                 nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.LeakyReLU(0.1))
        self.dec = nn.Sequential(nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1), nn.ReLU(),
                                 nn.ConvTranspose2d(8, 1, 4, stride=2, padding=1))

    def forward(self, x):
        return torch.sigmoid(self.dec(self.enc(x)))


def autoencoder(device):
    torch.manual_seed(9)
    x = torch.rand(4, 1, 16, 16, device=device)
    return Case(Autoencoder().to(device), x, x.clone(), F.binary_cross_entropy)


class GroupNormNet(nn.Module):
    """GroupNorm, SiLU, Dropout2d, adaptive pooling, NLLLoss."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU(), nn.Dropout2d(0.2),
            nn.Conv2d(16, 16, 3, padding=1, groups=4), nn.GroupNorm(4, 16), nn.Hardswish(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(16, 6)

    def forward(self, x):
        return F.log_softmax(self.head(self.features(x)), dim=1)


def group_norm(device):
    torch.manual_seed(10)
    return Case(GroupNormNet().to(device), torch.randn(4, 3, 12, 12, device=device),
                torch.randint(0, 6, (4,), device=device), nn.NLLLoss(), random=True)


class TwoHeads(nn.Module):
    """Two outputs (a tuple with a dict inside), summed into one hand-written
    loss; the auxiliary head in half precision and back."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh())
        self.main = nn.Linear(32, 4)
        self.aux = nn.Linear(32, 2)

    def forward(self, x):
        h = self.trunk(x.masked_fill(x > 2.0, 0.0))
        return self.main(h), {"aux": self.aux(h).to(torch.bfloat16).float()}


def two_heads_loss(out, target):
    main, extra = out
    return F.smooth_l1_loss(main, target) + 0.3 * extra["aux"].pow(2).mean()


def two_heads(device):
    torch.manual_seed(11)
    return Case(TwoHeads().to(device), torch.randn(6, 12, device=device),
                torch.randn(6, 4, device=device), two_heads_loss)


class PaddedAttention(nn.Module):
    """nn.MultiheadAttention with a key padding mask, a residual and a norm."""

    def __init__(self, dim=16):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, 3)

    def forward(self, x, pad):
        y, _ = self.attn(x, x, x, key_padding_mask=pad)
        return self.out(self.norm(x + y).mean(dim=1))


def padded_attention(device):
    torch.manual_seed(12)
    pad = torch.zeros(4, 7, dtype=torch.bool, device=device)
    pad[:, 5:] = True
    return Case(PaddedAttention().to(device), (torch.randn(4, 7, 16, device=device), pad),
                torch.randint(0, 3, (4,), device=device),
                nn.CrossEntropyLoss(label_smoothing=0.1))


class TinyVit(nn.Module):
    """Patch embedding by convolution, a class token, pre-norm encoder
    layers (GELU), a head on the class token."""

    def __init__(self, dim=24, classes=5):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, stride=4)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 3, 2 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)
        p = torch.cat([self.cls.expand(x.shape[0], -1, -1), p], dim=1) + self.pos
        return self.head(self.encoder(p)[:, 0])


def tiny_vit(device):
    torch.manual_seed(13)
    return Case(TinyVit().to(device), torch.randn(2, 3, 16, 16, device=device),
                torch.randint(0, 5, (2,), device=device), F.cross_entropy)


def _torchvision(name, device, image, batch=2, classes=10, seed=14, frozen=None):
    import torchvision
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(num_classes=classes).to(device)
    if frozen is not None:
        for pname, p in model.named_parameters():
            if any(pname.startswith(prefix) for prefix in frozen):
                p.requires_grad_(False)
    return Case(model, torch.randn(batch, 3, image, image, device=device),
                torch.randint(0, classes, (batch,), device=device), F.cross_entropy,
                random=name.startswith(("mobilenet", "squeezenet", "efficientnet")))


def resnet18(device):
    return _torchvision("resnet18", device, 32)


def mobilenet_v2(device):
    return _torchvision("mobilenet_v2", device, 32)


def mobilenet_v3_small(device):
    return _torchvision("mobilenet_v3_small", device, 32)


def squeezenet(device):
    return _torchvision("squeezenet1_1", device, 48)


def densenet121(device):
    return _torchvision("densenet121", device, 32, batch=2)


def frozen_backbone(device):
    """resnet18 fine-tuned: everything but layer4 and fc frozen."""
    return _torchvision("resnet18", device, 32,
                        frozen=("conv1", "bn1", "layer1", "layer2", "layer3"))


def label_smoothing(device):
    """A small CNN (batch norm, max pooling) under CrossEntropyLoss with label
    smoothing and class weights."""
    torch.manual_seed(15)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 7)).to(device)
    weight = torch.linspace(0.5, 1.5, 7, device=device)
    return Case(model, torch.randn(4, 3, 16, 16, device=device),
                torch.randint(0, 7, (4,), device=device),
                nn.CrossEntropyLoss(weight=weight, label_smoothing=0.1))


def shufflenet(device):
    """Channel shuffles: views and transposes of every block."""
    return _torchvision("shufflenet_v2_x0_5", device, 32, seed=15)


class ConvModule(nn.Module):
    """A Conformer-style convolution module over (batch, time, features):
    the features transposed to channels for a pointwise convolution with a
    GLU, a depthwise one, BatchNorm1d and SiLU, transposed back; and a
    BatchNorm1d over a Linear's output transposed, transposed back into a
    Linear, whose view of it failed (the CPU kernel's output is contiguous
    where PyTorch 1.13's fake one keeps the transposed layout: the step is
    traced on real tensors)."""

    def __init__(self, vocab=40, dim=16, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pointwise = nn.Conv1d(dim, 2 * dim, 1)
        # (no bias: before a batch norm its gradient is 0 but for rounding)
        self.depthwise = nn.Conv1d(dim, dim, 5, padding=2, groups=dim, bias=False)
        self.norm = nn.BatchNorm1d(dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_norm = nn.BatchNorm1d(dim)
        self.proj_out = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        x = self.embed(tokens)                                   # (B, T, C)
        h = F.glu(self.pointwise(x.transpose(1, 2)), dim=1)
        h = F.silu(self.norm(self.depthwise(h))).transpose(1, 2)
        x = x + h
        x = x + self.proj_out(self.proj_norm(self.proj(x).transpose(1, 2)).transpose(1, 2))
        return self.head(x).mean(dim=1)


def conv_module(device):
    torch.manual_seed(16)
    return Case(ConvModule().to(device), torch.randint(0, 40, (4, 12), device=device),
                torch.randint(0, 5, (4,), device=device), F.cross_entropy)


class ImageTokens(nn.Module):
    """Image features projected into the token embeddings at the image
    tokens' places with masked_scatter (as multimodal language models do):
    the same count of image tokens in every batch."""

    def __init__(self, vocab=30, dim=12, image_dim=20, image_id=1, classes=4):
        super().__init__()
        self.image_id = image_id
        self.embed = nn.Embedding(vocab, dim)
        self.project = nn.Linear(image_dim, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens, image):
        x = self.embed(tokens)
        mask = (tokens == self.image_id).unsqueeze(-1).expand_as(x)
        x = x.masked_scatter(mask, self.project(image))
        return self.head(torch.tanh(self.mix(x))).mean(dim=1)


def image_tokens(device):
    torch.manual_seed(17)
    tokens = torch.randint(2, 30, (3, 10), device=device)
    tokens[:, 2:5] = 1  # three image tokens a sequence
    return Case(ImageTokens().to(device),
                (tokens, torch.randn(3, 3, 20, device=device)),
                torch.randint(0, 4, (3,), device=device), F.cross_entropy)


CASES = {f.__name__: f for f in [
    gpt, bert, lstm, lstm_projected, gru, lstm_cell, tagger, bag_of_words, seed_conv3d, unet3d, autoencoder,
    group_norm, two_heads, padded_attention, tiny_vit, resnet18, mobilenet_v2,
    mobilenet_v3_small, squeezenet, densenet121, frozen_backbone, label_smoothing,
    shufflenet, conv_module, image_tokens]}


# Sizes where activations outweigh parameters and gradients: the check that a
# plan at `min` really holds less than eager (step_check.py --savings).
def gpt_long(device):
    torch.manual_seed(5)
    return Case(Gpt(vocab=96, dim=32, heads=4, layers=8, seq=128).to(device),
                torch.randint(0, 96, (8, 128), device=device),
                torch.randint(0, 96, (8, 128), device=device), lm_loss, random=True)


def seed_conv3d_large(device):
    """Where no plan can save: the step's peak is conv3's input-gradient
    kernel, whose own temporaries (55 MB at 40^3) dwarf every activation."""
    torch.manual_seed(7)
    return Case(Seed3d().to(device), torch.randn(1, 1, 40, 40, 40, device=device),
                torch.randn(1, 1, 40, 40, 40, device=device), F.mse_loss)


def unet3d_large(device):
    torch.manual_seed(8)
    return Case(UNet3d(c=8).to(device), torch.randn(2, 1, 24, 24, 24, device=device),
                torch.randn(2, 1, 24, 24, 24, device=device), F.mse_loss)


def resnet18_batch8(device):
    """The size of the memory issue's table: batch 8, 64 px."""
    return _torchvision("resnet18", device, 64, batch=8)


SAVINGS_CASES = {f.__name__: f for f in [gpt_long, seed_conv3d_large, unet3d_large,
                                         resnet18_batch8]}

