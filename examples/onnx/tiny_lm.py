#!/usr/bin/env python3
"""Exports a small next-token language model to ONNX for `pebble import`.

    tiny_lm.py OUT.onnx [--vocab 1000] [--dim 64] [--heads 4] [--layers 1]
               [--seq 128] [--batch 8] [--opset 17] [--force]

The model reads token ids, an int64 (batch, seq) tensor: token and position
embeddings (nn.Embedding; the positions torch.arange of the sequence
length), `--layers` causal nn.TransformerEncoderLayer (batch first, dropout
0; the mask nn.Transformer.generate_square_subsequent_mask, which pebble
imports as its softmax's causal attribute), an output layer tied to the
token embedding, and its logits flattened to
(batch x seq, vocab), so that `pebble import --loss cross-entropy` takes the
vocabulary as the classes and one next token per position as the target.
The batch is symbolic (dynamic_axes), so `pebble import --batch N` and
`pebble fit --onnx` size it. Weights are a seeded random initialisation.

An existing OUT.onnx is kept unless --force. Exit status: 0 written (or
kept), 1 the export failed, 2 a usage error. Needs torch (Debian's
python3-torch).
"""

import argparse
import os
import sys
import warnings


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Export a small next-token language model to ONNX for "
                    "`pebble import`.")
    parser.add_argument("output", help="the .onnx file to write")
    for name, default, what in (("vocab", 1000, "vocabulary size"),
                                ("dim", 64, "model width"),
                                ("heads", 4, "attention heads (dividing --dim)"),
                                ("layers", 1, "transformer layers"),
                                ("seq", 128, "sequence length"),
                                ("batch", 8, "batch size of the export (symbolic in the file)"),
                                ("opset", 17, "ONNX opset (pebble import reads 11 to 17)")):
        parser.add_argument("--" + name, type=int, default=default,
                            help="%s (default %d)" % (what, default))
    parser.add_argument("--force", action="store_true",
                        help="replace an existing output file")
    args = parser.parse_args(argv)
    for name in ("vocab", "dim", "heads", "layers", "seq", "batch", "opset"):
        if getattr(args, name) < 1:
            parser.error("--%s must be positive" % name)
    if args.dim % args.heads:
        parser.error("--heads %d does not divide --dim %d" % (args.heads, args.dim))
    return args


def tiny_lm(torch, vocab, dim, heads, layers, seq):
    """The model: ids (batch, seq) -> logits (batch x seq, vocab)."""
    nn = torch.nn

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(seq, dim)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                           batch_first=True)
                for _ in range(layers))
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq),
                                 persistent=False)
            self.out = nn.Linear(dim, vocab)
            self.out.weight = self.tok.weight  # tied: one parameter

        def forward(self, ids):
            n = ids.shape[1]
            h = self.tok(ids) + self.pos(torch.arange(n))
            for layer in self.layers:
                h = layer(h, src_mask=self.mask[:n, :n])  # each token sees those before it
            return self.out(h).flatten(0, 1)  # a view: no copy

    return TinyLM()


def main(argv):
    args = parse_args(argv)
    if os.path.exists(args.output) and not args.force:
        print("tiny_lm: %s exists; kept (--force replaces it)" % args.output)
        return 0
    import torch
    torch.manual_seed(0)
    model = tiny_lm(torch, args.vocab, args.dim, args.heads, args.layers, args.seq)
    model.train()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's notes on training mode
            torch.onnx.export(model, ids, args.output,
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False, input_names=["ids"],
                              output_names=["logits"], opset_version=args.opset,
                              dynamic_axes={"ids": {0: "batch"}, "logits": {0: "batch"}})
    except Exception as e:  # the exporter raises several types
        print("tiny_lm: torch.onnx.export failed: %s" % str(e).strip().splitlines()[0],
              file=sys.stderr)
        return 1
    print("wrote %s: %d parameters, ids (batch, %d), logits (batch x %d, %d)" % (
        args.output, sum(p.numel() for p in model.parameters()), args.seq, args.seq,
        args.vocab))
    print("import it: pebble import %s --batch %d --output lm.json" % (args.output, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
