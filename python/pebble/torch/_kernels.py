"""Each operator of pebble's table (docs/operators.md) as PyTorch's own ATen
functions: the forward ones as eager mode calls them, the backward ones as
autograd does (convolution_backward, native_batch_norm_backward,
threshold_backward, ...), so that a planned step gives eager's numbers.

A kernel is `fn(node, args) -> Tensor`: `node` is a `Node` (attrs, output
shape and dtype), `args` the input tensors in the node's order. Kernels
allocate their output and may allocate temporaries; they never write their
inputs. The executor checks each output's shape and dtype against the node.
"""

import math

import torch

aten = torch.ops.aten

DTYPES = {
    "fp32": torch.float32, "f32": torch.float32, "float32": torch.float32,
    "fp16": torch.float16, "f16": torch.float16, "float16": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "i64": torch.int64, "int64": torch.int64,
    "u8": torch.uint8, "uint8": torch.uint8,
}


class Node:
    """What a kernel needs of a graph node."""

    __slots__ = ("id", "index", "op", "attrs", "shape", "dtype", "inputs", "alias_of", "bn",
                 "run")

    def __init__(self, index, doc, run):
        self.index = index
        self.id = doc["id"]
        self.op = doc.get("op", "generic")
        self.attrs = doc.get("attrs") or {}
        self.inputs = list(doc.get("inputs", []))
        # The id of the input this node is a view of (SPEC section 1), or None.
        self.alias_of = doc.get("alias_of")
        self.shape = tuple(doc["shape"]) if "shape" in doc else None
        dtype = doc.get("dtype")
        self.dtype = DTYPES.get(dtype) if dtype is not None else None
        # batchnorm_stats: the running statistics it updates (a BatchNormState).
        self.bn = None
        # What every node of the step shares (a RunContext).
        self.run = run


class RunContext:
    """The settings of one planned step that kernels read."""

    def __init__(self, device, ignore_index=-100):
        self.device = device
        self.ignore_index = ignore_index  # the loss function's (cross-entropy)
        self.step = 0  # counts steps: dropout masks differ from step to step


def spatial(value, dims, default):
    """An attr given as one int or one per spatial dim, as a list of `dims`."""
    if value is None:
        value = default
    if isinstance(value, int):
        return [value] * dims
    value = list(value)
    if len(value) != dims:
        raise ValueError(f"expected {dims} values, got {value}")
    return value


def f32_decimal(value):
    """A float attr written through float32 (an ONNX attribute), back to the
    decimal the model was written with: 9.9999997e-06 -> 1e-05."""
    import numpy
    return float(str(numpy.float32(value)))


def _dummy(like, shape):
    """A tensor of `shape` that only lends its sizes (one element, expanded):
    how PyTorch's own torch.nn.grad passes the absent operand of a backward."""
    return like.new_empty(1).expand(*shape)


# --- convolution and linear ----------------------------------------------

def _conv_geometry(node, dims):
    a = node.attrs
    return (spatial(a.get("stride"), dims, 1), spatial(a.get("padding"), dims, 0),
            spatial(a.get("dilation"), dims, 1), int(a.get("groups", 1)))


def conv(node, args):
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    dims = x.dim() - 2
    stride, padding, dilation, groups = _conv_geometry(node, dims)
    return aten.convolution(x, w, bias, stride, padding, dilation, False, [0] * dims, groups)


def conv_backward_data(node, args):
    g, w = args
    dims = g.dim() - 2
    stride, padding, dilation, groups = _conv_geometry(node, dims)
    x = _dummy(g, node.attrs["input_shape"])
    return aten.convolution_backward(g, x, w, None, stride, padding, dilation, False,
                                     [0] * dims, groups, [True, False, False])[0]


def conv_backward_weight(node, args):
    g, x = args
    dims = g.dim() - 2
    stride, padding, dilation, groups = _conv_geometry(node, dims)
    w = _dummy(g, node.shape)
    return aten.convolution_backward(g, x, w, None, stride, padding, dilation, False,
                                     [0] * dims, groups, [False, True, False])[1]


