"""pebble.torch: a PyTorch module's training step under a pebble plan.

    import pebble.torch as pt
    step = pt.train_step(model, torch.nn.CrossEntropyLoss(), example_inputs=(x,),
                         example_target=y, policy="hybrid", budget="60%")
    loss = step(x, y)      # forward + backward under the plan; .grad of every parameter set
    optimizer.step()       # the user's optimizer, unchanged
    step.report            # predicted and measured peak, recomputations, transfers, time

The module and its loss are captured once (torch.onnx.export, read by
pebble's importer, differentiated by pebble's autodiff) and planned by the
policy; each call runs the plan with PyTorch's own operators. docs/torch.md
documents the API and its limits.
"""

import json

import torch

from .. import _core
from ._capture import CaptureError, _submodule, capture, resolve_loss
from ._executor import BatchNormState, PlanExecutionError, Program
from ._kernels import Node, RunContext, f32_decimal, workspace_bytes
from ._memory import TensorMemory, measure, tensor_bytes

__all__ = ["CaptureError", "PlanError", "PlanExecutionError", "TensorMemory", "TrainStep",
           "measure", "tensor_bytes", "train_step"]


class PlanError(ValueError):
    """The policy cannot fit the step in the budget (or cannot plan it)."""


def train_step(model, loss_fn, example_inputs, example_target, policy=None, budget="100%",
               **options):
    """A callable training step of `model` under a pebble plan; see TrainStep."""
    return TrainStep(model, loss_fn, example_inputs, example_target, policy=policy,
                     budget=budget, **options)


