"""Capture: a module and its loss as a pebble training graph.

The module is exported with torch.onnx.export (training mode, every
parameter kept) and read by pebble's ONNX importer, which adds the loss and
differentiates: one operator mapping, the importer's (docs/import.md).
"""

import contextlib
import inspect
import json
import os
import re
import tempfile
import warnings

import torch

from .. import _core


class CaptureError(ValueError):
    """The module or its loss cannot be captured; the message names the module."""


# Loss functions pebble's autodiff differentiates, by the name import takes.
CROSS_ENTROPY, MSE = "cross-entropy", "mse"


class Loss:
    """The loss as pebble adds it: `kind` and the settings the kernels honour."""

    def __init__(self, kind, ignore_index=-100):
        self.kind = kind
        self.ignore_index = ignore_index


def resolve_loss(loss_fn):
    """Loss for nn.CrossEntropyLoss / nn.MSELoss (mean), their functional
    forms, or the names "cross-entropy" / "mse"; CaptureError otherwise."""
    nn, F = torch.nn, torch.nn.functional
    if isinstance(loss_fn, str):
        if loss_fn in (CROSS_ENTROPY, MSE):
            return Loss(loss_fn)
        raise CaptureError(f"loss '{loss_fn}': pebble.torch takes 'cross-entropy' or 'mse'")
    if loss_fn is F.cross_entropy:
        return Loss(CROSS_ENTROPY)
    if loss_fn is F.mse_loss:
        return Loss(MSE)
    if isinstance(loss_fn, nn.CrossEntropyLoss):
        unsupported = []
        if loss_fn.weight is not None:
            unsupported.append("class weights")
        if loss_fn.reduction != "mean":
            unsupported.append(f"reduction='{loss_fn.reduction}'")
        if getattr(loss_fn, "label_smoothing", 0.0) != 0.0:
            unsupported.append("label smoothing")
        if unsupported:
            raise CaptureError("nn.CrossEntropyLoss with " + ", ".join(unsupported) +
                               ": pebble differentiates the unweighted mean only")
        return Loss(CROSS_ENTROPY, loss_fn.ignore_index)
    if isinstance(loss_fn, nn.MSELoss):
        if loss_fn.reduction != "mean":
            raise CaptureError(f"nn.MSELoss with reduction='{loss_fn.reduction}': pebble "
                               "differentiates the mean only")
        return Loss(MSE)
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    raise CaptureError(f"loss function {name}: pebble.torch takes nn.CrossEntropyLoss(), "
                       "nn.MSELoss(), F.cross_entropy, F.mse_loss, 'cross-entropy' or 'mse'")


class Captured:
    """The training graph and how its persistent nodes meet the module."""

    def __init__(self, graph, document, input_ids, constants):
        self.graph = graph            # pebble.Graph (the training step)
        self.document = document      # the graph as a pebble-graph JSON dict
        self.nodes = document["nodes"]  # its nodes, in order
        self.input_ids = input_ids    # graph input id of each positional input
        self.constants = constants    # id -> tensor: initializers that are not state_dict()


def input_ids_for(count):
    return ["input"] if count == 1 else [f"input{i}" for i in range(count)]


