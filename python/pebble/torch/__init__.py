"""pebble.torch: a PyTorch module's training step under a pebble plan.

    import pebble.torch as pt
    step = pt.train_step(model, loss_fn, example_inputs=(x,), example_target=y,
                         policy="rotor", budget="60%")
    loss = step(x, y)      # forward, loss and backward under the plan; .grad of every parameter set
    optimizer.step()       # the user's optimizer, unchanged
    # or the optimizer's step in the plan too (its state counted and placed):
    step = pt.train_step(model, loss_fn, (x,), y, optimizer=optimizer, budget="60%")
    step.report            # predicted and measured peak, recomputations, transfers, time
    # on several ranks, sharded (ZeRO-3): each rank its slice of the batch
    step = pt.train_step(model, loss_fn, (x_mine,), y_mine, optimizer=optimizer,
                         process_group=torch.distributed.group.WORLD, shard="full")

PyTorch traces the whole step (module, the user's loss callable and
autograd's backward) into one graph of ATen operators (_capture.py); each
operator's output becomes a pebble node (_graph.py), timed and measured once
on the device (_calibrate.py); a pebble policy plans the graph; each call
runs the plan's steps with the traced operators (_executor.py). The
allocator measures what a step really held (_memory.py). docs/torch.md
documents the API and its limits.
"""

import contextlib
import gc
import inspect
import itertools
import json
import math
import numbers
import os
import sys
import time
import uuid
import warnings

import torch

from .. import _core
from ._calibrate import calibrate, estimated
from ._capture import (CaptureError, ModuleSettings, eager_failure_message, propagate,
                       python_randomness, trace)
from ._compat import autocast_state
from ._distributed import (GradientAverage, StepCollectives, agreed, any_rank,
                           any_rank_or_differing, broadcast_module,
                           broadcast_optimizer_state, check_same_call, check_same_collective,
                           check_same_graph, check_same_setup, is_rank_0, measure_link,
                           optimizer_state_layout, out_of_step, plan_of_rank_0,
                           same_on_every_rank)
from ._executor import (COMPUTE, FREE, REDUCE, CapturedValueMismatch, PlanExecutionError,
                        Program, draws_in_eager_order, generator_state_bytes,
                        kept_siblings, statistics_read_out_of_order)
from ._fit import largest_batch
from ._graph import StepGraph
from ._memory import AllocatorPeak, TensorMemory, allocated_where_profiled, measure, tensor_bytes
from ._optimizer import OptimizerError, Updates, check_choices, state_dict_on_cpu
from ._sharding import ShardedRunner, Shards, calibrate_sharded, holds_whole_state, on_meta

__all__ = ["CaptureError", "OptimizerError", "PlanError", "PlanExecutionError", "TensorMemory",
           "TrainStep", "largest_batch", "measure", "tensor_bytes", "train_step"]


class PlanError(ValueError):
    """The policy cannot fit the step in the budget (or cannot plan it).
    least_step_bytes: where the policy's least peak is known, that peak
    above the persistent tensors, else None."""

    def __init__(self, message, least_step_bytes=None):
        super().__init__(message)
        self.least_step_bytes = least_step_bytes


def _check_as_pebble_plan_does(**options):
    """pebble.plan's ValueError for `options`, where it refuses them, raised
    here before anything is captured: planned on a graph of two nodes, its
    message names the culprit as the command line's does. Returns that plan
    (its budget_bytes: a size budget in bytes)."""
    return _core.plan(_core.model("path:n=2"), **options)


def _check_plan_options(options):
    """ValueError for a policy that pebble does not know, or a milp_max_stages
    out of its range, before anything is planned: a ValueError that planning
    raises after these checks is the policy's refusal (_policy_plan)."""
    policy = options.get("policy")
    if policy is not None:
        names = [p["name"] for p in _core.policies()]
        if not isinstance(policy, str) or policy not in names:
            _check_as_pebble_plan_does(policy=policy)  # (the nearest name, the known ones)
    stages = options.get("milp_max_stages", 0)
    if isinstance(stages, bool) or not isinstance(stages, int) or not 0 <= stages <= 100000:
        raise ValueError(f"milp_max_stages must be a whole number from 0 to 100000 (0: "
                         f"checkmate's 300 stages, checkmate-lp's 600), not {stages!r}")


def _may_recompute(plan):
    """Whether `plan`'s policy may run a call again: a multi-shot policy, or
    one whose plan here recomputes (hybrid); not a one-shot order nor an
    offload alone (swap, vdnn)."""
    kinds = {p["name"]: p["kind"] for p in _core.policies()}
    return kinds.get(plan.policy) == "multi-shot" or plan.report["recomputations"] > 0


# The distributed steps made in this process, counted (rank 0's count
# numbers a step in every rank's checks and errors: StepCollectives.label).
_DISTRIBUTED_STEPS_MADE = itertools.count(1)

# The planning arguments that the simulator takes too: a plan simulated again
# (_simulated_peak) is timed and bucketed as it was planned.
_SIMULATION_OPTIONS = ("bandwidth", "ranks", "network", "network_latency", "bucket_copies",
                       "bucket_alignment")


def _simulated_peak(graph, schedule, options, kept=(), workspace=None):
    """The simulator's peak bytes of `schedule` on `graph` with the nodes of
    `kept` holding no workspace and those of `workspace` (id -> bytes)
    holding that: the plan's figures as the program runs it."""
    workspace = workspace or {}
    document = json.loads(graph.to_json())
    for node in document["nodes"]:
        if node["id"] in kept:
            node.pop("workspace", None)
        elif node["id"] in workspace:
            node["workspace"] = workspace[node["id"]]
    run = _core.simulate(_core.from_json(json.dumps(document)), schedule, **options)
    return run["peak_bytes"]


# Note [Plans in eager's order at lower budgets]: a step with random calls
# (dropout) is planned first over the graph without order tokens, and again
# over the graph with them where that plan draws out of eager's order (Note
# [Random calls in eager's order] in _graph.py). The tokens constrain the
# plan: its least peak can stand well above that of a plan over the graph
# without them that happens to draw in order, and a heuristic's plans are
# not monotone in the budget (dtr evicts otherwise at each budget). So
# budget="min" gave a higher peak than a budget of 35% did (a transformer
# encoder with dropout under dtr: 243,544 bytes at "min", 236,120 at 35%),
# and 80% was refused where 60% planned, until 2026-12-07. Where the plan
# over the tokens' graph is taken at "min", or where no plan fits the
# budget, the graph without tokens is planned at a few byte budgets from
# the plan's peak (or the budget) down to that graph's least peak, and the
# lowest plan among those that draw in eager's order is taken, where it is
# lower (_in_order_below); a refusal's least peak takes them too.
_BUDGET_PROBES = 6


def _policy_plan(graph, kwargs):
    """_core.plan(graph, **kwargs), where a refusal of the policy (checkmate's
    cap on the graph's size, a policy that needs a sharded graph) is a
    PlanError, as a budget it cannot fit is."""
    try:
        return _core.plan(graph, **kwargs)
    except ValueError as e:
        raise PlanError(str(e)) from None


def _step_parameters():
    """The names train_step (TrainStep) takes."""
    return frozenset(inspect.signature(TrainStep.__init__).parameters) - {"self"}


def train_step(model, loss_fn, example_inputs, example_target, policy=None, budget="100%",
               **options):
    """A callable training step of `model` under a pebble plan; see TrainStep."""
    return TrainStep(model, loss_fn, example_inputs, example_target, policy=policy,
                     budget=budget, **options)