class TrainStep:
    """`step(*inputs, target)` runs forward, loss and backward of `model` under
    the plan, adds every parameter's gradient into its `.grad` (as autograd
    does), updates batch-norm running statistics (as the modules do) and
    returns the loss (a detached 0-dim tensor).

    Arguments:
      model: a torch.nn.Module in training mode, on one device (CPU or CUDA).
      loss_fn: nn.CrossEntropyLoss() or nn.MSELoss() (mean), F.cross_entropy,
        F.mse_loss, or the names "cross-entropy" / "mse".
      example_inputs: a tensor or a tuple of tensors: the shapes every call takes.
      example_target: a tensor of the target's shape and dtype.
      policy: any name `pebble.policies()` lists (None: best-order where the
        unplanned step fits, else hybrid).
      budget: "60%" (of the unplanned peak), "6GiB", "min", or bytes.
      host_budget, bandwidth, time_limit, seed: as pebble.plan takes them.
      opset: the ONNX opset of the capture (13).
    """

    def __init__(self, model, loss_fn, example_inputs, example_target, policy=None,
                 budget="100%", host_budget=None, bandwidth=None, time_limit=60.0, seed=0,
                 opset=13):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if not model.training:
            raise CaptureError(f"module {type(model).__name__} is in eval mode: pebble.torch "
                               "plans training steps (call model.train() first)")
        self.model = model
        self.loss = resolve_loss(loss_fn)
        inputs = _as_tuple(example_inputs, "example_inputs")
        self.device = _device_of(model, inputs)
        _check_bn_momentum(model)
        captured = capture(model, inputs, self.loss, opset=opset)
        self.input_ids = captured.input_ids
        self.run_context = RunContext(self.device, self.loss.ignore_index)
        self.nodes = [Node(i, doc, self.run_context) for i, doc in enumerate(captured.nodes)]
        self.graph = _with_kernel_workspace(captured, self.nodes)
        by_id = {n.id: n for n in self.nodes}
        _check_tensor(example_target, by_id["target"], "example_target", self.device)
        for k, (t, i) in enumerate(zip(inputs, self.input_ids)):
            _check_tensor(t, by_id[i], f"example_inputs[{k}]", self.device)
        plan = _core.plan(self.graph, policy=policy, budget=budget, host_budget=host_budget,
                          bandwidth=bandwidth, time_limit=time_limit, seed=seed)
        if not plan.feasible:
            raise PlanError(f"policy {plan.policy} cannot fit the training step of "
                            f"{type(model).__name__} in {budget}: {plan.message}")
        self.plan = plan
        self._bind(captured)
        workspace = {n.index: int(doc.get("workspace", 0))
                     for n, doc in zip(self.nodes, captured.nodes) if doc.get("workspace")}
        self.program = Program(self.nodes, plan.schedule, self.graph.outputs, self.device,
                               workspace)
        self.report = self._plan_report()

    # --- set-up ---------------------------------------------------------------

    def _bind(self, captured):
        """Which node is which: persistent nodes are the module's state_dict()
        entries (looked up again at every call, so a module moved or reloaded
        since is seen), constants of the export, the inputs and the target."""
        state = self.model.state_dict(keep_vars=True)
        by_id = {n.id: n for n in self.nodes}
        self.state_nodes = []      # (node, state_dict key)
        self.constants = {}        # node index -> tensor (constants of the export)
        self.input_index = [by_id[i].index for i in self.input_ids]
        self.target_index = by_id["target"].index
        for node, doc in zip(self.nodes, captured.nodes):
            if not doc.get("persistent") or doc.get("op") == "input":
                continue
            if node.id in state:
                self.state_nodes.append((node, node.id))
            else:
                self.constants[node.index] = captured.constants[node.id].to(
                    self.device, node.dtype)
        # (graph output, parameter key): where each gradient goes.
        self.gradient_keys = [(out, out[len("grad:"):]) for out in self.graph.outputs
                              if out.startswith("grad:") and out[len("grad:"):] in state]
        for node in self.nodes:
            if node.op == "batchnorm_stats":
                node.bn = self._batchnorm_state(node, state)

    def _batchnorm_state(self, node, state):
        mean_id = node.attrs.get("running_mean")
        var_id = node.attrs.get("running_var")
        if mean_id not in state or var_id not in state:
            return None  # no running statistics (track_running_stats=False)
        if mean_id == "running_mean":  # the model is a batch norm itself
            prefix, module = "", self.model
        elif mean_id.endswith(".running_mean"):
            prefix = mean_id[: -len("running_mean")]  # with its dot
            module = _submodule(self.model, prefix[:-1])
        else:
            prefix, module = None, None
        momentum = getattr(module, "momentum", None) if module is not None else None
        eps = getattr(module, "eps", None) if module is not None else None
        counter = prefix + "num_batches_tracked" if prefix is not None else None
        return BatchNormState(
            mean_id, var_id, counter if counter in state else None,
            momentum if momentum is not None else f32_decimal(node.attrs.get("momentum", 0.1)),
            eps if eps is not None else f32_decimal(node.attrs.get("eps", 1e-5)))

    def _module_tensors(self):
        """(persistent tensors by node index, [(output id, parameter)]) from the
        module as it is now; ValueError where it changed under the plan."""
        state = self.model.state_dict(keep_vars=True)
        persistent = dict(self.constants)
        for node, key in self.state_nodes:
            t = state.get(key)
            if t is None:
                raise ValueError(f"the module has no '{key}' any more; make a new train_step")
            _check_tensor(t, node, f"'{key}'", self.device)
            persistent[node.index] = t.detach()
        for node in self.nodes:
            if node.bn is not None:
                node.bn.bind(state)
        gradients = [(out, state[key]) for out, key in self.gradient_keys
                     if isinstance(state[key], torch.nn.Parameter) and state[key].requires_grad]
        return persistent, gradients

    def _plan_report(self):
        r = self.plan.report
        return {
            "policy": self.plan.policy,
            "budget_bytes": self.plan.budget_bytes,
            "baseline_peak_bytes": self.plan.baseline_peak_bytes,
            "predicted_peak_bytes": r["peak_bytes"],
            "measured_peak_bytes": None,
            "recomputations": r["recomputations"],
            "predicted_transfer_bytes": r["transfer_bytes"],
            "transfer_bytes": None,
            "host_peak_bytes": r["host_peak_bytes"],
            "compute_overhead": r["overhead"],
            "plan_time_s": self.plan.plan_time_s,
            "time_s": None,
            "steps": len(self.plan.schedule),
            "nodes": len(self.graph),
            "device": str(self.device),
        }

    # --- one step -------------------------------------------------------------

    def __call__(self, *args):
        """step(*inputs, target) -> the loss; every parameter's .grad accumulated."""
        if len(args) != len(self.input_index) + 1:
            raise TypeError(f"the step takes {len(self.input_index)} input(s) and the target, "
                            f"got {len(args)} argument(s)")
        *inputs, target = args
        persistent, gradients = self._module_tensors()
        for k, (t, i) in enumerate(zip(inputs, self.input_index)):
            _check_tensor(t, self.nodes[i], f"input {k}", self.device)
            persistent[i] = t.detach()
        _check_tensor(target, self.nodes[self.target_index], "the target", self.device)
        persistent[self.target_index] = target.detach()
        self.run_context.step += 1
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            allocated_at_start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        # The plan fixed every tensor's dtype: autocast stays off inside the step.
        with torch.no_grad(), torch.autocast(self.device.type, enabled=False):
            result = self.program.run(persistent)
            for out_id, param in gradients:
                grad = result.outputs[out_id]
                if param.grad is None:
                    param.grad = grad
                else:
                    param.grad.add_(grad)
        self.report.update(measured_peak_bytes=result.peak_bytes,
                           transfer_bytes=result.transfer_bytes,
                           measured_host_peak_bytes=result.host_peak_bytes,
                           measured_recomputations=result.recomputations,
                           time_s=result.time_s)
        if cuda:
            self.report.update(
                cuda_max_memory_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
                cuda_memory_allocated_at_start_bytes=allocated_at_start)
        return result.outputs["loss"]

    @property
    def schedule(self):
        """The plan's steps, (action, node id) pairs."""
        return self.plan.schedule

    def __repr__(self):
        r = self.report
        return (f"<pebble.torch.TrainStep {type(self.model).__name__}: {r['policy']}, "
                f"predicted peak {r['predicted_peak_bytes']} of {r['budget_bytes']} bytes>")