def capture(model, example_inputs, loss, opset=13):
    """The module's training graph (pebble's autodiff of the ONNX export)."""
    input_ids = input_ids_for(len(example_inputs))
    with tempfile.TemporaryDirectory(prefix="pebble-torch-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        suspects = _export(model, example_inputs, path, input_ids, opset)
        try:
            graph = _core.import_onnx(path, loss=loss.kind)
        except ValueError as e:
            message = str(e).replace(f"'{path}': ", "")
            where = _module_of_onnx_node(model, message) or _describe(model)
            hint = f" (the trace warned: {suspects[0]})" if suspects else ""
            raise CaptureError(f"{where}: pebble cannot import its ONNX export: "
                               f"{message}{hint}") from None
        if suspects:
            more = f" (and {len(suspects) - 1} more)" if len(suspects) > 1 else ""
            warnings.warn(f"pebble.torch: the trace may differ from the module's computation: "
                          f"{suspects[0]}{more}", stacklevel=4)
        document = json.loads(graph.to_json())
        nodes = document["nodes"]
        state = model.state_dict(keep_vars=True)
        missing = [n["id"] for n in nodes
                   if n.get("persistent") and n.get("op") != "input" and n["id"] not in state]
        constants = _initializer_values(path, missing) if missing else {}
    return Captured(graph, document, input_ids, constants)


def _describe(module):
    return f"module {type(module).__name__}"


@contextlib.contextmanager
def _buffers_kept(model):
    """Tracing runs the module once in training mode: its buffers (batch-norm
    statistics) are put back as they were."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


@contextlib.contextmanager
def _module_stack(model):
    """Tracks which submodules are running, to name the one that fails."""
    names = {m: n for n, m in model.named_modules()}
    stack, handles = [], []

    def enter(module, _inputs):
        stack.append(module)

    def leave(module, _inputs, _output):
        if stack and stack[-1] is module:
            stack.pop()

    for module in names:
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    try:
        yield stack, names
    finally:
        for h in handles:
            h.remove()


def _module_of_onnx_node(model, message):
    """ "module 'layer1.0.conv1' (Conv2d)" for an error naming the ONNX node
    '/layer1/layer1.0/conv1/Conv' (the scopes PyTorch writes), or None."""
    match = re.search(r"ONNX node '(/[^']*)'", message)
    if not match:
        return None
    path = ""
    for part in match.group(1).strip("/").split("/")[:-1]:
        path = part if not path or part.startswith(path + ".") else f"{path}.{part}"
    module = _submodule(model, path) if path else None
    return f"module '{path}' ({type(module).__name__})" if module is not None else None


def _submodule(model, path):
    module = model
    for part in path.split("."):
        module = getattr(module, part, None)
        if not isinstance(module, torch.nn.Module):
            return None
    return module


def _export(model, example_inputs, path, input_ids, opset):
    """Exports the module to `path`; returns what the tracer warned of (values
    it took as constants), each with the module that was running."""
    options = dict(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                   input_names=input_ids, output_names=["output"], opset_version=opset)
    # PyTorch 2.9 on exports through torch.export by default; the TorchScript
    # exporter keeps training-mode batch norm as the importer reads it.
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        options["dynamo"] = False
    suspects = []
    with _buffers_kept(model), _module_stack(model) as (stack, names), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")

        def note(message, category, *_args, **_kwargs):
            # torch.nn's own modules warn of shape checks (batch norm's
            # batch-size check) that do not change the trace.
            if issubclass(category, torch.jit.TracerWarning) and stack and \
                    not type(stack[-1]).__module__.startswith("torch.nn."):
                culprit = stack[-1]
                text = str(message).strip().splitlines()[0]
                suspects.append(f"module '{names.get(culprit) or '(the top module)'}' "
                                f"({type(culprit).__name__}): {text}")

        warnings.showwarning = note
        warnings.simplefilter("always", torch.jit.TracerWarning)
        try:
            torch.onnx.export(model, tuple(example_inputs), path, **options)
        except Exception as e:  # the exporter raises many types
            reason = _first_line(e)
            if stack:
                culprit = stack[-1]
                where = names.get(culprit) or "(the top module)"
                raise CaptureError(f"module '{where}' ({type(culprit).__name__}) cannot be "
                                   f"traced: {reason}") from None
            path = _op_scope(model, example_inputs, reason)
            module = _submodule(model, path) if path else None
            where = (f"module '{path}' ({type(module).__name__})" if module is not None
                     else _describe(model))
            raise CaptureError(f"{where} cannot be exported to ONNX: {reason}") from None
    return list(dict.fromkeys(suspects))


def _first_line(error):
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line.split(" Please feel free")[0].split("  [Caused by")[0]


def _op_scope(model, example_inputs, reason):
    """The module path of an operator the exporter refused, found in a
    TorchScript trace by the operator's name; None where it cannot be told."""
    # "operator 'aten::linalg_svd'", "operator Bernoulli": matched by name.
    match = re.search(r"operator '?(?:[A-Za-z_]+::)?([A-Za-z_0-9]+)", reason)
    if not match:
        return None
    name = match.group(1).lower()
    try:
        with _buffers_kept(model), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(model, tuple(example_inputs), check_trace=False)
        for node in traced.inlined_graph.nodes():
            if node.kind().split("::")[-1].rstrip("_").lower() == name:
                scope = node.scopeName().split("/")[-1].split("::")[-1]
                return scope[len("__module."):] if scope.startswith("__module.") else None
    except Exception:  # the trace is a hint only
        return None
    return None


def _initializer_values(path, ids):
    """Tensors the export wrote as initializers that are not the module's
    state_dict() (constants made in forward), read from the ONNX file."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise CaptureError(
            f"the ONNX export holds constant tensors that are not in state_dict() "
            f"({', '.join(ids[:3])}); reading them needs the onnx Python package") from None
    model = onnx.load(path)
    wanted = set(ids)
    values = {}
    for init in model.graph.initializer:
        if init.name in wanted:
            values[init.name] = torch.from_numpy(numpy_helper.to_array(init).copy())
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] in wanted:
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = torch.from_numpy(
                        numpy_helper.to_array(attr.t).copy())
    absent = sorted(wanted - values.keys())
    if absent:
        raise CaptureError(f"the graph's persistent tensors {absent[:3]} are neither in "
                           "state_dict() nor constants of the ONNX export")
    return values