class TrainStep:
    """`step(*inputs, target)` runs the module's forward, `loss_fn` and the
    backward under the plan, adds every parameter's gradient into its
    `.grad` as autograd does, updates the module's buffers as its forward
    does (batch-norm running statistics), and returns the loss (detached).

    Arguments:
      model: a torch.nn.Module, its parameters, buffers and the inputs on one
        device (the CPU or one CUDA GPU).
      loss_fn: any callable loss_fn(model_output, target) -> a scalar tensor;
        the output may be a tensor, a tuple or a dict.
      example_inputs: a tensor or a tuple of tensors (integer ones too:
        token ids); example_target: a tensor. A call with other shapes is
        captured and planned again for them (cached per shapes).
      policy: any name pebble.policies() lists; None: best-order where the
        unplanned step fits the budget, else hybrid (never offloading on the
        CPU).
      budget: "70%" (of the unplanned step's peak as the allocator measured
        it at capture, above the memory held before the step), "6GiB" (the
        whole device memory of the step: parameters, buffers, batch and
        gradients included), "min" (the least the policy reaches) or bytes
        (a number from 1024 up: an int, or a float such as 0.8 * a device's
        memory, rounded down to whole bytes).
      host_budget, bandwidth, time_limit, seed, milp_max_stages: as
        pebble.plan takes them (milp_max_stages: checkmate's and
        checkmate-lp's cap on the graph's size).
      calibrate: time and measure each operator once at capture (True), or
        estimate from sizes (False).
      measure: "first" (the allocator measures the first call of each shape;
        on the CPU its profiler slows that call), "always" or "never". On a
        GPU every call is measured (the allocator's statistics cost
        nothing).
      allow_cpu_offload: run plans that copy tensors to the host on the CPU
        device, where they save no memory (for testing the offload path;
        host copies are made before the step and so are not in its measured
        peak).
      optimizer: a torch.optim.SGD, Adam or AdamW over every trainable
        parameter: the step then includes its update, planned with the rest
        (its state counted; the updates where the plan runs them), and
        `step(...)` updates the parameters: do not call optimizer.step() as
        well. Its state lives in optimizer.state in torch.optim's format
        (state_dict() stays loadable); clear the gradients between steps as
        usual (optimizer.zero_grad(); a .grad kept is added to, as backward()
        adds).
      optimizer_state: where the optimizer's state lives between steps:
        "device" (resident), "host" (pinned host memory beside a GPU; a
        device update streams each state tensor to the device and back, so
        the device holds one parameter's state at a time) or "auto" (the
        plan chooses per tensor: resident what the budget allows, the rest
        on the host). None (the default): "device" where the updates run on
        the device, else "host".
      optimizer_updates: where the optimizer's updates run: "device", "host"
        (every update on the CPU, on host copies of the gradient and the
        parameter, as DeepSpeed's ZeRO-Offload does; the parameter's device
        copy is freed meanwhile and fetched back updated) or "auto" (the
        plan chooses per parameter: on the host what the budget needs
        there, the rest on the device). On the CPU device the host saves
        nothing: a host or auto state or updates need allow_cpu_offload=True
        there.
      optimizer_gradients: "keep" (each gradient ends the step in .grad, as
        backward() leaves it) or "drop" (only the updates read a gradient:
        the plan frees each once its updates have read it, sending it to the
        host as soon as it is complete where its update runs there, and
        .grad is None after the step). None (the default): "keep", but
        "drop" with shard="full" or the parameters on the host.
      optimizer_parameters: where the parameters that the optimizer updates
        live between steps: "device" (the default), "host" (fetched to the
        device for their uses and device updates, as FSDP's CPUOffload and
        ZeRO-Infinity offload parameters to host memory; the module's
        parameter is then the plan's host copy between steps: Note
        [Parameters that live on the host] in _executor.py) or "auto" (the
        plan chooses per parameter). With shard="full", each rank's
        parameter shards, fetched for their gathers.
      max_grad_norm: with `optimizer`, the gradients are clipped before the
        updates as torch.nn.utils.clip_grad_norm_(model.parameters(),
        max_grad_norm) clips them between backward() and optimizer.step()
        (the norm of all the gradients together: grad_norm_type), inside
        the plan: it then holds every gradient until their norm is known,
        and every update follows it. .grad holds the clipped gradients, and
        step.grad_norm the norm before clipping (what clip_grad_norm_
        returns). None (the default): no clipping. With a process_group
        (shard="none"), the norm is that of the gradients averaged over the
        ranks, as clip_grad_norm_ after DistributedDataParallel's backward
        computes it: the plan's all-reduces (in buckets as `buckets` says)
        average each gradient before the clipping reads it (Note [Clipping
        the averaged gradients] in _capture.py); with
        shard="full", of the whole gradients from each rank's shards, as
        FSDP clips (Note [Clipping sharded gradients] in _sharding.py).
        Not where a .grad kept from before the step would be added to.
      grad_norm_type: the norm max_grad_norm bounds, as clip_grad_norm_'s
        norm_type: a positive number p (the p-norm; 2.0, the default) or
        "inf" (the largest magnitude).
      process_group: a torch.distributed process group (initialised; gloo on
        the CPU, NCCL on GPUs): data parallelism, DistributedDataParallel's
        rule. Rank 0's parameters and buffers are copied to every rank here.
        Each rank calls the step with its own slice of the batch (every rank
        the same shapes) and runs the same plan; each gradient is averaged
        over the ranks as soon as the backward is done with it (an
        asynchronous all-reduce), so every rank ends the step with the whole
        batch's gradients (equal slices, a mean loss) and, with `optimizer`,
        the same parameters. The plan places each all-reduce (an all_reduce
        step) and times it on the ranks' link, which calibration measures
        (rank 0's all-reduces of two sizes; the default link of
        pebble.plan otherwise). A step that fails while it runs leaves
        the TrainStep refusing further calls (a call refused on every rank
        alike, before it runs, does not).
      shard: "none" (each rank holds the whole model: data parallelism) or
        "full" (ZeRO-3 / FSDP FULL_SHARD, with `optimizer`): each rank keeps
        1/ranks of every trainable parameter, gradient and optimizer state;
        the plan gathers each parameter where its readers need it (and
        again for the backward, or keeps it) and reduce-scatters each
        gradient for the updates (_sharding.py). Between steps the module's
        parameters are empty tensors: step.full_state_dict() gathers them;
        opt.state holds each rank's shards. The gradients are dropped after
        the updates (optimizer_gradients="drop"); optimizer_state and
        optimizer_updates place the state's shards and run the updates on
        them as unsharded (ZeRO-Offload on shards).
      param_init: with shard="full", for a module given on the meta device
        (built with device="meta": shapes, no memory), the step makes it on
        the inputs' device a module at a time, so that no rank holds it
        whole: each module's own parameters and buffers made there, then
        param_init(module) sets them in place (None: the module's
        reset_parameters()), rank 0's values go to every rank, and each rank
        keeps its shards (_sharding.py, Note [A module built in shards]).
        The module's parameters are then new tensors, in the optimizer too;
        a module without reset_parameters() needs param_init.
      network, network_latency: the ranks' link as the plan times its
        collectives, as pebble.plan takes them (a preset such as "ib-ndr"
        or bytes per second; seconds a message). None: calibration measures
        it (else pebble.plan's default link).
      max_shapes: the most signatures (above: shapes, layouts, modes and
        the rest) whose capture and plan the step keeps, 8 by default: past
        it the least recently called is dropped, its host copies with it,
        and captured and planned again if it comes back (a UserWarning says
        so the first time). Inputs of ever new lengths are better padded to a
        few. None: no bound.
      buckets: with a process_group and shard="none", how the gradients'
        all-reduces are grouped, each group one message through a flat copy
        of its gradients that the plan holds (pebble.plan's bucket_copies=
        "device"): "auto" (the plan chooses, within the budget), "none" (one
        all-reduce per gradient, in place) or a size such as "25MiB"
        (DistributedDataParallel's rule with that cap). With shard="full":
        "auto" (the plan joins gathers, and reduce-scatters, into one
        message where that is faster) or "none" (each its own message; the
        fsdp rules' units either way).
    """

    def __init__(self, model, loss_fn, example_inputs, example_target, policy=None,
                 budget="100%", host_budget=None, bandwidth=None, time_limit=10.0, seed=0,
                 calibrate=True, measure="first", allow_cpu_offload=False, optimizer=None,
                 optimizer_state=None, optimizer_updates="device", optimizer_gradients=None,
                 process_group=None, shard="none", network=None, network_latency=None,
                 buckets="auto", optimizer_parameters="device", param_init=None,
                 max_grad_norm=None, grad_norm_type=2.0, milp_max_stages=0, max_shapes=8):
        self.process_group = _checked_group(process_group)
        # Each rank's own checks, then (Note [One plan on every rank]) the
        # ranks agree on them and on what decides the collectives that follow,
        # before the first: a rank given another module or other options
        # would pair its collectives with the others' wrongly.
        error = None
        try:
            _check_grad_mode("train_step was called")
            inputs, optimizer_gradients = self._take_arguments(
                model, loss_fn, example_inputs, example_target, shard, param_init,
                dict(policy=policy, budget=budget, host_budget=host_budget,
                     bandwidth=bandwidth, time_limit=time_limit, seed=seed,
                     milp_max_stages=milp_max_stages),
                calibrate, measure, allow_cpu_offload, optimizer, optimizer_state,
                optimizer_updates, optimizer_gradients, optimizer_parameters, max_grad_norm,
                grad_norm_type)
            self.max_shapes = _checked_max_shapes(max_shapes)
        except Exception as e:  # noqa: BLE001 (raised again by check_same_setup)
            if self.process_group is None:
                raise
            error = e
        if self.process_group is not None:
            check_same_setup(lambda: _setup_of(model, inputs, example_target, optimizer, dict(
                shard=shard, device=self.device.type, **self.options, calibrate=calibrate,
                measure=measure, allow_cpu_offload=allow_cpu_offload,
                optimizer_state=optimizer_state,
                optimizer_updates=optimizer_updates, optimizer_gradients=optimizer_gradients,
                optimizer_parameters=optimizer_parameters, network=network,
                network_latency=network_latency, buckets=buckets,
                param_init=param_init is not None, max_grad_norm=max_grad_norm,
                grad_norm_type=str(grad_norm_type), max_shapes=max_shapes)), error,
                self.process_group)
        if self.updates is not None and self.updates.on_host and calibrate:
            self.updates.measure_host_rate()  # the host's cost of an update, on this CPU
            if self.process_group is not None:  # Note [One plan on every rank]
                self.updates.host_bytes_per_s = same_on_every_rank(
                    self.updates.host_bytes_per_s, self.process_group)
        # Whether a step failed (on several ranks, it then refuses later
        # calls); shared with the steps replan() makes, whose module,
        # captures and shards are this one's.
        self._failure = _Failure()
        # The ranks' link as the plan times it: (a preset or bytes/s, latency
        # s or None), or None (pebble.plan's default link).
        if network is None and network_latency is not None:
            raise ValueError("network_latency goes with network: give the link's bandwidth "
                             "(a preset or bytes per second) too")
        if network is not None and self.process_group is None:
            raise ValueError("network is the link between the ranks of a process_group: give "
                             "the process group too")
        self.network = (network, network_latency) if network is not None else None
        self.buckets = _checked_buckets(buckets, self.process_group, shard)
        self.network_measured = False
        self.collectives = None
        if self.process_group is not None:
            self._join_ranks(model, calibrate and network is None, shard == "full")
        # The parameters' shards (shard="full"): the module's are empty once
        # the first step is planned and the optimizer's state made.
        self.shards = None
        if shard == "full":
            self.shards = agreed(lambda: Shards(model, self.process_group, self.updates,
                                                self.device, param_init),
                                 self.process_group)
        # The gradients' total norm before clipping in the last call, as
        # clip_grad_norm_ returns it (max_grad_norm); None without clipping.
        self.grad_norm = None
        self._captures = {}  # signature -> _Capture, shared with replan()'s steps
        # Each capture's number, made on every rank together (_stale), shared
        # with replan()'s steps as the captures are.
        self._capture_numbers = itertools.count()
        # signature -> _Variant (its capture and this step's plan), the least
        # recently called first (_keep_at_most).
        self._variants = {}
        self._shapes_dropped = 0
        self._run_once = []  # the variants that have run (_find_under_settings_left)
        self._warned_of_trained_reads = False  # _warn_of_trained_values_read
        try:
            self._variant = self._variant_for(inputs, example_target)
            if self.shards is not None:
                # A whole state (an unsharded step's, or a saved
                # full_optimizer_state_dict()) is cut into this rank's shards;
                # one of other shapes is refused while the module still holds
                # its weights.
                def take_state():
                    self._take_state_shapes()
                    self.updates.ensure_state(self._variant.placement, like=self.shards.shards)
                agreed(take_state, self.process_group)
        except BaseException:
            if self.shards is not None:
                self.shards.unbuild()  # a module given on the meta device: as given
            raise
        if self.shards is not None:
            self.shards.built()
            self.shards.release()
        self.report = dict(self._variant.report)

    def _join_ranks(self, model, measure_link_, sharded):
        """The ranks' start together: rank 0's weights (and, not `sharded`,
        its optimizer's state) on every rank, the link measured where
        `measure_link_`, and the board of the step's failures."""
        # Rank 0's weights, as DDP starts (a module on the meta device: those
        # given on the device; the build sends the others a module at a time),
        # and its optimizer's state: a step that failed on some rank may have
        # updated it on the others only.
        broadcast_module(model, self.process_group)
        # (a sharded state is each rank's own, but a whole one: cut later)
        if self.updates is not None and (not sharded or holds_whole_state(
                self.updates, _world_size(self.process_group))):
            broadcast_optimizer_state(self.updates.optimizer, self.process_group)
        if measure_link_:  # Note [One plan on every rank]: rank 0's
            self.network = same_on_every_rank(
                measure_link(self.process_group, self.device), self.process_group)
            self.network_measured = self.network is not None
        # The board of this step's failures (Note [A rank that fails
        # mid-step]), named by rank 0, and numbered as rank 0 made its steps
        # (the ranks' calls name the step they run).
        if _world_size(self.process_group) > 1:
            number, name = same_on_every_rank((next(_DISTRIBUTED_STEPS_MADE), uuid.uuid4().hex),
                                              self.process_group, "the step's name")
            self.collectives = StepCollectives(self.process_group, self.device, name,
                                               f"train_step #{number}")

    def _take_arguments(self, model, loss_fn, example_inputs, example_target, shard, param_init,
                        options, calibrate, measure, allow_cpu_offload, optimizer,
                        optimizer_state, optimizer_updates, optimizer_gradients,
                        optimizer_parameters, max_grad_norm, grad_norm_type):
        """This rank's own checks of train_step's arguments, and the step's
        fields they make: (the inputs as a tuple, optimizer_gradients
        resolved). Raises what it refuses."""
        _check_shard(shard, self.process_group)
        if not isinstance(model, torch.nn.Module):
            raise TypeError("model must be a torch.nn.Module, not "
                            f"{type(model).__name__}")
        for name, module in model.named_modules():
            if isinstance(module, torch.jit.ScriptModule):
                label = name or getattr(model, "original_name", type(model).__name__)
                raise TypeError(f"module {label!r} is a TorchScript "
                                "module (torch.jit.script or torch.jit.trace), whose code a "
                                "trace cannot look into: give the Python module it was made "
                                "from")
            _refuse_parallel_wrapper(name, module)
        meta = on_meta(model)
        if meta and shard != "full":
            raise ValueError(f"module {type(model).__name__} is on the meta device: only "
                             "a sharded step builds it (shard='full', each rank a module "
                             "at a time); otherwise make it on the device")
        if param_init is not None and not (meta and callable(param_init)):
            raise ValueError("param_init initialises a module given on the meta device: "
                             "a callable param_init(module), with a module on the meta "
                             "device")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, not {type(loss_fn).__name__}")
        if measure not in ("first", "always", "never"):
            raise ValueError("measure must be 'first', 'always' or 'never', not "
                             f"{measure!r}")
        _check_plan_options(options)
        self.model = model
        self.loss_fn = loss_fn
        self.options = options
        self.calibrate = calibrate
        self.measure_mode = measure
        self.allow_cpu_offload = allow_cpu_offload
        optimizer_gradients = _checked_sharding(shard, optimizer, optimizer_state,
                                                optimizer_updates, optimizer_gradients,
                                                optimizer_parameters)
        if optimizer is None and (optimizer_state is not None or
                                  optimizer_updates != "device" or
                                  optimizer_gradients != "keep"):
            raise ValueError("optimizer_state, optimizer_updates and optimizer_gradients "
                             "place the optimizer's state, updates and gradients: give the "
                             "optimizer too")
        if max_grad_norm is not None and optimizer is None:
            raise ValueError("max_grad_norm clips the gradients before the optimizer's "
                             "updates in the plan: give the optimizer too (without it, "
                             "clip after the step as usual, before optimizer.step())")
        if max_grad_norm is None and grad_norm_type != 2.0:
            raise ValueError("grad_norm_type is the norm that max_grad_norm bounds: give "
                             "max_grad_norm too")
        self.updates = (Updates(optimizer, model, optimizer_state, optimizer_updates,
                                optimizer_gradients, optimizer_parameters, max_grad_norm,
                                grad_norm_type)
                        if optimizer is not None else None)
        # (a parameter added later, frozen or not, is told apart from one
        # unfrozen: _check_trainable)
        self._parameter_names = frozenset(name for name, _ in model.named_parameters())
        inputs = _as_tuple(example_inputs, "example_inputs")
        for k, t in enumerate(inputs):
            _check_tensor_arg(t, f"example input {k}")
        _check_tensor_arg(example_target, "example_target")
        _refuse_uninitialized(model)
        drawn = python_randomness(model)
        if drawn:
            warnings.warn(f"pebble.torch: {', '.join(drawn)} draws with Python's or NumPy's "
                          "random numbers, which a trace runs once: every step takes the draw "
                          "of its capture (a LayerDrop that skips a layer skips it at every "
                          "step). Draw with torch and use the draw as a tensor "
                          "(keep = (torch.rand(()) >= p).to(x.dtype); x = x + keep * layer(x)), "
                          "which the plan draws again each step (a Python `if` on a tensor "
                          "cannot be traced)", stacklevel=4)
        self.device = _device_of(model, inputs + (example_target,))  # (meta: the inputs')
        if self.updates is not None:
            self.updates.device = self.device
        for name, value in (("optimizer_state", optimizer_state),
                            ("optimizer_updates", optimizer_updates),
                            ("optimizer_parameters", optimizer_parameters)):
            if value in ("host", "auto") and self.device.type == "cpu" and \
                    not allow_cpu_offload:
                raise ValueError(f"{name}={value!r} saves no memory on the CPU device: "
                                 "give allow_cpu_offload=True to run it anyway (to test "
                                 "the path)")
        return inputs, optimizer_gradients

    def _check_trainable(self):
        """ValueError where a parameter became trainable after the step was
        made with its optimizer, whose updates the plan has for the
        parameters trainable then (freezing one later is fine, but for a
        sharded step, whose shards are of those parameters)."""
        if self.updates is None:
            return
        current = dict(self.model.named_parameters())
        replaced = [n for n, p in self.updates.params.items()
                    if n in current and current[n] is not p and self.shards is None]
        if replaced:
            raise ValueError(f"parameter '{replaced[0]}' is not the tensor that the optimizer "
                             "holds under that name (a layer replaced after the step was made?): "
                             "eager's optimizer.step() would leave the new one as it is, and the "
                             "plan updates the parameters of the optimizer the step was made "
                             "with: give the new parameters to an optimizer and make a new "
                             "train_step")
        trainable = [n for n, p in current.items() if p.requires_grad]
        added = [n for n in trainable if n not in self.updates.params]
        new = [n for n in added if n not in self._parameter_names]
        if new:
            # (torch.nn.utils.prune renames a weight 'weight_orig', the same tensor)
            renamed = [n for n, p in self.updates.params.items() if p is current[new[0]]]
            if renamed:
                raise ValueError(f"parameter '{renamed[0]}' is now named '{new[0]}' (pruning "
                                 "with torch.nn.utils.prune renames it, and computes "
                                 f"'{renamed[0]}' from it and a mask at each call): the step's "
                                 "plan has the module as it was; make a new train_step")
            held = any(p is current[new[0]] for group in self.updates.optimizer.param_groups
                       for p in group["params"])
            raise ValueError(f"parameter '{new[0]}' was added to the module after the step "
                             "was made" + (" (and to its optimizer, add_param_group?)" if held
                                           else "") +
                             ": the step's plan has neither its uses nor its update; make a "
                             "new train_step")
        if added:
            raise ValueError(f"parameter '{added[0]}' became trainable (requires_grad) after "
                             "the step was made with its optimizer, whose updates it plans for "
                             "the parameters trainable then: make a new train_step")
        if self.shards is not None and set(trainable) != set(self.shards.params):
            raise ValueError("the module's trainable parameters changed since the sharded step "
                             "was made (requires_grad): make a new train_step")

    def full_state_dict(self):
        """The module's state_dict, every parameter whole, as copies. Sharded
        (shard="full"), it gathers the parameters, on every rank: call it on
        every rank together."""
        if self.shards is not None:
            return self._gathered("full_state_dict()",
                                  lambda: self.shards.full_state_dict(self.collectives))
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def full_optimizer_state_dict(self):
        """The optimizer's state_dict() with every state tensor whole (the
        parameter's shape) and a copy on the CPU: what an optimizer of the
        whole module loads, and a step on any number of ranks takes, sharded
        or not. Sharded (shard="full"), it gathers the state's shards one
        tensor at a time, on every rank: call it on every rank together."""
        if self.updates is None:
            raise ValueError("this step has no optimizer in its plan (train_step(..., "
                             "optimizer=...)): save your optimizer's own state_dict()")
        optimizer = self.updates.optimizer
        if self.shards is not None:
            return self._gathered("full_optimizer_state_dict()",
                                  lambda: self.shards.full_optimizer_state_dict(
                                      optimizer, self.updates.state_keys, self.collectives),
                                  self._state_refusal)
        refusal = self._state_refusal()
        if refusal is not None:
            raise refusal
        return state_dict_on_cpu(optimizer)

    @contextlib.contextmanager
    def whole_parameters(self):
        """A block in which the module's parameters are whole, for writes
        between steps (a weight clamped, an nn.init call), as
        `with torch.no_grad(), step.whole_parameters(): ...`. Sharded
        (shard="full"), it gathers them on every rank together and keeps
        what the block writes in this rank's shards afterwards; a block that
        raises keeps nothing (Note [Writes between sharded steps]).
        Unsharded, the parameters are whole already: it does nothing."""
        if self.shards is None:
            yield self.model
            return
        self._gathered("whole_parameters()", lambda: self.shards.make_whole(self.collectives))
        try:
            yield self.model
        except BaseException:
            self.shards.release()
            raise
        self.shards.keep_written()

    def _written_shards_refusal(self):
        """A ValueError naming a parameter written between sharded steps
        outside whole_parameters(), or None; the stand-ins are released
        again, so that the next call runs without the write (Note [Writes
        between sharded steps])."""
        name = self.shards.written_while_released() if self.shards is not None else None
        if name is None:
            return None
        self.shards.release()
        return ValueError(
            f"parameter '{name}' was written between steps (in place, as clamp_ or an "
            "nn.init call, or given new .data), but a sharded step's module holds empty "
            "stand-ins there: its shards, which the step holds, are what trains, so the write "
            "reached none and was dropped. Write inside `with torch.no_grad(), "
            "step.whole_parameters():`, which gathers the parameters whole on every rank and "
            "keeps what the block writes in the shards")

    def _gathered(self, call, work, refusal=lambda: None):
        """work()'s value, run on every rank together (`call`: its name for
        the call's check; `refusal()`: this rank's refusal of it, or None);
        a failure on one rank fails every rank, leaving the shards as they
        are."""
        check_same_collective(self._labelled(call), self.process_group,
                              self._shared_refusal() or refusal())
        try:
            return self.collectives.together(work)
        except BaseException as e:
            if not self.collectives.in_step:
                self._failure.record(e, in_step=False)
            raise

    def _labelled(self, call):
        """`call` ("replan()", say) as the ranks compare it: of which step
        (train_step #2's replan())."""
        if self.collectives is None:
            return call
        return self.collectives.label if call == "the step" else \
            f"{self.collectives.label}'s {call}"

    def replan(self, policy=None, budget="100%", **options):
        """A TrainStep of the same module and loss under another plan, sharing
        this one's captures (nothing is traced or calibrated again). Options
        not given are this step's."""
        new = object.__new__(TrainStep)
        new.__dict__.update(self.__dict__)
        new.options = dict(self.options, policy=policy, budget=budget)
        refused = None
        try:
            for key in ("host_budget", "bandwidth", "time_limit", "seed", "milp_max_stages"):
                if key in options:
                    new.options[key] = options.pop(key)
            _check_plan_options(new.options)
            for key in ("measure", "allow_cpu_offload"):
                if key in options:
                    setattr(new, "measure_mode" if key == "measure" else key,
                            options.pop(key))
            # train_step's other options: its captures, calibrations, host
            # buffers and collectives are made for them (a host update's rate
            # is measured at capture).
            fixed = [k for k in options if k in _step_parameters()]
            if fixed:
                raise TypeError(f"replan() takes the plan's options only; {', '.join(fixed)} "
                                f"{'is' if len(fixed) == 1 else 'are'} the step's own, fixed "
                                "at train_step: make a new train_step with "
                                f"{'it' if len(fixed) == 1 else 'them'}")
            if options:
                raise TypeError(f"replan() got unexpected arguments: {', '.join(options)}")
        except (TypeError, ValueError) as e:
            refused = e
        if self.process_group is not None:  # (its plan is rank 0's: every rank plans)
            check_same_collective(self._labelled("replan()"), self.process_group,
                                  self._shared_refusal() or refused)
        elif refused is not None:
            raise refused
        new._variants, new._run_once, new._shapes_dropped = {}, [], 0
        if self.collectives is not None:
            new.collectives = self.collectives.derive()
        key = self._variant.key
        new._variant = new._variants[key] = _Variant(new, self._variant.capture)
        new.report = dict(new._variant.report)
        return new

    # --- variants: one capture and plan per shapes -----------------------------

    def _signature(self, inputs, target):
        # The layouts too, the inputs' and the parameters' (a sharded step
        # gathers its own): a capture's views read their strides (a
        # channels-last image flattened in the contiguous order is another
        # tensor), and kernels given a strided, expanded or channels-last
        # tensor make other temporaries.
        tensors = tuple((tuple(t.shape), t.dtype, t.device, _layout(t))
                        for t in inputs + (target,))
        if self.shards is None:
            # (whole strides: a 1x1 kernel made channels-last differs only in
            # those of its dims of size 1, and makes channels-last outputs;
            # and dtypes: a module made .double() between calls is captured
            # again, as it was only where its inputs' dtype changed too)
            tensors += tuple((p.dtype, tuple(p.stride())) for p in self.model.parameters())
        # (a trace under torch.autocast records its casts: the step then runs
        # in the dtypes eager's autocast would pick)
        tensors += (("autocast", autocast_state(self.device.type)),)
        accumulate = frozenset(name for name, p in self.model.named_parameters()
                               if p.requires_grad and p.grad is not None)
        trainable = frozenset(name for name, p in self.model.named_parameters()
                              if p.requires_grad)
        return tensors, accumulate, trainable, ModuleSettings(self.model, self.loss_fn)

    def _variant_for(self, inputs, target, key=None):
        """The variant of these inputs' shapes and layouts (`key`: their
        _signature, where the caller has it), captured and planned where new."""
        key = key if key is not None else self._signature(inputs, target)
        variant = self._variants.get(key)
        if self._stale(variant):
            variant = None
        if variant is not None:
            # The most recently called last, under every signature that
            # finds it (_find_under_settings_left's too).
            for k in [k for k, v in self._variants.items() if v is variant]:
                self._variants[k] = self._variants.pop(k)
            return variant
        capture = self._captures.get(key)
        if self.process_group is not None and \
                any_rank(capture is None, self.process_group, "comparing the ranks' captures"):
            self._captures.pop(key, None)  # (every rank captures)
            capture = None
        if capture is None:
            self._warn_of_settings_changed(key)
            self._parameters_on_device()
            capture = self._captures[key] = _Capture(self, inputs, target, key)
            capture.number = next(self._capture_numbers)
            self._warn_of_trained_values_read(capture)
        variant = self._variants[key] = _Variant(self, capture)
        self._find_under_settings_left(key, variant)
        self._keep_at_most(self.max_shapes)
        return variant

    def _stale(self, variant):
        """Whether `variant` (None: none found) is to be captured and planned
        again, dropped where found. Where the values that its graph holds as
        constants changed since its capture (_values_changed), with a warning
        naming them. On several ranks, every rank captures where one does, as
        a capture's and a plan's collectives are every rank's: where a rank
        finds no variant (a setting of its own changed, such as a
        configuration object's: _Local), or one whose values changed, or
        where the ranks found captures of other numbers (a rank whose own
        setting changed back finds its earlier capture, the others the one
        made since)."""
        changed = self._values_changed(variant) if variant is not None else []
        if self.process_group is not None:
            stale = any_rank_or_differing(variant is None or changed,
                                          variant.capture.number if variant is not None else -1,
                                          self.process_group, "comparing the ranks' captures")
        else:
            stale = variant is None or bool(changed)
        if variant is not None and stale:
            self._drop(variant)
        if changed:
            warnings.warn(f"pebble.torch: {', '.join(changed[:3])}, which the step holds as "
                          "constants (a value read in Python with .item(), .tolist(), int(), "
                          "float() or bool(), a tensor in an attribute that is no buffer), "
                          "changed since its "
                          "capture: captured and planned again. What changes at every step "
                          "is better a buffer updated in place, or read with tensor "
                          "operations", stacklevel=_outside_pebble())
        return stale

    def _values_changed(self, variant):
        """What `variant`'s graph holds as constants and has changed since its
        capture: the values of a parameter or buffer that the trace read in
        Python (Note [State values read in Python]), a tensor in a plain
        attribute that it reads bound anew (Note [Tensors in plain
        attributes]). Their names; on several ranks, this rank's (the ranks'
        captures, hence what they read, are the same)."""
        capture = variant.capture
        if not capture.state_read and not capture.plain_read:
            return []
        state = _state_tensors(self.model)
        changed = [name for name, value in capture.state_read
                   if name not in state or state[name].shape != value.shape or
                   not _same_values(state[name].detach().to(value.device), value)]
        return changed + [f"{label} (bound anew)" for label, get, tensor in capture.plain_read
                          if get() is not tensor]

    def _warn_of_trained_values_read(self, capture):
        """Once a step: a UserWarning where the trace read in Python the
        values of a trainable parameter, which each update changes (Note
        [State values read in Python]): every call then captures again."""
        trainable = {name for name, p in self.model.named_parameters() if p.requires_grad}
        read = [name for name, _ in capture.state_read if name in trainable]
        if read and not self._warned_of_trained_reads:
            self._warned_of_trained_reads = True
            warnings.warn(f"pebble.torch: the step reads the values of {', '.join(read[:3])} in "
                          "Python (.item(), .tolist(), int(), float(), bool()), a parameter "
                          "that training changes: each call after an update captures and "
                          "plans the step again. "
                          "Compute with the tensor instead", stacklevel=_outside_pebble())

    def _drop(self, variant):
        """Forgets `variant` and its capture, under every signature that
        finds them."""
        for key in [k for k, v in self._variants.items() if v is variant]:
            del self._variants[key]
        for key in [k for k, c in self._captures.items() if c is variant.capture]:
            del self._captures[key]
        if variant in self._run_once:
            self._run_once.remove(variant)

    def _keep_at_most(self, count):
        """Drops the least recently called variants (every signature that
        finds one, its capture and its program's host copies) until `count`
        are left (max_shapes; None: no bound). Every rank makes the same
        calls, so every rank drops the same."""
        dropped = False
        while count is not None and len({id(v) for v in self._variants.values()}) > count:
            dropped = True
            self._drop(next(iter(self._variants.values())))
            self._shapes_dropped += 1
            if self._shapes_dropped == 1:
                warnings.warn(
                    f"pebble.torch: more than max_shapes={count} signatures (input shapes, "
                    "layouts, modes, ...) called: the least recently called capture and "
                    "plan is dropped, and made again if it comes back. Pad inputs to a few "
                    "lengths, or raise max_shapes", stacklevel=4)
        if dropped:
            # (a program and its variant refer to each other: their host
            # copies and a capture's real tensors go now, not at the
            # collector's leisure)
            gc.collect()

    def _warn_of_settings_changed(self, key):
        """A capture that only the module's settings call for (Note [What a
        trace reads from the module]) costs a trace and a plan: a warning
        names what changed, so that an attribute set at every step (an
        iteration counter on the module) shows as the cause. A change of
        training modes alone is expected, and silent."""
        before = next((k[-1] for k in reversed(self._captures) if k[:-1] == key[:-1]), None)
        if before is None:
            return
        changes = key[-1].changes_from(before)
        # (train and eval modes are expected to alternate: each is captured once)
        # ("loss_fn:self.fc.training: True -> False": a name may hold a colon)
        attributes = [change.partition(": ")[0] for change in changes]
        if any(a != "training" and not a.endswith(".training") for a in attributes):
            shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more"
                                              if len(changes) > 3 else "")
            warnings.warn(f"pebble.torch: the module or the loss changed since its last "
                          f"capture ({shown}): captured and planned again. An attribute that "
                          "changes at every step is better a buffer or an input",
                          stacklevel=4)

    def _find_under_settings_left(self, key, variant):
        """A forward that changes its module's own attributes (a Python
        counter) changed them as it was traced, and again where the first run
        measures the unplanned step (Note [What a trace reads from the
        module]): the next calls find `variant` (of signature `key`) under the
        settings they left."""
        after = key[:-1] + (ModuleSettings(self.model, self.loss_fn),)
        if after != key:
            self._captures.setdefault(after, variant.capture)
            self._variants.setdefault(after, variant)
            # (a value the forward reads after changing it, such as a warm-up
            # by call count, is frozen at the trace's: docs/torch.md, "Python
            # state")
            changes = after[-1].changes_from(key[-1])
            who = ("loss_fn" if changes and all(c.startswith("loss_fn") for c in changes)
                   else f"the forward of {type(self.model).__name__}")
            warnings.warn(
                f"{who} changes Python state as it runs "
                f"({'; '.join(changes[:3])}): a traced step runs no Python, so every call "
                "computes with the values the trace saw, where eager's calls see each "
                "other's changes. Where the forward reads such a value (a warm-up by call "
                "count), keep it in a buffer updated in place, or set it between steps",
                UserWarning, stacklevel=3)

    @property
    def parameters_may_live_on_host(self):
        """Whether a plan may keep whole parameters on the host between steps
        (optimizer_parameters "host" or "auto", unsharded)."""
        return self.updates is not None and self.updates.parameters != "device" and \
            self.shards is None

    def _parameters_on_device(self):
        """A capture reads the module's parameters on the device: those that a
        plan keeps on the host (optimizer_parameters) come back whole, until
        a step's plan places them again."""
        if not self.parameters_may_live_on_host:
            return
        with torch.no_grad():
            for param in self.updates.params.values():
                if param.device != self.device:
                    param.data = param.data.to(self.device)

    # --- one step -------------------------------------------------------------

    def _argument_refusal(self, args):
        """This rank's refusal of a call's arguments (or of grad mode), or
        None: raised at once on one rank, shared by every rank on several
        (Note [One plan on every rank]: a rank refused alone would leave
        the others to pair this call's collectives with its next call's)."""
        try:
            if len(args) < 2:
                raise TypeError("the step takes the input(s) and the target")
            _check_grad_mode("the step was called")
            for k, t in enumerate(args[:-1]):
                _check_tensor_arg(t, f"input {k}")
            _check_tensor_arg(args[-1], "the target")
            for t in args:
                if t.device != self.device:
                    raise ValueError(f"an input is on {t.device}; the module is on "
                                     f"{self.device}")
        except (TypeError, ValueError, RuntimeError) as e:
            return e
        return None

    def __call__(self, *args):
        """step(*inputs, target) -> the loss; every parameter's .grad set."""
        return self._call(args)

    def memory_timeline(self, *args):
        """loss, timeline = step.memory_timeline(*inputs, target): one step,
        as step(*inputs, target) runs it (the loss, .grad, the plan's
        optimizer updates), and the memory after each step of its plan,
        measured against predicted.

        The timeline is a list with one dict per step of the plan: "step" (its
        index), "action" and "node" (as in step.schedule), "predicted_bytes"
        (the simulator's) and "measured_bytes" (the allocator's: on the CPU
        from the profiler's memory events, on a GPU memory_allocated), each
        above the memory held when the step began, as report's
        measured_peak_bytes is. A measured level above the predicted one is
        memory that the plan frees and PyTorch still holds.

        One process only; on the CPU it cannot run inside another profiler's
        block. Each step of the plan allocates and frees a small mark
        (MARK_BYTES) that the peak leaves out: slower than a step."""
        if self.process_group is not None:
            raise ValueError("memory_timeline measures one process's step: it is not taken in "
                             "a process group (each rank's step() reports its own peak)")
        if self.device.type == "cpu" and torch.autograd._profiler_enabled():
            raise ValueError("memory_timeline reads the CPU profiler's memory events, and "
                             "another profiler is running (one runs at a time): call it "
                             "outside the profiler's block")
        timeline = []
        loss = self._call(args, timeline)
        return loss, timeline

    def _call(self, args, timeline=None):
        """One step (__call__); `timeline`, a list that gets its memory
        timeline (memory_timeline), in one process."""
        refused = self._argument_refusal(args)
        if refused is not None and self.process_group is None:
            raise refused
        *inputs, target = args if refused is None else (None,)
        inputs = tuple(inputs)
        if self.process_group is None:
            self._check_trainable()
            refusal = self._hook_refusal() or self._state_refusal()
            if refusal is not None:
                raise refusal
            key = self._signature(inputs, target)
            variant = self._variant_for(inputs, target, key)
            refusal = self._unapplied_grad_refusal(variant)
            if refusal is not None:
                raise refusal
            loss = variant.run(inputs, target, timeline)
        else:  # Note [One plan on every rank]
            # Each of these fails on every rank alike, which leaves the ranks
            # in step: other calls on some rank (or other optimizer
            # settings), a state the step cannot take, a capture or plan
            # that fails.
            key = self._signature(inputs, target) if refused is None else (None,) * 4
            check_same_call({"shapes, dtypes or layouts": key[0], "gradients held": key[1],
                             "trainable parameters": key[2],
                             "module settings (modes, attributes such as a dropout's p, "
                             "hooks)": key[3],
                             "optimizer settings (a learning rate, say)":
                             _optimizer_settings(self.updates and self.updates.optimizer)},
                            self.process_group,
                            refused or self._shared_refusal() or self._hook_refusal() or
                            self._written_shards_refusal() or
                            self._state_refusal() or self._unapplied_grad_refusal(
                                self._variants.get(key, self._variant)),
                            shown={"shapes, dtypes or layouts":
                                   _described_call(inputs, target, key[0])
                                   if refused is None else None},
                            step=self._labelled("the step"),
                            described={"module settings (modes, attributes such as a "
                                       "dropout's p, hooks)": key[3].entries}
                            if refused is None else None)
            self._check_trainable()  # (every rank alike: the signature holds them)
            variant = self._variant_for(inputs, target, key)
            try:
                loss = variant.run(inputs, target)
            except BaseException as e:
                self._failure.record(e, in_step=self._in_step())
                raise
        if variant not in self._run_once:
            self._run_once.append(variant)
            self._find_under_settings_left(key, variant)
        self._variant = variant
        self.report = dict(variant.report)
        self.report["shapes_planned"] = len({id(v) for v in self._variants.values()})
        self.report["shapes_dropped"] = self._shapes_dropped
        return loss

    def _take_state_shapes(self):
        """The optimizer's state in the shapes the step keeps it (a whole state
        loaded into a sharded step's optimizer: cut into this rank's shards);
        OptimizerError for an entry it cannot take (a state saved by a step
        sharded otherwise)."""
        if self.updates is not None:
            self.updates.take_state_shapes(like=self.shards and self.shards.shards,
                                           cut=self.shards and self.shards.cut_state)

    def _state_refusal(self):
        """_take_state_shapes' error, or None: a call refused so changes
        nothing, and the step stays usable once a right state is loaded."""
        try:
            self._take_state_shapes()
        except OptimizerError as e:
            return e
        return None

    def _hook_refusal(self):
        """A ValueError naming a trainable parameter with a gradient hook, or
        None: the step differentiates its own graph, where a hook on the
        parameter (register_hook, or 2.x's post-accumulate hook) would not
        run, and the gradients would silently differ from eager's."""
        for name, p in self.model.named_parameters():
            if p.requires_grad and (p._backward_hooks or
                                    getattr(p, "_post_accumulate_grad_hooks", None)):
                return ValueError(
                    f"parameter '{name}' has a gradient hook (register_hook): the step "
                    "computes gradients in its own graph, where the hook would not run; "
                    "remove it (its handle's remove()) to train with this step")
        return None

    def _unapplied_grad_refusal(self, variant):
        """An OptimizerError naming a parameter of the optimizer that the
        step does not update in `variant`'s plan (frozen, or the loss does
        not reach it) but that holds a .grad (set by hand, or left by eager
        training), or None: optimizer.step() applies any .grad there is,
        whatever requires_grad says, where the plan has no update. On
        several ranks the variant is the one these shapes had, else the
        last run's (the reach does not depend on the shapes); None checks
        nothing."""
        if self.updates is None or variant is None or variant.placement is None:
            return None
        names = None  # (made once a .grad is found: each call runs this)
        for group in self.updates.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                names = names or {q: name for name, q in self.model.named_parameters()}
                name = names.get(p)
                if name is None or name in variant.placement.updated_parameters:
                    continue
                why = "it is frozen" if not p.requires_grad else "the loss does not reach it"
                return OptimizerError(
                    f"parameter '{name}' has a .grad, but the step does not update it ({why}), "
                    "where optimizer.step() would apply that .grad: set it to None "
                    "(optimizer.zero_grad(set_to_none=True)) to train with this step")
        return None

    def _in_step(self):
        """Whether the ranks' collectives are known to be in step after the
        last run (Note [A rank that fails mid-step])."""
        return self.collectives is not None and self.collectives.in_step

    def _shared_refusal(self):
        """The refusal of a call after a failed step (None: no step failed),
        which the call's check shares with the other ranks. Where the ranks'
        collectives may be out of step (Note [A rank that fails mid-step]),
        that check would pair with them: it is raised here, on this rank
        alone."""
        why = out_of_step(self.process_group)
        if why is not None:  # (another step's failure; a collective would pair wrongly)
            raise PlanExecutionError(
                f"this process group's collectives are out of step since a step failed "
                f"({why.splitlines()[0]}): make a new process group and train_step")
        if self._failure.why is None:
            return None
        in_step = self._failure.in_step
        error = PlanExecutionError(
            f"an earlier step failed ({self._failure.why}), " +
            ("after which the module may differ between the ranks: make a new train_step on "
             "this process group" if in_step else
             "which may leave the process group's collectives out of step: make a new process "
             "group and train_step") + " (a module this step shards: from a checkpoint)")
        if not in_step:
            raise error
        return error

    @property
    def plan(self):
        """The pebble.Plan of the shapes of the last call (in a process group,
        rank 0's on every rank: the same fields)."""
        return self._variant.plan

    @property
    def graph(self):
        """The captured training graph (a pebble.Graph) of the last call's shapes."""
        return self._variant.graph

    @property
    def schedule(self):
        """The plan's steps, (action, node id) pairs."""
        return self._variant.plan.schedule

    def __repr__(self):
        r = self.report
        return (f"<pebble.torch.TrainStep {type(self.model).__name__}: {r['policy']}, "
                f"predicted peak {r['predicted_peak_bytes']} of {r['budget_bytes']} bytes>")