def _with_kernel_workspace(captured, nodes):
    """The graph with each node's workspace raised to what its PyTorch kernel
    holds beside its operands (_kernels.WORKSPACE), so the plan counts it."""
    by_id = {n.id: n for n in nodes}
    changed = False
    for node_doc, node in zip(captured.nodes, nodes):
        extra = workspace_bytes(node, [by_id[i] for i in node.inputs])
        if extra > node_doc.get("workspace", 0):
            node_doc["workspace"] = extra
            changed = True
    return _core.from_json(json.dumps(captured.document)) if changed else captured.graph


def _as_tuple(inputs, what):
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)) and inputs and \
            all(isinstance(t, torch.Tensor) for t in inputs):
        return tuple(inputs)
    raise TypeError(f"{what} must be a tensor or a tuple of tensors")


def _device_of(model, inputs):
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    devices |= {t.device for t in inputs}
    if len(devices) != 1:
        raise CaptureError(f"module {type(model).__name__} and its inputs span several devices "
                           f"({', '.join(sorted(str(d) for d in devices))}): pebble.torch "
                           "runs a step on one")
    device = devices.pop()
    if device.type not in ("cpu", "cuda"):
        raise CaptureError(f"device {device}: pebble.torch runs on the CPU or a CUDA GPU")
    return device


def _check_bn_momentum(model):
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and \
                module.track_running_stats and module.momentum is None:
            raise CaptureError(f"module '{name}' ({type(module).__name__}) keeps a cumulative "
                               "average (momentum=None), which pebble.torch does not "
                               "reproduce; give it a momentum")


def _check_tensor(t, node, what, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a tensor, not {type(t).__name__}")
    if tuple(t.shape) != node.shape or t.dtype != node.dtype:
        raise ValueError(f"{what} is {tuple(t.shape)} {t.dtype}; the plan was made for "
                         f"{node.shape} {node.dtype} (make a train_step for these shapes)")
    if t.device != device:
        raise ValueError(f"{what} is on {t.device}; the module is on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{what} is not contiguous (channels_last?): pebble.torch plans "
                         "tensors in PyTorch's default layout; pass .contiguous() or convert "
                         "the module with .to(memory_format=torch.contiguous_format)")