def conv_backward_bias(node, args):
    """Σ g per output channel. (Autograd's kernel sums it beside the weight
    gradient, from the input this node does not read; the sums agree to
    rounding.)"""
    (g,) = args
    return g.sum(dim=[0] + list(range(2, g.dim())))


def linear(node, args):
    return torch.nn.functional.linear(*args)


def linear_backward_data(node, args):
    g, w = args
    return torch.matmul(g, w)


def linear_backward_weight(node, args):
    g, x = args
    return torch.mm(g.reshape(-1, g.shape[-1]).t(), x.reshape(-1, x.shape[-1]))


def linear_backward_bias(node, args):
    (g,) = args
    return g.sum(dim=list(range(g.dim() - 1))) if g.dim() > 1 else g.clone()


def matmul(node, args):
    a, b = args
    if node.attrs.get("transpose_a", False):
        a = a.transpose(-1, -2)
    if node.attrs.get("transpose_b", False):
        b = b.transpose(-1, -2)
    out = torch.matmul(a, b)
    scale = node.attrs.get("scale", 1.0)
    if scale != 1.0:
        out.mul_(scale)
    return out


# --- element-wise ----------------------------------------------------------

def _clip_bounds(node):
    lo = node.attrs.get("min")
    hi = node.attrs.get("max")
    return (-math.inf if lo is None else lo), (math.inf if hi is None else hi)


def clip(node, args):
    lo, hi = node.attrs.get("min"), node.attrs.get("max")
    return args[0].clone() if lo is None and hi is None else torch.clamp(args[0], lo, hi)


def clip_backward(node, args):
    g, x = args
    lo, hi = _clip_bounds(node)
    return aten.hardtanh_backward(g, x, lo, hi)  # 0 at the bounds, as pebble's clip


def _hardsigmoid_params(node):
    return node.attrs.get("alpha", 1.0 / 6), node.attrs.get("beta", 0.5)


def _is_torch_hardsigmoid(alpha, beta):
    return abs(alpha - 1.0 / 6) < 1e-7 and beta == 0.5


def hardsigmoid(node, args):
    alpha, beta = _hardsigmoid_params(node)
    if _is_torch_hardsigmoid(alpha, beta):
        return torch.nn.functional.hardsigmoid(args[0])
    return torch.mul(args[0], alpha).add_(beta).clamp_(0, 1)


def hardsigmoid_backward(node, args):
    g, x = args
    alpha, beta = _hardsigmoid_params(node)
    if _is_torch_hardsigmoid(alpha, beta):
        return aten.hardsigmoid_backward(g, x)
    z = torch.mul(x, alpha).add_(beta)
    outside = (z <= 0) | (z >= 1)
    del z
    return torch.mul(g, alpha).masked_fill_(outside, 0)


def erf_backward(node, args):
    g, x = args
    return torch.exp(-(x * x)).mul_(2.0 / math.sqrt(math.pi)).mul_(g)


def sqrt_backward(node, args):
    g, y = args
    return g / (2 * y)


def sum_all(node, args):
    return args[0].sum(dtype=torch.float32)


def sum_backward(node, args):
    shape = node.attrs["shape"]
    if args:
        return args[0].to(node.dtype).expand(*shape).clone()
    return torch.ones(shape, dtype=node.dtype, device=_device_of(node))


def sum_to(node, args):
    return args[0].sum_to_size(node.attrs["shape"])


def softmax(node, args):
    x = args[0]
    if node.attrs.get("causal", False):
        rows, cols = x.shape[-2], x.shape[-1]
        mask = torch.ones(rows, cols, dtype=torch.bool, device=x.device).triu_(1)
        x = x.masked_fill(mask, -math.inf)
    return torch.softmax(x, -1)


def softmax_backward(node, args):
    g, y = args
    return aten._softmax_backward_data(g, y, -1, y.dtype)


# --- normalisation -----------------------------------------------------------

def _channel_view(t, x):
    return t.view([1, -1] + [1] * (x.dim() - 2))