class _Capture:
    """The captured graph of one signature (shapes, dtypes, which parameters
    accumulate into an existing .grad, training mode), calibrated."""

    def __init__(self, step, inputs, target, key):
        started = time.perf_counter()
        self.key = key
        self.number = None  # TrainStep._variant_for's, the same on every rank
        self.state_read = []  # (name, value): Note [State values read in Python]
        self.plain_read = []  # (label, get, tensor): Note [Tensors in plain attributes]
        self.device = step.device
        self.model = step.model
        group = step.process_group
        if group is None:
            cal = self._capture(step, inputs, target, key, mode=None)
            if cal is None:
                cal = self._capture(step, inputs, target, key, mode="real")
        else:  # Note [One plan on every rank]: a failure on one rank stops every rank
            cal = agreed(lambda: self._capture(step, inputs, target, key, mode=None), group)
            # (a rank whose capture disagrees with a kernel makes every rank
            # trace on real tensors: the ranks' graphs must be one)
            if any_rank(cal is None, group, "comparing the ranks' captures"):
                cal = agreed(lambda: self._capture(step, inputs, target, key, mode="real"),
                             group)
            # (Calibration measures each node's temporaries and the storage
            # its kernel's output holds.)
            cal.costs, cal.unplanned_peak_bytes, cal.source, measured = same_on_every_rank(
                (cal.costs, cal.unplanned_peak_bytes, cal.source,
                 [(n.temporary_bytes, n.nbytes) for n in self.nodes.nodes]),
                step.process_group)
            for node, (temporary, nbytes) in zip(self.nodes.nodes, measured):
                node.temporary_bytes, node.nbytes = temporary, nbytes
        self.calibration = cal
        name = type(step.model).__name__
        self.document = self.nodes.document(cal.costs, name)
        self.graph = _core.from_json(json.dumps(self.document))
        # Note [Random calls in eager's order]: planned first without tokens.
        self.free_graph = self.graph
        if self.nodes.has_order_tokens:
            self.free_graph = _core.from_json(json.dumps(
                self.nodes.document(cal.costs, name, order_tokens=False)))
        self.persistent_bytes = sum(n.nbytes for n in self.nodes.nodes
                                    if n.kind == "persistent")
        self.setup_s = time.perf_counter() - started

    def _capture(self, step, inputs, target, key, mode):
        """This rank's part: the trace, its graph and its calibration; traced
        as `mode` says (trace's mode; "real": the values too are real ones).
        None where the fake values disagree with a kernel, to be captured
        again with mode "real"."""
        # A real trace runs the forward on the module's own parameters: one
        # it writes in place (a momentum encoder) is refused after the write.
        versions = [(name, p, p._version) for name, p in step.model.named_parameters()]
        try:
            return self._capture_traced(step, inputs, target, key, mode)
        except CaptureError as e:
            written = [name for name, p, version in versions if p._version != version]
            if not written:
                raise
            raise CaptureError(f"{e} (the capture ran the forward on the module's own "
                               f"parameters, and has written {', '.join(written[:3])} already: "
                               "load their values again before you go on)") from e
        except CapturedValueMismatch:
            # Note [Fake tensors that disagree with a kernel]: PyTorch 1.13's
            # fake torch.arange(5.) is int64 where the kernel makes float32,
            # and its fake _ctc_loss has another shape than the kernel's. The
            # calibration's real run finds such a node; the step is then
            # traced on real tensors, and its values are the kernels' own.
            if step.shards is not None or not step.calibrate or self.shapes_from != "fake":
                raise
            return None

    def _capture_traced(self, step, inputs, target, key, mode):
        """_capture, raising CapturedValueMismatch where calibration finds it."""
        started = time.perf_counter()
        # A sharded module's parameters are traced as stand-ins, and its
        # step calibrated under FSDP's rule: no rank holds them all whole
        # (Note [Stand-ins for sharded parameters], Note [Calibrating a
        # sharded step]).
        shards = step.shards
        traced = trace(step.model, step.loss_fn, inputs, target, self.device, mode=mode,
                       stand_ins=shards.shapes if shards is not None else None,
                       # (a sharded step clips its shards: Note [Clipping sharded
                       # gradients] in _sharding.py)
                       max_grad_norm=(step.updates.max_grad_norm
                                      if step.updates is not None and shards is None else None),
                       norm_type=(step.updates.grad_norm_type if step.updates is not None
                                  else 2.0),
                       ranks=_world_size(step.process_group)
                       if step.process_group is not None and shards is None else 1,
                       accumulating=key[1])
        values, self.shapes_from = propagate(traced, self.device, fake=mode != "real")
        self.traced_with = traced.mode
        # Note [State values read in Python]: what the trace read, as it is now.
        state = _state_tensors(step.model)
        self.state_read = [(traced.slots[k].id, state[traced.slots[k].id].detach().clone())
                           for k in traced.state_read if traced.slots[k].id in state]
        self.plain_read = traced.plain_read
        self.nodes = StepGraph(traced, values, accumulate=_slot_ids(traced, key[1]),
                               round_to=512 if self.device.type == "cuda" else 1,
                               device=self.device)
        self.capture_s = time.perf_counter() - started
        if shards is not None:
            graded = {n.id[len("grad:"):] for n in self.nodes.nodes if n.id.startswith("grad:")}
            missing = sorted(set(shards.params) - graded)
            if missing:
                raise PlanError(f"parameter '{missing[0]}' is trainable but the step reads it "
                                "without a gradient (or not at all): freeze it "
                                "(requires_grad=False) to train with shard='full'")
        if step.calibrate and shards is not None:
            return calibrate_sharded(self.nodes, self.device,
                                     self.persistent(inputs, target, sharded=shards.params),
                                     shards)
        if step.calibrate:
            try:
                return calibrate(self.nodes, self.device, self.persistent(inputs, target))
            except CapturedValueMismatch:
                raise
            except PlanExecutionError as e:  # (a kernel's failure: eager's too?)
                eager = eager_failure_message(step.model, step.loss_fn, inputs, target,
                                              self.device)
                if eager is None:
                    raise
                raise CaptureError(f"{eager}; in the step: {e}") from e
        return estimated(self.nodes, "calibrate=False")

    def persistent(self, inputs, target, sharded=()):
        """node index -> tensor of every persistent node, from the module now;
        but the parameters named in `sharded`, which the plan gathers."""
        out = {}
        for node in self.nodes.nodes:
            if node.kind != "persistent" or (node.role == "parameter" and
                                             node.slot.names[0] in sharded):
                continue
            if node.constant is not None:
                out[node.index] = node.constant.to(self.device)
                continue
            slot = node.slot
            if node.role == "gradient":
                tensor = _lookup(self.model, slot.names[0]).grad
            elif slot.kind in ("parameter", "buffer"):
                tensor = _lookup(self.model, slot.names[0])
            elif slot.kind == "input":
                tensor = inputs[slot.index]
            else:
                tensor = target
            if tensor is None:
                raise ValueError(f"the module has no '{slot.names[0]}' any more; make a new "
                                 "train_step")
            v = node.value
            if node.role == "gradient" and (tuple(tensor.shape) != tuple(v.shape) or
                                            tensor.dtype != v.dtype):
                # (a .grad of another dtype, set through .grad.data, say)
                raise ValueError(f"'{node.id}' is {tuple(tensor.shape)} {tensor.dtype}, where "
                                 f"the step adds a gradient of {tuple(v.shape)} {v.dtype}, its "
                                 "parameter's, into it: give it the parameter's dtype, or set "
                                 "it to None (optimizer.zero_grad(set_to_none=True)) before "
                                 "the step")
            if tuple(tensor.shape) != tuple(v.shape) or tensor.dtype != v.dtype:
                raise ValueError(f"'{node.id}' is {tuple(tensor.shape)} {tensor.dtype}; the "
                                 f"plan was made for {tuple(v.shape)} {v.dtype} (make a new "
                                 "train_step after changing the module)")
            out[node.index] = tensor.detach()
        return out


