#!/usr/bin/env python3
"""Writes the seed corpus of the `onnx` fuzz target (tests/fuzz/corpus/onnx/):
tiny PyTorch models exported as torch.onnx.export writes them in training
mode, covering the operators the importer maps. Run with /usr/bin/python3
(Debian's torch); the files are small and checked in.

    tests/fuzz/onnx_corpus.py [DIR]
"""
import os
import sys

import torch
from torch import nn


class Branches(nn.Module):
    """Concat, average pooling, dropout, sigmoid and tanh."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(2, 2, 1)
        self.b = nn.Conv2d(2, 2, 3, padding=1, bias=False)
        self.pool = nn.AvgPool2d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        y = torch.cat([torch.sigmoid(self.a(x)), torch.tanh(self.b(x))], 1)
        y = self.pool(y)
        return self.fc(self.drop(torch.flatten(y, 1)))


def models():
    torch.manual_seed(0)
    conv_bn = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                            nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(4, 5))
    yield "conv_bn_13", conv_bn, (1, 3, 8, 8), 13
    yield "conv_bn_14", conv_bn, (1, 3, 8, 8), 14
    conv3d = nn.Sequential(nn.Conv3d(1, 2, 3, stride=2), nn.ReLU(), nn.Flatten(),
                           nn.Linear(2 * 2 * 2 * 2, 2), nn.Softmax(dim=1))
    yield "conv3d_softmax", conv3d, (1, 1, 5, 5, 5), 13
    yield "branches", Branches(), (1, 2, 4, 4), 13


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                      "corpus", "onnx")
    os.makedirs(out, exist_ok=True)
    for name, module, shape, opset in models():
        module.train()
        path = os.path.join(out, name + ".onnx")
        torch.onnx.export(module, torch.randn(*shape), path,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["input"],
                          output_names=["logits"], opset_version=opset)
        print("%s: %d bytes" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main(sys.argv)