def batchnorm_stats(node, args):
    """(2, C): the batch mean and 1/sqrt(var + eps), computed as PyTorch's
    training-mode batch norm does; on a node's first computation in a step the
    running statistics are updated as PyTorch updates them (never again when
    the plan recomputes the node)."""
    (x,) = args
    bn = node.bn
    update = bn is not None and bn.pending
    if update:
        running_mean, running_var = bn.running_mean, bn.running_var
    else:  # a recomputation, or no running statistics: fp32 stand-ins take the
        # update, so that ATen computes in the same precision every time
        channels = x.shape[1]
        running_mean = torch.zeros(channels, dtype=torch.float32, device=x.device)
        running_var = torch.ones(channels, dtype=torch.float32, device=x.device)
    mean, var = torch.batch_norm_update_stats(
        x, running_mean, running_var,
        bn.momentum if bn is not None else node.attrs.get("momentum", 0.1))
    del running_mean, running_var
    if update:
        bn.pending = False
        if bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
    eps = bn.eps if bn is not None else f32_decimal(node.attrs.get("eps", 1e-5))
    # ATen's InvStd: 1 / sqrt(var + eps) in double, then float.
    invstd = var.double().add_(eps).sqrt_().reciprocal_().to(var.dtype)
    return torch.stack([mean, invstd])


def batchnorm(node, args):
    """x * alpha + beta per channel, as ATen's CPU kernel: alpha = invstd *
    weight, beta = bias - mean * alpha, each a fused multiply-add (the
    channel terms in double round once, as an FMA does)."""
    x, stats = args[0], args[1]
    alpha = stats[1] * args[2] if len(args) > 2 else stats[1].clone()
    bias = args[3].double() if len(args) > 3 else 0.0
    beta = (bias - stats[0].double() * alpha.double()).to(alpha.dtype)
    if x.dtype != alpha.dtype:  # half-precision x: in fp32, rounded once (as ATen's mixed kernel)
        return torch.addcmul(_channel_view(beta, x), x.to(alpha.dtype),
                             _channel_view(alpha, x)).to(x.dtype)
    return torch.addcmul(_channel_view(beta, x), x, _channel_view(alpha, x))


def batchnorm_backward(node, args):
    g, x, stats = args[0], args[1], args[2]
    w = args[3] if len(args) > 3 else None
    return aten.native_batch_norm_backward(g, x, w, None, None, stats[0], stats[1], True,
                                           node.attrs.get("eps", 1e-5),
                                           [True, False, False])[0]


def batchnorm_backward_weight(node, args):
    g, x, stats = args
    return aten.native_batch_norm_backward(g, x, None, None, None, stats[0], stats[1], True,
                                           node.attrs.get("eps", 1e-5),
                                           [False, True, False])[1]


def batchnorm_backward_bias(node, args):
    """Σ g per channel, summed by ATen's batch-norm backward as autograd sums
    it (its x and statistics stand-ins do not enter the bias term)."""
    (g,) = args
    zeros = torch.zeros(g.shape[1], dtype=torch.float32, device=g.device)
    return aten.native_batch_norm_backward(g, g, None, None, None, zeros, zeros, True,
                                           node.attrs.get("eps", 1e-5),
                                           [False, False, True])[2]


def layernorm_stats(node, args):
    (x,) = args
    eps = f32_decimal(node.attrs.get("eps", 1e-5))
    var, mean = torch.var_mean(x.float(), dim=-1, unbiased=False)
    return torch.stack([mean, torch.rsqrt(var.clamp_(min=0).add_(eps))])


def layernorm(node, args):
    x, stats = args[0], args[1]
    y = torch.sub(x, stats[0].unsqueeze(-1).to(x.dtype)).mul_(stats[1].unsqueeze(-1).to(x.dtype))
    if len(args) > 2:
        y.mul_(args[2])
    if len(args) > 3:
        y.add_(args[3])
    return y


def _saved_stats(stats, x):
    """Mean and 1/std as ATen's layer-norm backward takes them: (..., 1), in
    x's dtype on the CPU (as eager saves them there), fp32 on a GPU."""
    mean, rstd = stats[0].unsqueeze(-1), stats[1].unsqueeze(-1)
    if x.device.type == "cpu" and x.dtype != mean.dtype:
        mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
    return mean, rstd