class _Variant:
    """A capture planned under one step's policy and budget."""

    def __init__(self, step, capture):
        started = time.perf_counter()
        self.step = step
        self.capture = capture
        self.key = capture.key
        self.device = capture.device
        self.graph_nodes = capture.nodes
        self.updates = step.updates
        group = step.process_group
        if group is None:
            self._prepare(step, capture)
        else:  # Note [One plan on every rank]: a failure on one rank stops every rank
            agreed(lambda: self._prepare(step, capture), group)
            check_same_graph(self.graph, group)
        self._plan_and_build(step, capture, step.options)
        self._leave_room_for_generator_states(step, capture)
        self.measured_once = False
        self.report = self._report(time.perf_counter() - started)

    def _plan_and_build(self, step, capture, options):
        """The plan under `options` (rank 0's on several ranks) and its program."""
        group = step.process_group
        if group is None:
            self.plan, self.budget_info = self._plan(options)
            self._build(step, capture)
            return
        planned = agreed(lambda: self._plan(options) if is_rank_0(group) else None, group)
        self.plan, self.budget_info = plan_of_rank_0(planned, group)
        agreed(lambda: self._build(step, capture), group)

    def _leave_room_for_generator_states(self, step, capture):
        """Where the plan peaks above a byte or percentage budget as the
        program runs it, plans again at the budget less the generator's
        state that a random call run again takes (Program.workspace: outside
        the planner's count, and the most it adds to a compute's workspace),
        or refuses. At "min" the prediction may stand above the plan's own
        peak (docs/torch.md). The excess is the same on every rank, so every
        rank plans again alike."""
        options = step.options
        if str(options["budget"]).strip().lower() == "min":
            self._least_as_run_at_min(step, capture)
            return
        first = self.budget_info
        budget = first.get("budget_bytes", self.plan.budget_bytes)
        over = self.predicted_peak_bytes - budget
        if over <= 0:
            return
        lowered = budget - self.program.rng_state_bytes
        why = (f"at budget {options['budget']!r} the plan of policy {self.plan.policy} peaks "
               f"{over} bytes above the budget as it runs (the generator's state taken for a "
               "random call run again)")
        # (a state above the whole budget: planned at 1 byte, for the least peak)
        left = (f"at {lowered} bytes it has none" if lowered > 0 else
                f"the generator's state alone, {_size(self.program.rng_state_bytes)}, is more "
                "than the budget")
        try:
            self._plan_and_build(step, capture, dict(options, budget=f"{max(lowered, 1)}B"))
        except PlanError as e:
            # A budget of the least peak plus the generator's state leaves the
            # room (planned again here at the least peak, which then fits).
            advice = ""
            reference = first.get("reference_bytes")
            if e.least_step_bytes is not None and reference:
                room = e.least_step_bytes + self.program.rng_state_bytes
                advice = (f"; a budget of {math.ceil(100.0 * room / reference)}% (its least "
                          f"peak, {_size(e.least_step_bytes)}, and the generator's state, "
                          f"{_size(self.program.rng_state_bytes)}) leaves the room, or "
                          "budget='min'")
            raise PlanError(f"{why}, and {left}" + (advice if advice else f": {e}"),
                            least_step_bytes=e.least_step_bytes) from None
        if self.predicted_peak_bytes > budget:
            raise PlanError(f"internal: {why}, and so does its plan at {lowered} bytes")
        for key in ("step_budget_bytes", "reference_bytes", "reference_source"):
            if key in first:
                self.budget_info[key] = first[key]
        self.budget_info["planned_at_bytes"] = lowered
        self.budget_info["budget_bytes"] = budget

    def _least_as_run_at_min(self, step, capture):
        """At "min": a plan that runs random calls again holds the generator's
        state beyond the planner's count (Program.workspace), so its peak as
        run may stand above that of a plan at a higher budget that runs none
        again (rotor on an MLP with dropout: 9,992 bytes at "min", 6,108 at
        90%, until 2026-12-06). Plans at a byte budget a byte below the peak
        as run (and, where that plan runs random calls again above it, a
        generator's state lower, as a byte budget does), while that lowers
        it (a few times at most), and keeps the lowest as run; one process,
        unsharded (another plan is built and dropped here, which a process
        group's ranks would have to agree on)."""
        if step.process_group is not None or self.shards is not None:
            return
        for _ in range(4):
            peak = self.predicted_peak_bytes
            if peak <= self.plan.report["peak_bytes"]:
                return
            kept = dict(self.__dict__)
            lowered = False
            try:
                for budget in (peak - 1, peak - 1 - self.program.rng_state_bytes):
                    if budget <= 0:
                        break
                    self._plan_and_build(step, capture, dict(step.options, budget=f"{budget}B"))
                    lowered = self.predicted_peak_bytes < peak
                    if lowered:
                        break
            except PlanError:
                lowered = False
            if not lowered:  # (the plan of "min" as it was)
                self.__dict__.clear()
                self.__dict__.update(kept)
                return
            # ("min": the least peak as run is its own budget)
            self.budget_info["budget_bytes"] = self.predicted_peak_bytes
            self.budget_info["least_as_run"] = True

    def _prepare(self, step, capture):
        """The graph with the optimizer's step, and the persistent bytes that
        frame the budget."""
        self.shards = step.shards
        self.graph = self._whole_step(capture.graph)
        self.persistent_bytes = capture.persistent_bytes
        if self.shards is not None:  # the shards, what stays whole, the state that may stay
            self.persistent_bytes = (_persistent_bytes(self.graph, but=self.updates.state_bytes)
                                     + self.updates.planned_state_bytes)
        elif self.updates is not None:  # the optimizer's step in the plan
            # While planning: the state that may be resident frames the
            # budget; once planned, only what the plan keeps resident (below).
            self.persistent_bytes += self.updates.planned_state_bytes
        self.calibration = capture.calibration

    def _build(self, step, capture):
        """The program that runs the plan, and where it keeps the optimizer's
        state."""
        # Where the plan keeps the optimizer's state (the rest of it on the
        # host) and runs each update.
        self.placement = None
        if self.updates is not None:
            self.placement = self.updates.placement(self.plan.schedule)
            if self.shards is None:
                self.persistent_bytes = (capture.persistent_bytes +
                                         self.placement.resident_state_bytes)
        group = step.process_group
        # One rank has nothing to average: its plan has no all-reduce; a
        # sharded plan reduce-scatters instead.
        averaged = group is not None and _world_size(group) > 1 and self.shards is None
        schedule, foreign = self.plan.schedule, self.updates
        if self.shards is not None:
            schedule = self.shards.translate(schedule)
            foreign = ShardedRunner(self.shards, self.updates, self.graph_nodes, schedule,
                                    collectives=step.collectives)
            # The shards and staging buffers the plan keeps on the device, and the state.
            self.persistent_bytes = (
                _persistent_bytes(self.graph, but=self.updates.state_bytes,
                                  on_host=foreign.host_homed)
                + self.placement.resident_state_bytes)
        self.program = Program(self.graph_nodes, schedule, self.device,
                               foreign=foreign, rebind=self._rebind,
                               sync=GradientAverage(step.collectives, {
                                   p.dtype for p in step.model.parameters() if p.requires_grad})
                               if averaged else None,
                               collectives=step.collectives)
        # The parameters that live on the host between steps (Note
        # [Parameters that live on the host] in _executor.py).
        self.host_parameter_bytes = sum(self.graph_nodes.nodes[i].nbytes
                                        for i in self.program.host_homes)
        self.persistent_bytes -= self.host_parameter_bytes
        self.predicted_peak_bytes = self._peak_as_run()
        # The parameters the plan frees, on the device before the step (for
        # their updates on the host).
        self.freed_parameters = [node.slot.names[0] for kind, node in self.program.steps
                                 if kind == FREE and node.kind == "persistent" and
                                 node.role == "parameter" and
                                 node.index not in self.program.host_homes]
        if self.freed_parameters and capture.shapes_from == "real":
            # Real values (a shape that depends on the data) keep the
            # parameters' storage of the capture: a free would release nothing.
            raise PlanError(f"the plan frees parameters for their updates on the host, but "
                            f"{type(step.model).__name__}'s step was captured with real "
                            "tensors (a shape depends on the data), which hold the "
                            "parameters' memory: give optimizer_updates='device'")

    # --- planning -------------------------------------------------------------

    def _plan(self, options):
        """The plan, and how the budget was resolved."""
        budget, info = self._resolve_budget(options["budget"])
        policy = options["policy"]
        host_budget = options["host_budget"]
        cpu = self.device.type == "cpu"
        if cpu and not self.step.allow_cpu_offload:
            if host_budget not in (None, 0, "0", "0B"):
                raise PlanError("offloading to the host saves no memory on the CPU device: "
                                "give no host_budget (or allow_cpu_offload=True to test the "
                                "offload path)")
            host_budget = 0
        kwargs = dict(policy=policy, budget=budget, host_budget=host_budget,
                      bandwidth=options["bandwidth"], time_limit=options["time_limit"],
                      seed=options["seed"], milp_max_stages=options["milp_max_stages"])
        group = self.step.process_group
        # The gradients' all-reduces (Note [Gradients averaged as they complete]).
        if group is not None:
            kwargs["ranks"] = _world_size(group)
            if kwargs["ranks"] > 1 and self.shards is None:
                # GradientAverage sends a bucket through a flat copy (Note [A
                # bucket through a flat copy]), which the plan holds.
                kwargs["buckets"] = self.step.buckets
                kwargs["bucket_copies"] = "device"
                kwargs["bucket_alignment"] = self.graph_nodes.round_to
            elif self.shards is not None:  # gathers, reduce-scatters joined or not
                kwargs["buckets"] = self.step.buckets
            if self.step.network is not None:
                kwargs["network"], kwargs["network_latency"] = self.step.network
        graph = self.graph  # the graph without order tokens where there is one
        if self.capture.free_graph is not self.capture.graph:
            graph = self._whole_step(self.capture.free_graph)
        plan = _policy_plan(graph, kwargs)
        unordered = graph  # (the random calls' order left to the plan)
        budget_bytes = plan.budget_bytes
        at_min = str(options["budget"]).strip().lower() == "min"
        fits = plan.feasible or self._fits_as_run(plan, graph, kwargs, budget_bytes)
        least_plans = {id(unordered): plan} if at_min else {}

        def least_of(g):
            """The policy's plan at "min" over graph `g`, made once per call."""
            if id(g) not in least_plans:
                least_plans[id(g)] = _policy_plan(g, dict(kwargs, budget="min"))
            return least_plans[id(g)]

        if fits and not self._in_eager_order(plan):
            # Note [Random calls in eager's order], Note [Reads around running
            # statistics]: the graph whose tokens order them.
            graph = self.graph
            plan = _policy_plan(graph, kwargs)
            info["order"] = "planned with random calls and running statistics' reads " \
                            "ordered as eager runs them"
            fits = plan.feasible or self._fits_as_run(plan, graph, kwargs, budget_bytes)
            if fits and not self._draws_in_eager_order(plan):
                raise PlanError(f"internal: policy {plan.policy} computes random operators "
                                "in another order than eager PyTorch draws them")
        if unordered is not self.graph and graph is self.graph and (at_min or not fits):
            # Note [Plans in eager's order at lower budgets]
            high = self._peak_as_planned_run(plan, graph, kwargs) - 1 if fits and at_min \
                else budget_bytes
            found = self._in_order_below(unordered, kwargs,
                                         least_of(unordered).report["peak_bytes"], high)
            if found is not None:
                plan, graph, fits = found[1], unordered, True
                info.pop("order", None)
                # (the given one, or at "min" the plan's peak: the plan's own
                # budget is a probe's)
                info["budget_bytes"] = found[0] if at_min else budget_bytes
        least_peak = None  # (a document has it where its plan does not fit)
        cut_short = False  # (whether the time limit cut its search short)
        if not fits and not at_min:
            least_peak, least, least_graph, cut_short = self._least_peak_plan(
                plan, graph, unordered, kwargs, least_of)
            if least is not None and least_peak <= budget_bytes:
                plan, graph, fits = least, least_graph, True
                info["least_peak_fits_as_run"] = True
                info["budget_bytes"] = budget_bytes  # (the given one: the plan's is its peak)
        if fits:
            self._refuse_statistics_read_out_of_order(plan)
        if not fits:
            if least_peak is None:  # (at "min", the plan's own peak: another limit broke)
                least_peak = plan.document.get("least_peak_bytes", plan.report["peak_bytes"])
            raise PlanError(self._does_not_fit(plan, options, info, least_peak, cut_short),
                            least_step_bytes=least_peak - self.persistent_bytes)
        if cpu and not self.step.allow_cpu_offload and plan.report["transfer_bytes"] > 0:
            raise PlanError(f"policy {plan.policy} copies tensors to the host, which saves no "
                            "memory on the CPU device (allow_cpu_offload=True runs it anyway)")
        # How to simulate the plan again (_peak_as_run), on every rank.
        info["simulation"] = dict(
            tokens=graph is self.graph,
            options={k: v for k, v in kwargs.items() if k in _SIMULATION_OPTIONS})
        return plan, info

    def _least_peak_plan(self, plan, graph, unordered, kwargs, least_of):
        """(the least peak as run, its plan or None, that plan's graph) of the
        policy's least-peak plans over `graph`, the graph `plan` (which did
        not fit) was made over, over `unordered`, the graph without the
        random calls' order tokens, and over the graph with them: the lowest
        that draws them in eager's order is taken (Note [Random calls in
        eager's order]), as budget="min" would take it. A heuristic's plans
        are not monotone in the budget: the budget's plan over `unordered` may
        draw them out of order where its least-peak plan does not, or not fit
        where the least-peak plan over the graph with tokens does. Where no
        such plan is made, the peak is the least of `graph`'s, and the plan
        None. Fourth: whether a time limit cut a search for it short (a longer
        one may find less). least_of(g): the policy's plan at "min" over g."""
        found = None
        unordered_least = None
        cut_short = bool(plan.document.get("least_peak_cut_short"))
        candidates = []
        for candidate in (graph, unordered, self.graph):  # (each graph once)
            if all(candidate is not c for c in candidates):
                candidates.append(candidate)
        for candidate in candidates:
            least = least_of(candidate)
            cut_short |= bool(least.document["details"].get("time_limit_reached"))
            # (its planner counts above the budget too, but may fit as run)
            peak = self._peak_as_planned_run(least, candidate, kwargs)
            if candidate is graph:
                peak = min(peak, plan.document["least_peak_bytes"])
                fallback = peak
            if self._in_eager_order(least) and (found is None or peak < found[0]):
                found = (peak, least, candidate)
            if candidate is unordered:
                unordered_least = least.report["peak_bytes"]
        if unordered is not self.graph and found is not None:
            # Note [Plans in eager's order at lower budgets]
            lower = self._in_order_below(unordered, kwargs, unordered_least, found[0] - 1)
            if lower is not None:
                found = lower + (unordered,)
        return (found if found is not None else (fallback, None, graph)) + (cut_short,)

    def _in_order_below(self, unordered, kwargs, low, high):
        """(peak as run, plan) of the lowest peak among the policy's plans
        over `unordered` (the graph without order tokens) at _BUDGET_PROBES
        byte budgets from `high` down to `low`, those that run the random
        calls and the statistics' reads in eager's order and peak at most
        `high` as run; None where none does, or `high` is below `low`
        (Note [Plans in eager's order at lower budgets]). Within the
        options' time limit, for every probe together."""
        if high < low:
            return None
        deadline = time.perf_counter() + (kwargs.get("time_limit") or 10.0)
        found = None
        for k in range(_BUDGET_PROBES):
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            budget = high - (high - low) * k // (_BUDGET_PROBES - 1)
            try:
                plan = _policy_plan(unordered, dict(kwargs, budget=max(int(budget), 1),
                                                    time_limit=left))
            except PlanError:
                continue
            if not (plan.feasible or self._fits_as_run(plan, unordered, kwargs, budget)) or \
                    not self._in_eager_order(plan):
                continue
            peak = self._peak_as_planned_run(plan, unordered, kwargs)
            if peak <= high and (found is None or peak < found[0]):
                found = (peak, plan)
        return found

    def _fits_as_run(self, plan, graph, kwargs, budget_bytes):
        """Whether a plan over its device budget by the planner's count fits
        it as the program runs it (_peak_as_planned_run)."""
        if plan.report["peak_bytes"] <= budget_bytes or "host peak" in plan.message:
            return False
        return self._peak_as_planned_run(plan, graph, kwargs) <= budget_bytes

    def _peak_as_planned_run(self, plan, graph, kwargs):
        """The plan's peak as the program will run it, where that is below
        the planner's count: the planner charges each output of a call of
        several outputs the others as workspace, so one computed right after
        its sibling counts that sibling twice, where the program runs the
        call once (Note [A call of several outputs run once]; an MLP with
        nn.PReLU, whose backward has no output mask: baseline's plan 125% of
        the step it is, refused at 100% until 2026-12-03). Unsharded steps
        only (else the planner's count); a random call run again is
        _leave_room_for_generator_states's."""
        if self.shards is not None:
            return plan.report["peak_bytes"]
        by_id = {node.id: node for node in self.graph_nodes.nodes}
        actions = {"compute": COMPUTE, "free": FREE}
        steps = []
        for entry in plan.schedule:
            node = by_id.get(entry[1])
            steps.append((actions.get(entry[0]), node) if node is not None else (None, None))
        kept = kept_siblings(steps)[2]
        if not kept:
            return plan.report["peak_bytes"]
        return _simulated_peak(graph, plan.schedule, {
            k: v for k, v in kwargs.items() if k in _SIMULATION_OPTIONS}, kept=kept)

    def _peak_as_run(self):
        """The peak bytes of the plan as the program runs it: the
        simulator's, on the graph without the workspace of the nodes that the
        program always keeps from a sibling's call (Note [A call of several
        outputs run once] in _executor.py), and with that of a random call
        run again as the program holds it (Program.workspace: Note
        [Randomness as eager has it])."""
        program = self.program
        if not program.kept_only and not program.rng_state_bytes:
            return self.plan.report["peak_bytes"]
        if len(program.steps) != len(self.plan.schedule):
            raise PlanExecutionError("internal: the program's steps are not the plan's")
        kept = {self.plan.schedule[i][1] for i in program.fused_steps}
        # plan id -> the workspace the program holds at its computes
        rerun = {self.plan.schedule[i][1]: program.workspace(node)
                 for i, (kind, node) in enumerate(program.steps)
                 if kind == COMPUTE and node.random and node.fx in program.rerun_calls}
        return _simulated_peak(self._simulated_graph(), self.plan.schedule,
                               self.budget_info["simulation"]["options"], kept=kept,
                               workspace=rerun)

    def _simulated_graph(self):
        """The graph the plan was made over, to simulate it again: the
        captured step's, or the one without the random calls' order tokens
        (budget_info's "simulation")."""
        if self.budget_info["simulation"]["tokens"]:
            return self.graph
        return self._whole_step(self.capture.free_graph)

    def _timeline(self, measured):
        """The memory timeline of a step (TrainStep.memory_timeline) whose
        allocator levels after each step of the plan are `measured`: beside
        each, the simulator's device bytes there above those before the
        first step, and the outputs of a call of several outputs that the
        program keeps for a sibling's step until it (Note [A call of several
        outputs run once] in _executor.py: only frees come between, so they
        never raise the peak)."""
        schedule = self.plan.schedule
        if len(measured) != len(schedule):
            raise PlanExecutionError(f"internal: {len(measured)} levels measured for the plan's "
                                     f"{len(schedule)} steps")
        report = _core.simulate(self._simulated_graph(), schedule, timeline=True,
                                **self.budget_info["simulation"]["options"])
        start = report["initial_bytes"]
        kept = {}  # node index -> bytes, kept from a sibling's call until its step
        timeline = []
        for i, (entry, simulated, measured_bytes) in enumerate(
                zip(schedule, report["timeline"], measured)):
            kind, node = self.program.steps[i]
            for sibling in self.program.keep_siblings.get(i, ()):
                kept[sibling.index] = sibling.nbytes
            if kind == COMPUTE:
                kept.pop(node.index, None)
            timeline.append({"step": i, "action": entry[0], "node": entry[1],
                             "predicted_bytes": simulated["device_bytes"] - start +
                             sum(kept.values()),
                             "measured_bytes": measured_bytes})
        return timeline

    def _whole_step(self, graph):
        """The captured `graph` with the optimizer's step, sharded where the
        step is."""
        if self.updates is not None:
            graph = self.updates.extend(graph, self.graph_nodes.round_to)
        if self.shards is not None:  # (traced fake: Note [Stand-ins for sharded parameters])
            try:
                graph = self.shards.shard_graph(graph, self.step.network, self.updates,
                                                self.graph_nodes.round_to)
            except ValueError as e:
                raise PlanError(str(e)) from None
        return graph

    def _refuse_statistics_read_out_of_order(self, plan):
        """PlanError where the plan reads a batch norm's running statistics on
        the other side of its update than eager does
        (statistics_read_out_of_order)."""
        found = statistics_read_out_of_order(self.graph_nodes, self._graph_schedule(plan))
        if found is None:
            return
        call, reader, side = found
        raise PlanError(
            f"policy {plan.policy} computes '{reader.id}', which reads the running statistics "
            f"that {call.target} updates, {'after' if side == 'before' else 'before'} that "
            f"update, where eager PyTorch reads them {side} it (a recomputation, or a read "
            "moved across the batch norm): it would read other statistics, so pebble.torch "
            "refuses the plan. Give a budget or a policy that does not recompute it "
            "(best-order does not recompute), or read the statistics outside the step")

    def _in_eager_order(self, plan):
        """Whether the plan runs the random calls, and the reads of running
        statistics, as eager does (Note [Random calls in eager's order],
        Note [Reads around running statistics])."""
        schedule = self._graph_schedule(plan)
        return draws_in_eager_order(self.graph_nodes, schedule) and \
            statistics_read_out_of_order(self.graph_nodes, schedule) is None

    def _draws_in_eager_order(self, plan):
        return draws_in_eager_order(self.graph_nodes, self._graph_schedule(plan))

    def _graph_schedule(self, plan):
        """`plan`'s schedule in the captured graph's node ids (a sharded
        plan's translated)."""
        if self.shards is None:
            return plan.schedule
        return self.shards.translate(plan.schedule)

    def _does_not_fit(self, plan, options, info, least_peak, cut_short=False):
        """Why `plan` does not fit, with the least peak its policy reaches
        (pebble.plan's at "min", as the program runs it) and a budget that
        admits it, in the terms of train_step's budget: a percentage of the
        unplanned step, or bytes, the whole least peak, for a budget in bytes."""
        least_step = least_peak - self.persistent_bytes
        budget = options["budget"]
        reference_name = ("pebble's baseline of the sharded step" if self.shards is not None
                          else "the unplanned step")
        if least_peak <= plan.budget_bytes:  # not the device budget
            return (f"policy {plan.policy} cannot plan the training step of "
                    f"{type(self.step.model).__name__} in {budget}: {plan.message}")
        reference = info["reference_bytes"]
        percent = math.ceil(100.0 * least_step / reference) if reference else 100
        room = plan.budget_bytes - self.persistent_bytes
        # A plan that runs a random call again holds the generator's state
        # beside it on the CPU, outside the least peak: the advice has room for it.
        rng = generator_state_bytes(self.device)
        rng = rng if rng and reference and _may_recompute(plan) and any(
            node.random for node in self.graph_nodes.nodes) else 0
        # (a budget in bytes is advised in bytes: the least peak in all)
        in_bytes = not (isinstance(budget, str) and budget.strip().endswith("%"))
        least = "in its time limit" if cut_short else "at least"
        alternatives = ", budget='min' or a longer time_limit" if cut_short else \
            " or budget='min'"
        reached = (f"it reaches {_size(least_peak)} ({least_peak} bytes) in all {least}, "
                   f"{_size(least_step)} of it above the parameters and inputs ({percent}% "
                   f"of {reference_name})" if in_bytes else
                   f"it reaches {_size(least_step)} ({percent}% of {reference_name}) {least}")
        if least_step > 0 and rng:
            advised = (least_peak + rng if in_bytes else
                       f"'{math.ceil(100.0 * (least_step + rng) / reference)}%'")
            reaches = (f"{reached}, and a plan that runs a random call again (as "
                       f"{plan.policy} may) holds the generator's state, {_size(rng)}, "
                       f"beside it on the CPU: try budget={advised} (room for both)"
                       f"{alternatives}")
        elif least_step > 0:
            advised = least_peak if in_bytes else f"'{percent}%'"
            reaches = f"{reached}: try budget={advised}{alternatives}"
        else:
            # (the plan keeps some of the parameters, inputs or optimizer
            # state on the host: no percentage of the step says its peak)
            reaches = (f"it reaches {_size(least_peak)} ({least_peak} bytes) in all {least}, "
                       "with some of the parameters or optimizer state on the host" +
                       (f", and a plan that runs a random call again (as {plan.policy} "
                        f"may) holds the generator's state, {_size(rng)}, beside it on the "
                        "CPU" if rng else "") +
                       f": try budget={least_peak + rng}{alternatives}")
        message = (f"policy {plan.policy} cannot fit the training step of "
                   f"{type(self.step.model).__name__} in {budget} "
                   f"({_size(abs(room))} {'above' if room >= 0 else 'below'} the "
                   f"parameters and inputs): {reaches}")
        # What every plan keeps to its end above the persistent tensors: the
        # loss and the gradients. Where it is most of the least peak, say so.
        kept = plan.document["end_state_bytes"] - self.persistent_bytes
        if kept > 0 and 2 * kept >= least_step:
            message += (f" ({_size(kept)} of it are the gradients the step makes, which every "
                        "plan keeps)")
        if self.step.buckets not in ("auto", "none") and self.shards is None:
            message += (f"; with buckets={self.step.buckets!r}, each bucket's copy counts: "
                        "buckets='auto' keeps them within the budget")
        return message

    def _resolve_budget(self, budget):
        """pebble's budget for `budget`: a percentage is of the unplanned step's
        peak above the persistent tensors, measured at calibration where it
        ran, else predicted."""
        reference = self.calibration.unplanned_peak_bytes
        source = "measured: the unplanned step, by the allocator"
        if reference is None or self.shards is not None:  # (sharded: no unplanned run)
            baseline = _core.plan(self.graph, policy="baseline", budget="100%")
            reference = baseline.report["peak_bytes"] - self.persistent_bytes
            source = ("predicted: pebble's baseline of the sharded step (each parameter "
                      "gathered before its first reader and kept to its last)"
                      if self.shards is not None else
                      "predicted: pebble's baseline (the unplanned step could not run)")
        if self.updates is not None and self.shards is None:
            # The calibration ran the step without the optimizer: its update
            # (the gradients held, one parameter's temporaries) may peak
            # above, under this step's placement (the state streamed in) or
            # under eager's (every update on the device): a percentage frames
            # the plans of every placement, and 100% admits eager's own step
            # (until 2026-12-06 only this placement's counted, and under
            # optimizer_updates='auto', whose baseline updates on the host,
            # 100% was refused where the host budget kept them off it).
            measured = self.calibration.unplanned_peak_bytes is not None
            eagers = self.updates.extend_on_device(self.capture.graph, self.graph_nodes.round_to)
            for graph, persistent in ([(self.graph, self.persistent_bytes)] if measured else []) \
                    + [(eagers, _persistent_bytes(eagers))]:
                baseline = _core.plan(graph, policy="baseline", budget="100%")
                update_peak = baseline.report["peak_bytes"] - persistent
                if update_peak > reference:
                    reference = update_peak
                    source = ("predicted: the optimizer's update after the unplanned step, "
                              "above the step's measured peak" if measured else source)
        info = {"reference_bytes": reference, "reference_source": source}
        _refuse_bare_small_number(budget)
        budget = _whole_bytes(budget)
        if isinstance(budget, str) and budget.strip().endswith("%"):
            try:
                percent = float(budget.strip()[:-1])
            except ValueError:
                raise ValueError(f"budget {budget!r} is not a percentage") from None
            if percent < 0:
                raise ValueError(f"budget {budget!r}: a percentage must not be negative")
            if not (percent >= 0) or percent == float("inf"):
                raise ValueError(f"budget {budget!r} is not a percentage")
            step_bytes = int(reference * percent / 100)
            info["step_budget_bytes"] = step_bytes
            return self.persistent_bytes + step_bytes, info
        return budget, info

    # --- running --------------------------------------------------------------

    def run(self, inputs, target, timeline=None):
        """One step: the loss. In a process group, a failure on any rank
        fails it on every rank (Note [A rank that fails mid-step]).
        timeline: a list that gets the step's memory timeline
        (TrainStep.memory_timeline); one process only."""
        collectives = self.step.collectives
        if collectives is None:
            return self._run(inputs, target, timeline)
        return collectives.together(lambda: self._run(inputs, target))

    def _run(self, inputs, target, timeline=None):
        measured = self.device.type == "cuda" or self.step.measure_mode == "always" or (
            self.step.measure_mode == "first" and not self.measured_once) or \
            timeline is not None
        self._place_parameters()
        if measured and self.device.type == "cpu" and self.freed_parameters:
            self._reallocate_freed_parameters()
        if self.shards is not None:
            self.program.foreign.place_shards()
            if measured and self.device.type == "cpu":
                self.shards.reallocate_where_profiled(self.program.foreign.freed_shards)
        sharded = self.shards.params if self.shards is not None else ()
        persistent = self.capture.persistent(inputs, target, sharded)
        if self.updates is not None:
            # Held before the step, where the plan holds it.
            # (the shapes as the call's _state_refusal left them)
            self.updates.ensure_state(self.placement, like=self.shards and self.shards.shards)
            if measured and self.device.type == "cpu":
                self.updates.reallocate_offloaded_state()
        # The plan fixed every tensor's dtype: autocast stays off inside the step.
        with torch.no_grad(), torch.autocast(self.device.type, enabled=False):
            if measured:
                # (the collector paused, not run: Note [The collector paused])
                with AllocatorPeak(self.device, collect=False,
                                   marks=timeline is not None) as meter:
                    result = self._run_step(persistent, meter.mark if meter.marks else None)
            else:
                result = self._run_step(persistent)
        loss = result.loss
        # (what clip_grad_norm_ returns: a 0-dim tensor on the step's device)
        self.step.grad_norm = (result.grad_norm.detach() if result.grad_norm is not None
                               else None)
        del result.grads, result.updates
        r = self.report
        r.update(counted_peak_bytes=result.counted_peak_bytes,
                 transfer_bytes=result.transfer_bytes,
                 measured_host_peak_bytes=result.host_peak_bytes,
                 measured_recomputations=result.recomputations,
                 random_reruns=result.random_reruns,
                 time_s=result.time_s)
        if timeline is not None:
            timeline.extend(self._timeline(meter.levels))
        if measured:
            self.measured_once = True
            r["measured_peak_bytes"] = meter.peak_bytes
            r["measured_by"] = meter.source
            r["measured_total_peak_bytes"] = meter.peak_bytes + self.persistent_bytes
            predicted = r["predicted_step_peak_bytes"]
            if meter.peak_bytes > predicted and self.calibration.source.startswith("estimated"):
                # (estimated costs leave the kernels' temporaries out: the
                # prediction, and a budget in percent of it, are too low)
                warnings.warn(
                    f"pebble.torch: the step of {type(self.step.model).__name__} peaked at "
                    f"{meter.peak_bytes} bytes above its persistent tensors, above the "
                    f"{predicted} bytes its plan predicted: its costs were "
                    f"{self.calibration.source!r}, which leaves out what kernels allocate "
                    "inside; calibrate=True measures that, and the plan then keeps to the "
                    "budget", RuntimeWarning, stacklevel=3)
        return loss.detach()

    def _run_step(self, persistent, after_step=None):
        """The planned step (the optimizer's updates where the plan runs them),
        then each gradient into .grad, each buffer updated. after_step: as
        Program.run takes it."""
        result = self.program.run(persistent, release=True, after_step=after_step)
        for slot, grad in result.grads:
            if grad is None:  # dropped (optimizer_gradients="drop"): the updates read it
                continue
            if self.shards is not None:
                raise PlanExecutionError(f"internal: the sharded plan keeps the local gradient "
                                         f"of '{slot.names[0]}' past the step")
            param = _lookup(self.step.model, slot.names[0])
            if param.grad is None:
                param.grad = grad
            else:  # .grad appeared since planning: add, as autograd would
                param.grad.add_(grad)
        for slot, value in result.updates:
            _lookup(self.step.model, slot.names[0]).copy_(value)
        if self.placement is not None:  # pebble's count: the resident state throughout
            result.counted_peak_bytes += self.placement.resident_state_bytes
        if self.shards is not None:  # and the shards, and their staging buffers
            result.counted_peak_bytes += self.shards.shard_bytes + self.shards.staging_bytes
        return result

    def _place_parameters(self):
        """Each trainable parameter where this plan keeps it between steps: its
        host copy where the plan's home of it is the host, else the device
        (another plan's, or a capture's, may have left it elsewhere)."""
        if not self.step.parameters_may_live_on_host:
            return
        homes = self.program.host_homes
        with torch.no_grad():
            for node in self.graph_nodes.nodes:
                if node.kind != "persistent" or node.role != "parameter":
                    continue
                param = _lookup(self.step.model, node.slot.names[0])
                if node.index in homes:
                    host = self.program.host[node.index]
                    if param.data.data_ptr() != host.data_ptr():
                        host.copy_(param.data)
                        param.data = host
                elif param.device != self.device:
                    param.data = param.data.to(self.device)

    def _reallocate_freed_parameters(self):
        """The parameters that the plan frees, each in a copy made where the CPU
        profiler sees it (allocated_where_profiled), so that it measures
        their frees. Nothing here outlives the call but the module's
        parameters."""
        params = [_lookup(self.step.model, n) for n in self.freed_parameters]
        for param, fresh in zip(params, allocated_where_profiled(params)):
            param.data = fresh

    def _rebind(self, node, tensor):
        """The module's parameter of the persistent node `node` follows the
        plan (Note [Steps of the optimizer] in _executor.py): released where
        the plan frees it (tensor None), the fetched copy where it prefetches
        it. False for other persistent nodes, which the module keeps."""
        slot = node.slot
        if slot is None or slot.kind != "parameter" or node.role == "gradient":
            return False
        param = _lookup(self.step.model, slot.names[0])
        if tensor is None:
            tensor = torch.empty(0, dtype=param.dtype, device=param.device)
        param.data = tensor
        return True

    def _report(self, plan_s):
        c = self.capture
        p = self.plan
        r = p.report
        info = self.budget_info
        report = {
            "policy": p.policy,
            "budget_bytes": info.get("budget_bytes", p.budget_bytes),
            "budget_reference_bytes": info["reference_bytes"],
            "budget_reference_source": info["reference_source"],
            "persistent_bytes": self.persistent_bytes,
            "baseline_peak_bytes": p.baseline_peak_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_step_peak_bytes": self.predicted_peak_bytes - self.persistent_bytes,
            "measured_peak_bytes": None,
            "measured_by": None,
            "counted_peak_bytes": None,
            "recomputations": r["recomputations"],
            "predicted_transfer_bytes": r["transfer_bytes"],
            "transfer_bytes": None,
            "host_peak_bytes": r["host_peak_bytes"],
            "compute_overhead": r["overhead"],
            "capture_time_s": c.capture_s,
            "calibration": self.calibration.source,
            "calibration_time_s": self.calibration.seconds,
            "plan_time_s": plan_s,
            "setup_time_s": c.setup_s + plan_s,
            "time_s": None,
            "steps": len(p.schedule),
            "nodes": len(self.graph),
            "device": str(self.device),
            "ranks": (_world_size(self.step.process_group)
                      if self.step.process_group is not None else 1),
            "predicted_time_s": r["makespan"],
            "traced_with": c.traced_with,
            "shapes_from": c.shapes_from,
            "unplanned_measured_peak_bytes": self.calibration.unplanned_peak_bytes,
        }
        if self.placement is not None:  # where the optimizer's state lives and its updates run
            report.update(self.placement.report())
            # The rate the plan timed host updates at (measured, or the default).
            report["host_update_bytes_per_s"] = (self.updates.host_bytes_per_s
                                                 if self.updates.on_host else None)
        if self.shards is None and self.updates is not None:  # and the parameters
            homes = self.program.host_homes
            report["optimizer_parameters"] = {
                "host_parameters": len(homes),
                "device_parameters": len(self.updates.params) - len(homes),
                "host_bytes": self.host_parameter_bytes}
        if "collectives" in p.details:  # data parallelism: the plan's all-reduces
            c = p.details["collectives"]
            report["collectives"] = {
                "all_reduce": c["all_reduce"], "buckets": c.get("buckets"),
                "bucket_rule": c.get("bucket_rule"),
                "largest_bucket_bytes": c.get("largest_bucket_bytes"), "bytes": c["bytes"],
                "predicted_network_busy_s": c["network_busy"],
                "network_bytes_per_s": c["network_bandwidth_bytes_per_s"],
                "network_latency_s": c["network_latency_s"],
                "network_measured": self.step.network_measured,
                # A clipped step's averages of the gradients that the
                # clipping reads (Note [Clipping the averaged gradients]):
                # the plan's all-reduces of unclipped gradients, more than
                # the gradients where it computes one again.
                "clip_averages": sum(1 for kind, node in self.program.steps
                                     if kind == REDUCE and
                                     node.index in self.graph_nodes.unclipped_indices)}
        if self.shards is not None:
            report["sharding"] = _sharding_report(p, self.shards, self.step.network_measured,
                                                  self.program.foreign)
        # (None where the budget is bytes or "min")
        report["step_budget_bytes"] = info.get("step_budget_bytes")
        if "planned_at_bytes" in info:  # (room left for generator states)
            report["planned_at_bytes"] = info["planned_at_bytes"]
        if "order" in info:
            report["order"] = info["order"]
        return report


class _Failure:
    """Why a step failed (None: none did), in a line, and whether the ranks'
    collectives were in step after it."""

    def __init__(self):
        self.why, self.in_step = None, True

    def record(self, error, in_step):
        self.why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        self.in_step = in_step


def _persistent_bytes(graph, but=(), on_host=None):
    """The bytes of the persistent tensors of `graph` (a pebble.Graph) whose
    home may be the device, but those of the ids in `but`: a home "auto"
    counts until a plan resolves it (`on_host`: the ids it puts there)."""
    total = 0
    for n in json.loads(graph.to_json())["nodes"]:
        home = n.get("home", "device")
        if not n.get("persistent") or n["id"] in but or home == "host" or \
                (home == "auto" and on_host is not None and n["id"] in on_host):
            continue
        total += n["bytes"]
    return total


def _sharding_report(plan, shards, network_measured, runner):
    """The report's "sharding" entry: the shards, the plan's collectives, the
    messages the runner sends for them (a unit's in one where it may: Note
    [A unit's collectives as one message]) and the link it times them on."""
    computes = [node_id for action, node_id, *_ in plan.schedule if action == "compute"]
    gathers = sum(1 for n in computes if n.startswith("gather:"))
    link = plan.details.get("collectives", {})
    return {"ranks": shards.ranks, "parameters": len(shards.params),
            "network_bytes_per_s": link.get("network_bandwidth_bytes_per_s"),
            "network_latency_s": link.get("network_latency_s"),
            "network_measured": network_measured,
            "shard_bytes": shards.shard_bytes,  # on the device between steps
            # those the plan keeps on the host between steps (optimizer_parameters)
            "shards_on_host": len(runner.host_homed),
            "host_shard_bytes": sum(shards.shard_held_bytes(n) for n in runner.host_homed),
            "gathers": gathers, "regathers": gathers - len(shards.params),
            "reduce_scatters": sum(1 for n in computes if n.startswith("grad:") and
                                   n[len("grad:"):] in shards.params),
            # (and the all-reduces of the clipped gradients' norm: Note
            # [Clipping sharded gradients] in _sharding.py)
            "norm_all_reduces": sum(1 for n in computes if n == "clip_total"),
            "planned_messages": plan.report.get("collectives", 0),
            "messages": sum(1 for kind in runner.messages.values() for m in kind if m) +
            sum(1 for n in computes if n == "clip_total"),
            "predicted_network_busy_s": plan.report.get("network_busy", 0.0)}