def _layernorm_backward(node, args, mask):
    g, x, stats = args[0], args[1], args[2]
    w = args[3] if len(args) > 3 else _dummy(g, (x.shape[-1],))
    mean, rstd = _saved_stats(stats, x)
    return aten.native_layer_norm_backward(g, x, [x.shape[-1]], mean, rstd, w, None, mask)


def layernorm_backward(node, args):
    if len(args) <= 3:  # without a weight: the gradient of x alone
        g, x, stats = args
        ones = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        return _layernorm_backward(node, [g, x, stats, ones], [True, False, False])[0]
    return _layernorm_backward(node, args, [True, False, False])[0]


def layernorm_backward_weight(node, args):
    return _layernorm_backward(node, args, [False, True, False])[1]


def layernorm_backward_bias(node, args):
    """Σ g over the rows, summed by ATen's layer-norm backward (x and the
    statistics are stand-ins: they do not enter the bias term)."""
    (g,) = args
    stats_dtype = g.dtype if g.device.type == "cpu" else torch.float32
    rows = torch.zeros(g.shape[:-1] + (1,), dtype=stats_dtype, device=g.device)
    ones = torch.ones(g.shape[-1], dtype=g.dtype, device=g.device)
    return aten.native_layer_norm_backward(g, g, [g.shape[-1]], rows, rows, ones, ones,
                                           [False, False, True])[2]


# --- pooling, resampling ------------------------------------------------------

def _window(node, dims):
    a = node.attrs
    kernel = spatial(a.get("kernel"), dims, None)
    stride = spatial(a.get("stride"), dims, None) if a.get("stride") is not None else kernel
    return kernel, stride, spatial(a.get("padding"), dims, 0), bool(a.get("ceil_mode", False))


def maxpool(node, args):
    x = args[0]
    dims = x.dim() - 2
    k, s, p, ceil = _window(node, dims)
    fn = aten.max_pool2d_with_indices if dims == 2 else aten.max_pool3d_with_indices
    return fn(x, k, s, p, [1] * dims, ceil)[0]


def maxpool_backward(node, args):
    g, x = args
    dims = x.dim() - 2
    k, s, p, ceil = _window(node, dims)
    if dims == 2:
        indices = aten.max_pool2d_with_indices(x, k, s, p, [1, 1], ceil)[1]
        return aten.max_pool2d_with_indices_backward(g, x, k, s, p, [1, 1], ceil, indices)
    indices = aten.max_pool3d_with_indices(x, k, s, p, [1] * 3, ceil)[1]
    return aten.max_pool3d_with_indices_backward(g, x, k, s, p, [1] * 3, ceil, indices)


def avgpool(node, args):
    x = args[0]
    dims = x.dim() - 2
    k, s, p, _ = _window(node, dims)
    fn = torch.nn.functional.avg_pool2d if dims == 2 else torch.nn.functional.avg_pool3d
    return fn(x, k, s, p, ceil_mode=False, count_include_pad=True)


def avgpool_backward(node, args):
    (g,) = args
    dims = g.dim() - 2
    k, s, p, _ = _window(node, dims)
    x = _dummy(g, node.attrs["input_shape"])
    fn = aten.avg_pool2d_backward if dims == 2 else aten.avg_pool3d_backward
    return fn(g, x, k, s, p, False, True, None)


def global_avgpool(node, args):
    x = args[0]
    return x.mean(dim=list(range(2, x.dim())))


def _mean_backward(g, shape):
    """Autograd's gradient of a mean over the spatial dims: g spread, / count."""
    count = math.prod(shape[2:])
    return g.reshape(list(g.shape[:2]) + [1] * (len(shape) - 2)).expand(*shape) / count


def global_avgpool_backward(node, args):
    return _mean_backward(args[0], node.attrs["input_shape"])


def adaptive_avgpool(node, args):
    x = args[0]
    dims = x.dim() - 2
    size = spatial(node.attrs.get("output_size"), dims, None)
    fn = (torch.nn.functional.adaptive_avg_pool2d if dims == 2
          else torch.nn.functional.adaptive_avg_pool3d)
    return fn(x, size)


def adaptive_avgpool_backward(node, args):
    (g,) = args
    shape = node.attrs["input_shape"]
    if all(d == 1 for d in g.shape[2:]):
        # ATen pools to size 1 as a mean over the spatial dims.
        return _mean_backward(g, shape)
    x = _dummy(g, shape)
    fn = (aten._adaptive_avg_pool2d_backward if g.dim() == 4
          else aten._adaptive_avg_pool3d_backward)
    return fn(g, x)


def _upsample_args(node, dims):
    scale = [float(v) for v in spatial(node.attrs.get("scale"), dims, None)]
    mode = node.attrs.get("mode", "nearest")
    align = bool(node.attrs.get("align_corners", False))
    return scale, mode, align


def upsample(node, args):
    x = args[0]
    scale, mode, align = _upsample_args(node, x.dim() - 2)
    return torch.nn.functional.interpolate(
        x, scale_factor=scale, mode=mode, align_corners=align if mode != "nearest" else None)


def upsample_backward(node, args):
    (g,) = args
    dims = g.dim() - 2
    scale, mode, align = _upsample_args(node, dims)
    out_size, in_size = list(g.shape[2:]), list(node.attrs["input_shape"])
    if mode == "nearest":
        fn = aten.upsample_nearest2d_backward if dims == 2 else aten.upsample_nearest3d_backward
        return fn(g, out_size, in_size, *scale)
    fn = aten.upsample_bilinear2d_backward if dims == 2 else aten.upsample_trilinear3d_backward
    return fn(g, out_size, in_size, align, *scale)


def pad(node, args):
    a = node.attrs
    return torch.nn.functional.pad(args[0], list(a["pads"]), mode=a.get("mode", "constant"),
                                   value=a.get("value", 0))


def pad_backward(node, args):
    return torch.nn.functional.pad(args[0], [-p for p in node.attrs["pads"]])


# --- shapes --------------------------------------------------------------------

def concat(node, args):
    return torch.cat(args, dim=int(node.attrs.get("axis", 1)))


def slice_(node, args):
    x = args[0]
    axis = int(node.attrs.get("axis", 0)) % x.dim()
    size = x.shape[axis]
    begin, end = int(node.attrs["begin"]), int(node.attrs["end"])
    begin = max(0, begin + size if begin < 0 else begin)
    end = min(size, end + size if end < 0 else end)
    return x.narrow(axis, begin, end - begin)


def transpose(node, args):
    x = args[0]
    perm = node.attrs.get("perm") or list(reversed(range(x.dim())))
    return x.permute(*perm)


def reshape(node, args):
    return args[0].reshape(node.shape)


def split_heads(node, args):
    (x,) = args
    a = node.attrs
    heads, chunks, index = int(a["heads"]), int(a.get("chunks", 1)), int(a.get("index", 0))
    b, s, c = x.shape
    part = c // chunks
    # A view until the executor's one copy.
    return x.narrow(2, index * part, part).view(b, s, heads, -1).transpose(1, 2)


def merge_heads(node, args):
    b, s, _ = node.shape
    out = torch.empty(node.shape, dtype=args[0].dtype, device=args[0].device)
    offset = 0
    for t in args:  # each (B, H, S, Dh) into its columns, without a temporary
        width = t.shape[1] * t.shape[3]
        out.narrow(2, offset, width).view(b, s, t.shape[1], t.shape[3]).copy_(t.transpose(1, 2))
        offset += width
    return out


def split_heads_backward(node, args):
    (g,) = args
    a = node.attrs
    chunks, index = int(a.get("chunks", 1)), int(a.get("index", 0))
    out = torch.zeros(node.shape, dtype=g.dtype, device=g.device)
    b, s, c = node.shape
    part = c // chunks
    out.narrow(2, index * part, part).view(b, s, g.shape[1], g.shape[3]).copy_(g.transpose(1, 2))
    return out


def fill(node, args):
    return torch.full(node.shape, node.attrs.get("value", 1.0), dtype=node.dtype,
                      device=_device_of(node))


def arange(node, args):
    return torch.arange(int(node.attrs["n"]), dtype=torch.int64, device=_device_of(node))


def dropout_mask(node, args):
    x = args[0]
    p = float(node.attrs.get("p", 0.5))
    generator = _dropout_generator(node, x.device)
    return torch.empty(x.shape, dtype=torch.uint8, device=x.device).bernoulli_(
        1 - p, generator=generator)