def _world_size(group):
    import torch.distributed as dist
    return dist.get_world_size(group)


def _optimizer_settings(optimizer):
    """The settings of `optimizer` (each group's, but its parameters; None
    without one), which every rank must share: a learning rate that differs
    between ranks would update their parameters apart."""
    if not isinstance(optimizer, torch.optim.Optimizer):  # (None, or refused already)
        return None
    return [sorted((key, repr(value)) for key, value in group.items() if key != "params")
            for group in optimizer.param_groups]


def _setup_of(model, inputs, target, optimizer, options):
    """What every rank of a step must give alike, by name: its module's
    tensors (names, shapes, dtypes, trainable or not, on the meta device or
    not), the shapes of its slice of the batch, the optimizer's kind and
    each train_step option; the gradients held and the layout of the
    optimizer's state too, whose values rank 0 then sends (a step that
    failed on one rank leaves them differing)."""
    def described(t):  # (read in the refusal: "(2, 7) float32 requires grad")
        return (f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" +
                (" requires grad" if t.requires_grad else "") + (" meta" if t.is_meta else ""))

    setup = {
        "module's parameters and buffers (names, shapes, dtypes, requires_grad)":
            [(name, described(t)) for name, t in model.named_parameters()] +
            [(name, described(t)) for name, t in model.named_buffers()],
        "gradients held (.grad: zero_grad(set_to_none=True) on every rank, or none)":
            [name for name, p in model.named_parameters() if p.grad is not None],
        "batch shapes and layouts (inputs and target)":
            [f"input {k} {_batch_tensor_described(t)}" for k, t in enumerate(inputs)] +
            [f"target {_batch_tensor_described(target)}"],
        "optimizer": None if optimizer is None else type(optimizer).__name__,
        "optimizer's settings (each group's lr, betas, ...)": _optimizer_settings(optimizer),
        "optimizer's state (its entries per parameter; load one rank's state_dict() on "
        "every rank)": None if optimizer is None else optimizer_state_layout(optimizer),
    }
    setup.update({f"{key}=": value for key, value in options.items()})
    return setup