def dropout(node, args):
    g_or_x, mask = args
    p = float(node.attrs.get("p", 0.5))
    return torch.mul(g_or_x, mask).mul_(1.0 / (1.0 - p))


def embedding(node, args):
    indices, weight = args
    return torch.nn.functional.embedding(indices, weight)


def embedding_backward(node, args):
    g, indices = args
    return aten.embedding_dense_backward(g, indices, int(node.attrs["num_embeddings"]), -1,
                                         False)


# --- losses ----------------------------------------------------------------

def _class_axis(node, logits, target):
    axis = node.attrs.get("axis")
    if axis is None:
        without_1 = tuple(logits.shape[:1]) + tuple(logits.shape[2:])
        axis = 1 if tuple(target.shape) == without_1 else logits.dim() - 1
    return int(axis) % logits.dim()


def _as_rows(logits, target, axis):
    """Logits as (rows, classes) and target as (rows): the class axis last."""
    if logits.dim() == 2 and axis == 1:
        return logits, target
    moved = logits.movedim(axis, -1)
    return moved.reshape(-1, moved.shape[-1]), target.reshape(-1)


def softmax_cross_entropy(node, args):
    logits, target = args
    rows, labels = _as_rows(logits, target, _class_axis(node, logits, target))
    log_probs = torch.log_softmax(rows.float(), dim=1)
    return aten.nll_loss_forward(log_probs, labels, None, 1, node.run.ignore_index)[0]


def softmax_cross_entropy_backward(node, args):
    g = args[0] if len(args) == 3 else None
    logits, target = args[-2], args[-1]
    axis = _class_axis(node, logits, target)
    rows, labels = _as_rows(logits, target, axis)
    log_probs = torch.log_softmax(rows.float(), dim=1)
    _, total = aten.nll_loss_forward(log_probs, labels, None, 1, node.run.ignore_index)
    if g is None:
        g = torch.ones((), dtype=torch.float32, device=logits.device)
    grad = aten.nll_loss_backward(g, log_probs, labels, None, 1, node.run.ignore_index, total)
    grad = aten._log_softmax_backward_data(grad, log_probs, 1, log_probs.dtype).to(logits.dtype)
    if logits.dim() == 2 and axis == 1:
        return grad
    moved_shape = list(logits.movedim(axis, -1).shape)
    return grad.reshape(moved_shape).movedim(-1, axis)


def mse_loss(node, args):
    pred, target = args
    return torch.nn.functional.mse_loss(pred.float(), target.float())


def mse_loss_backward(node, args):
    g = args[0] if len(args) == 3 else None
    pred, target = args[-2], args[-1]
    if g is None:
        g = torch.ones((), dtype=pred.dtype, device=pred.device)
    return aten.mse_loss_backward(g.to(pred.dtype), pred, target, 1)


# --- workspace ----------------------------------------------------------------
#
# The bytes a kernel above holds besides its inputs and output while it runs
# (the tensors between its ATen calls; what one ATen call allocates inside is
# not counted, as PyTorch's own allocations are not). pebble.torch adds them
# to the nodes' `workspace`, so that the plan counts them.

def _numel(shape):
    return math.prod(shape) if shape else 1


def _size(node):
    return _numel(node.shape) * (torch.tensor([], dtype=node.dtype).element_size()
                                 if node.dtype is not None else 4)


def _ws_maxpool_backward(node, inputs):
    g = inputs[0]  # the recomputed indices (i64) and pooled values, g's shape
    return _numel(g.shape) * 8 + _size(g)


def _ws_cross_entropy(node, inputs, backward):
    logits = inputs[-2]
    n = _numel(logits.shape)
    moved = 0 if (len(logits.shape) == 2) else _size(logits)  # the class axis moved last
    widened = 0 if logits.dtype == torch.float32 else n * 4  # the logits in fp32
    scalars = 16  # the NLL's total weight, the seed gradient
    if backward:  # log-probabilities, the NLL gradient, the fp32 result before its cast
        return 3 * n * 4 + 2 * moved + widened + scalars
    return n * 4 + moved + widened + scalars