def _batch_tensor_described(t):
    """A tensor of the batch as the ranks' refusals show it: "(4, 16)
    float32", with its strides where it is not contiguous (a slice
    x[rank::ranks] is; .contiguous() makes it so)."""
    layout = "" if t.is_contiguous() else f" with strides {tuple(t.stride())} (not contiguous)"
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}{layout}"


def _described_call(inputs, target, tensors):
    """The inputs' and the target's shapes and dtypes, briefly: "inputs
    (4, 16) int64, target (4, 16) int64", and the autocast that the
    signature's `tensors` part holds where it is on ("autocast bfloat16")."""
    enabled, dtype = next((p[1] for p in tensors if p[:1] == ("autocast",)), (False, None))
    return (f"input{'s' if len(inputs) > 1 else ''} "
            f"{', '.join(_batch_tensor_described(t) for t in inputs)}, "
            f"target {_batch_tensor_described(target)}" +
            (f", autocast {str(dtype).replace('torch.', '')}" if enabled else ""))


def _checked_max_shapes(max_shapes):
    if max_shapes is None:
        return None
    if isinstance(max_shapes, bool) or not isinstance(max_shapes, int) or max_shapes < 1:
        raise ValueError("max_shapes is the most signatures whose capture and plan the step "
                         f"keeps: a whole number >= 1, or None for no bound, not {max_shapes!r}")
    return max_shapes