def _ws_causal_softmax(node, inputs):
    if not node.attrs.get("causal", False):
        return 0
    rows, cols = node.shape[-2], node.shape[-1]
    return rows * cols + _size(node)


def _ws_matmul(node, inputs):
    transposed = node.attrs.get("transpose_a", False) or node.attrs.get("transpose_b", False)
    return _size(inputs[0]) + _size(inputs[1]) if transposed else 0


def _ws_channels(node, inputs, per_channel):
    x = inputs[0]  # x, or the gradient of x's shape
    channels = x.shape[1] if len(x.shape) > 1 else 1
    return channels * per_channel


def _ws_layernorm_rows(node, inputs, per_row, per_column):
    x = inputs[1] if node.op == "layernorm_backward" else inputs[0]  # x, or g of x's shape
    rows = _numel(x.shape[:-1])
    return rows * per_row + x.shape[-1] * per_column


def _ws_stand_ins(count):
    """`count` one-element stand-ins for absent operands (_dummy)."""
    return lambda node, inputs: count * _size_of_one(inputs[0])


def _size_of_one(node):
    return _size(node) // max(_numel(node.shape), 1)


WORKSPACE = {
    **{f"conv{d}d_backward_{part}": _ws_stand_ins(1)
       for d in (2, 3) for part in ("data", "weight")},
    "avgpool_backward": _ws_stand_ins(1),
    "adaptive_avgpool_backward": _ws_stand_ins(1),
    "layernorm_backward_weight": lambda n, i: 0 if len(i) > 3 else _size_of_one(i[0]),
    "maxpool_backward": _ws_maxpool_backward,
    "softmax_cross_entropy": lambda n, i: _ws_cross_entropy(n, i, False),
    "softmax_cross_entropy_backward": lambda n, i: _ws_cross_entropy(n, i, True),
    # ATen's mse_loss keeps the squared errors (n values) under its scalar.
    "mse_loss": lambda n, i: _numel(i[0].shape) * 4 * (1 if i[0].dtype == torch.float32 else 3),
    "sum_backward": lambda n, i: 16,
    "softmax": _ws_causal_softmax,
    "matmul": _ws_matmul,
    "erf_backward": lambda n, i: _size(n),
    "sqrt_backward": lambda n, i: _size(n),
    "hardsigmoid_backward": lambda n, i: 0 if _is_torch_hardsigmoid(*_hardsigmoid_params(n))
    else _size(n) + _numel(n.shape),
    # Per-channel terms: (2, C) statistics in double, alpha and beta.
    "batchnorm_stats": lambda n, i: _ws_channels(n, i, 56),
    "batchnorm": lambda n, i: _ws_channels(n, i, 48) + (
        0 if i[0].dtype == torch.float32 else _numel(i[0].shape) * 8),
    "batchnorm_backward_bias": lambda n, i: _ws_channels(n, i, 8),
    "layernorm_stats": lambda n, i: _ws_layernorm_rows(n, i, 12, 0) + (
        0 if i[0].dtype == torch.float32 else _numel(i[0].shape) * 4),
    "layernorm": lambda n, i: 0 if i[0].dtype == torch.float32 else
    _ws_layernorm_rows(n, i, 8, 0) + 16,
    "layernorm_backward": lambda n, i: 0 if len(i) > 3 else _ws_layernorm_rows(n, i, 0, 8),
    "layernorm_backward_bias": lambda n, i: _ws_layernorm_rows(n, i, 4, 8),
}


def workspace_bytes(node, inputs):
    """The bytes `node`'s kernel holds beside its operands (see WORKSPACE)."""
    fn = WORKSPACE.get(node.op)
    return int(fn(node, inputs)) if fn is not None else 0


# --- helpers ---------------------------------------------------------------

def _device_of(node):
    return node.run.device


def _dropout_generator(node, device):
    """A generator seeded by the node's seed, its index and the step count:
    a recomputed mask equals the first, and each step draws anew."""
    generator = torch.Generator(device=device)
    seed = int(node.attrs.get("seed", 0))
    generator.manual_seed((seed * 1000003 + node.index * 7919 + node.run.step)
                          % (2 ** 63))
    return generator