def _check_shard(shard, group):
    if shard not in ("none", "full"):
        raise ValueError(f"shard must be 'none' or 'full', not {shard!r}")
    if group is None and shard != "none":
        import torch.distributed as dist
        unset = dist.is_available() and not dist.is_initialized()
        raise ValueError("shard shards the model over the ranks of a process_group: give "
                         "the process group too" +
                         (" (process_group is None here: torch.distributed.group.WORLD is "
                          "None until torch.distributed.init_process_group is called)"
                          if unset else ""))


def _outside_pebble():
    """The stacklevel of warnings.warn, called here, that names the
    innermost frame outside pebble's package: the user's call, whichever
    path (train_step, a step's call) led here."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _state_tensors(model):
    """name -> tensor of each parameter and buffer of `model`."""
    return dict(itertools.chain(model.named_parameters(), model.named_buffers()))


def _same_values(a, b):
    """Whether tensors `a` and `b` hold the same values, NaN equal to NaN."""
    if torch.equal(a, b):
        return True
    return a.is_floating_point() and bool(torch.isnan(a).any()) and \
        torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)


def _checked_group(group):
    """The process group train_step was given (None: one process), checked."""
    if group is None:
        return None
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("process_group: torch.distributed is not initialised "
                         "(torch.distributed.init_process_group first)")
    member = getattr(dist, "GroupMember", None)
    if member is not None and group is getattr(member, "NON_GROUP_MEMBER", None):
        raise ValueError("process_group: this rank is not a member of that group "
                         "(torch.distributed.new_group(ranks) gives the ranks outside it a "
                         "placeholder): make the step on the group's own ranks only")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"process_group must be a torch.distributed.ProcessGroup (such as "
                        f"torch.distributed.group.WORLD), not {type(group).__name__}")
    why = out_of_step(group)
    if why is not None:  # (on this rank alone: a collective would pair wrongly)
        raise ValueError(f"process_group: its collectives are out of step since a step "
                         f"failed ({why.splitlines()[0]}): make a new process group "
                         "(torch.distributed.new_group, or destroy_process_group and "
                         "init_process_group)")
    return group


def _checked_buckets(buckets, group, shard):
    """The bucket rule train_step was given; checked here for its type, its
    text (a size as pebble.plan parses it) and its use."""
    if isinstance(buckets, bool) or not isinstance(buckets, (str, int)):
        raise TypeError(f"buckets must be 'auto', 'none' or a size such as '25MiB', not "
                        f"{type(buckets).__name__}")
    text = str(buckets).strip().lower()
    if text == "auto":
        return "auto"
    if group is None:
        raise ValueError(f"buckets={buckets!r}: buckets group the collectives of several "
                         "ranks: give a process_group")
    if text in ("none", "0", "0b"):
        return buckets
    _check_as_pebble_plan_does(policy="baseline", ranks=2, buckets=buckets)  # (a size's text)
    if shard != "none":
        raise ValueError(f"buckets={buckets!r}: a bucket cap groups the all-reduces of data "
                         "parallelism (shard='none'); a sharded step takes 'auto' (gathers and "
                         "reduce-scatters joined where the plan is faster) or 'none'")
    return buckets


def _checked_sharding(shard, optimizer, state, updates, gradients, parameters):
    """optimizer_gradients as given or by default ("drop" sharded or with the
    parameters on the host, else "keep"); ValueError for what a sharded step,
    or one whose parameters may live on the host, does not run."""
    check_choices(state, updates, gradients, parameters)  # (each value first)
    if parameters != "device" and optimizer is None:
        raise ValueError(f"optimizer_parameters={parameters!r} places the parameters that the "
                         "optimizer updates: give the optimizer too")
    if parameters != "device" and shard != "full":
        if gradients == "keep":
            raise ValueError(f"optimizer_parameters={parameters!r}: a parameter that lives on "
                             "the host has no .grad on the device; the updates read each "
                             "gradient and the plan then frees it: leave optimizer_gradients "
                             "out (or 'drop')")
        return "drop"
    if shard != "full":
        return gradients or "keep"
    if optimizer is None:
        raise ValueError("shard='full' shards the optimizer's state and runs its updates on "
                         "the shards: give the optimizer too")
    if gradients == "keep":
        raise ValueError("shard='full' gives each rank 1/ranks of each gradient, which the "
                         "updates read and the plan then frees: optimizer_gradients='keep' "
                         "(gradients in .grad) is not possible; leave it out")
    return "drop"


def _slot_ids(traced, names):
    """Ids of the slots that hold any of the parameter names."""
    return {s.id for s in traced.slots if s.kind == "parameter" and set(s.names) & set(names)}


def _lookup(model, name):
    obj = model
    *path, attr = name.split(".")
    for part in path:
        obj = getattr(obj, part)
    return getattr(obj, attr)


def _as_tuple(inputs, what):
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)) and inputs and \
            all(isinstance(t, torch.Tensor) for t in inputs):
        return tuple(inputs)
    wrapper = ("a wrapper module whose forward takes them as positional tensors and calls "
               "the model with the rest (keywords, None, numbers) gives them")
    if isinstance(inputs, dict):
        raise TypeError(f"{what} must be a tensor or a tuple of tensors, not a dict: for a "
                        f"forward that takes keyword arguments (model(**batch)), {wrapper}")
    if isinstance(inputs, (tuple, list)) and inputs:
        k, bad = next((k, t) for k, t in enumerate(inputs) if not isinstance(t, torch.Tensor))
        raise TypeError(f"{what} must be a tensor or a tuple of tensors; item {k} is "
                        f"{type(bad).__name__}: {wrapper}")
    raise TypeError(f"{what} must be a tensor or a tuple of tensors, not "
                    f"{'an empty ' if isinstance(inputs, (tuple, list)) else ''}"
                    f"{type(inputs).__name__}")


def _layout(t):
    """A tensor's strides, but of dims of size 1 (which say nothing)."""
    return tuple(0 if n <= 1 else st for n, st in zip(t.shape, t.stride()))


def _check_grad_mode(what):
    """RuntimeError where gradients are off (torch.no_grad(), inference
    mode): the step computes them, as loss.backward() does, which eager
    PyTorch refuses there."""
    if not torch.is_grad_enabled():
        raise RuntimeError(f"{what} with gradients disabled (torch.no_grad() or "
                           "torch.inference_mode()): the step computes every parameter's "
                           "gradient, and eager's loss.backward() fails there; call it with "
                           "gradients enabled (an evaluation loop calls the module itself)")


def _check_tensor_arg(t, what):
    if not isinstance(t, torch.Tensor):
        several = "target" in what and isinstance(t, (tuple, list, dict))
        raise TypeError(f"{what} must be a tensor, not {type(t).__name__}" + (
            ": several targets go in one tensor (stacked), or the others through the "
            "inputs: a wrapper module whose forward(x, y2) returns (model(x), y2), for "
            "loss_fn to read (docs/torch.md)" if several else ""))
    if t.requires_grad:
        raise ValueError(f"{what} requires grad: the step computes the parameters' gradients "
                         "only, so it would neither fill its .grad nor carry the backward "
                         "into what made it, as eager's backward() does; give it detached "
                         "(x.detach()), and take its gradient outside the step")


# Parallel wrappers of other libraries, by (module, class, what it is): each
# reduces the gradients in hooks of its own, which a traced step does not run.
_ENGINE_WRAPPERS = (("apex.parallel", "DistributedDataParallel",
                     "Apex's DistributedDataParallel"),
                    ("deepspeed.runtime.engine", "DeepSpeedEngine", "a DeepSpeed engine"),
                    ("fairscale.nn.data_parallel", "ShardedDataParallel",
                     "FairScale's ShardedDataParallel"),
                    ("fairscale.nn.data_parallel", "FullyShardedDataParallel",
                     "FairScale's FullyShardedDataParallel"))


def _classes_imported(names):
    """The classes named (module, class) among the modules already imported:
    a model that a library wrapped had its module imported, and importing it
    here would cost every step (and fails on some builds: PyTorch 1.13's
    FSDP under Python 3.11)."""
    kinds = []
    for where, name, *_ in names:
        kind = getattr(sys.modules.get(where), name, None)
        if isinstance(kind, type) and kind not in kinds:
            kinds.append(kind)
    return tuple(kinds)


def _sharding_wrappers():
    """FSDP's classes: FullyShardedDataParallel, and 2.x's FSDPModule, which
    fully_shard makes the sharded module's class derive from."""
    return _classes_imported((("torch.distributed.fsdp", "FullyShardedDataParallel"),
                              ("torch.distributed.fsdp", "FSDPModule"),
                              ("torch.distributed._composable.fsdp", "FSDPModule")))


def _engine_wrapper(module):
    """What other library's parallel wrapper `module` is (_ENGINE_WRAPPERS),
    or None."""
    for entry in _ENGINE_WRAPPERS:
        kinds = _classes_imported((entry,))
        if kinds and isinstance(module, kinds):
            return entry[2]
    return None


def _refuse_parallel_wrapper(name, module):
    """TypeError for a module that a parallel wrapper made: its work happens
    outside its forward (DistributedDataParallel's all-reduces in autograd
    hooks, FSDP's gathers and reduce-scatters in hooks and its flat
    parameters) or over several devices (DataParallel), none of which a
    traced step runs: each rank kept its own gradients, silently. Known by
    class (isinstance), not by name: a user's FSDPBlock is a module."""
    kind = type(module)
    label = f"module {name!r} is" if name else "the model is"
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"{label} a DistributedDataParallel wrapper, whose all-reduces run in "
                        "autograd hooks that pebble.torch's step does not run (each rank would "
                        "keep its own gradients): give the module inside it (ddp.module), and "
                        "process_group= for data parallelism that pebble plans")
    if isinstance(module, _sharding_wrappers()):
        raise TypeError(f"{label} sharded by FSDP (class {kind.__name__}), whose gathers and "
                        "reduce-scatters run in hooks that pebble.torch's step does not run "
                        "(each rank would keep its own gradients): give the module as built, "
                        "before FSDP wraps or shards it, with process_group= and shard='full' "
                        "for sharding that pebble plans")
    engine = _engine_wrapper(module)
    if engine is not None:
        raise TypeError(f"{label} {engine} (class {kind.__name__}), whose gradient reductions "
                        "run in hooks that pebble.torch's step does not run (each rank would "
                        "keep its own gradients): give the module as built, before it is "
                        "wrapped, with the optimizer and process_group= for data parallelism "
                        "that pebble plans (shard='full' to shard it)")
    # (on one device or none, DataParallel's forward calls the module itself)
    if isinstance(module, torch.nn.DataParallel) and len(module.device_ids or ()) > 1:
        raise TypeError(f"{label} a DataParallel wrapper, which replicates the module over "
                        "several GPUs; pebble.torch runs a step on one device: give the "
                        "module inside it (dp.module), and for several GPUs one process "
                        "each with process_group=")


def _refuse_uninitialized(model):
    """ValueError naming a parameter or buffer of a lazy module (nn.LazyLinear)
    that has no shape yet: the step's signature and its trace need them all."""
    for kind, named in (("parameter", model.named_parameters()),
                        ("buffer", model.named_buffers())):
        for name, t in named:
            if torch.nn.parameter.is_lazy(t):
                raise ValueError(f"{kind} '{name}' is not initialized yet (a lazy module, such "
                                 "as nn.LazyLinear, makes it at its first call): run the module "
                                 "once on an example batch (model(x)) before train_step")


def _device_of(model, tensors):
    """The one device of the module and `tensors` (a tensor on the meta
    device aside: Note [A module built in shards])."""
    devices = {t.device for t in list(model.parameters()) + list(model.buffers())
               if not t.is_meta}
    devices |= {t.device for t in tensors}
    if len(devices) != 1:
        raise CaptureError(f"module {type(model).__name__} and its inputs span several devices "
                           f"({', '.join(sorted(str(d) for d in devices))}): pebble.torch "
                           "runs a step on one")
    device = devices.pop()
    if device.type not in ("cpu", "cuda"):
        raise CaptureError(f"device {device}: pebble.torch runs on the CPU or a CUDA GPU")
    return device


def _refuse_bare_small_number(budget):
    """A budget of a bare number under 1024 ("60", 60, "0.6") reads as a
    percentage or a fraction, not a handful of bytes: refused, with the
    readings it may have meant (as the command line refuses it)."""
    text = str(budget).strip() if isinstance(budget, (str, int, float)) else ""
    try:
        value = float(text)
    except ValueError:
        return
    if isinstance(budget, bool) or not 0 < value < 1024:
        return
    percent = f"{100 * value:g}%" if value < 1 else f"{text}%"
    other = f"{text}B" if value == int(value) else f"{text}GiB"
    raise ValueError(f"budget {budget!r}: did you mean '{percent}' or '{other}'? (a number "
                     "without a unit is bytes only from 1024 up)")


def _whole_bytes(budget):
    """A budget of bytes given as another number than a Python int (a float
    such as 0.8 * a device's memory, a NumPy integer): an int, a float
    rounded down as the command line rounds '1.5e9'; a negative or
    non-finite one refused. Anything else as it is (pebble.plan names what
    it refuses)."""
    if isinstance(budget, bool):
        return budget
    if isinstance(budget, numbers.Integral):
        return int(budget)
    if isinstance(budget, numbers.Real):
        if not (math.isfinite(budget) and budget >= 1024):
            raise ValueError(f"budget {budget!r}: a number of bytes must be finite and from "
                             "1024 up (or give a str: '60%', '2GiB', 'min')")
        return int(budget)
    return budget


def _size(nbytes):
    """Bytes for people: "512 B", "4.2 KiB", "61.1 MiB", "1.50 GiB"."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} GiB"


def _mib(nbytes):
    return f"{nbytes / 2**20:.1f} MiB"