def _unary(fn):
    return lambda node, args: fn(args[0])


def _binary(fn):
    return lambda node, args: fn(args[0], args[1])


def _conv_ops(rank):
    base = f"conv{rank}d"
    return {base: conv, base + "_backward_data": conv_backward_data,
            base + "_backward_weight": conv_backward_weight,
            base + "_backward_bias": conv_backward_bias}


KERNELS = {
    **_conv_ops(2), **_conv_ops(3),
    "linear": linear, "linear_backward_data": linear_backward_data,
    "linear_backward_weight": linear_backward_weight,
    "linear_backward_bias": linear_backward_bias,
    "matmul": matmul,
    "relu": _unary(torch.relu),
    "relu_backward": lambda node, args: aten.threshold_backward(args[0], args[1], 0),
    "tanh": _unary(torch.tanh),
    "tanh_backward": _binary(aten.tanh_backward),
    "sigmoid": _unary(torch.sigmoid),
    "sigmoid_backward": _binary(aten.sigmoid_backward),
    "gelu": lambda node, args: torch.nn.functional.gelu(
        args[0], approximate=node.attrs.get("approximate", "none")),
    "gelu_backward": lambda node, args: aten.gelu_backward(
        args[0], args[1], approximate=node.attrs.get("approximate", "none")),
    "clip": clip, "clip_backward": clip_backward,
    "hardsigmoid": hardsigmoid, "hardsigmoid_backward": hardsigmoid_backward,
    "hardswish": _unary(torch.nn.functional.hardswish),
    "hardswish_backward": _binary(aten.hardswish_backward),
    "leaky_relu": lambda node, args: torch.nn.functional.leaky_relu(
        args[0], node.attrs.get("negative_slope", 0.01)),
    "leaky_relu_backward": lambda node, args: aten.leaky_relu_backward(
        args[0], args[1], node.attrs.get("negative_slope", 0.01), False),
    "erf": _unary(torch.erf), "erf_backward": erf_backward,
    "sqrt": _unary(torch.sqrt), "sqrt_backward": sqrt_backward,
    "add": _binary(torch.add), "sub": _binary(torch.sub),
    "mul": _binary(torch.mul), "div": _binary(torch.div),
    "sum": sum_all, "sum_backward": sum_backward, "sum_to": sum_to,
    "softmax": softmax, "softmax_backward": softmax_backward,
    "batchnorm_stats": batchnorm_stats, "batchnorm": batchnorm,
    "batchnorm_backward": batchnorm_backward,
    "batchnorm_backward_weight": batchnorm_backward_weight,
    "batchnorm_backward_bias": batchnorm_backward_bias,
    "layernorm_stats": layernorm_stats, "layernorm": layernorm,
    "layernorm_backward": layernorm_backward,
    "layernorm_backward_weight": layernorm_backward_weight,
    "layernorm_backward_bias": layernorm_backward_bias,
    "maxpool": maxpool, "maxpool_backward": maxpool_backward,
    "avgpool": avgpool, "avgpool_backward": avgpool_backward,
    "global_avgpool": global_avgpool, "global_avgpool_backward": global_avgpool_backward,
    "adaptive_avgpool": adaptive_avgpool, "adaptive_avgpool_backward": adaptive_avgpool_backward,
    "upsample": upsample, "upsample_backward": upsample_backward,
    "pad": pad, "pad_backward": pad_backward,
    "concat": concat, "slice": slice_, "transpose": transpose,
    "flatten": reshape, "reshape": reshape, "copy": _unary(torch.clone),
    "split_heads": split_heads, "merge_heads": merge_heads,
    "split_heads_backward": split_heads_backward,
    "fill": fill, "arange": arange,
    "dropout_mask": dropout_mask, "dropout": dropout, "dropout_backward": dropout,
    "embedding": embedding, "embedding_backward": embedding_backward,
    "softmax_cross_entropy": softmax_cross_entropy,
    "softmax_cross_entropy_backward": softmax_cross_entropy_backward,
    "mse_loss": mse_loss, "mse_loss_backward": mse_loss_backward,
}
