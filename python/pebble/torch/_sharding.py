"""Sharded training under a plan: train_step(..., process_group=pg, shard="full").

ZeRO-3 / FSDP FULL_SHARD: each rank keeps 1/ranks of every trainable
parameter (its shard: the parameter flattened, ceil(numel / ranks)
elements, the last ranks' padded with zeros), of its gradient and of its
optimizer state. pebble.shard rewrites the captured step (Note [Sharded
graphs] in scheduler/sharding.cc): the parameter `p` is its shard, a
collective `gather:p` makes the whole parameter for its readers,
`local_grad:p` is this rank's gradient and `grad:p` its reduce-scatter,
which the optimizer's updates read. The plan decides when each parameter is
gathered, how long the gathered copy lives and whether it is gathered again
for the backward.

Note [Writes between sharded steps]: between steps the module's parameters
are empty stand-ins; the shards, which the step holds, are what trains. A
write into a stand-in (a weight clamped under torch.no_grad() after each
step, an nn.init call, new .data) reached no shard and was lost without a
word until 2026-12-07. Now release() records each stand-in's version, and
the next call refuses on every rank where one moved or holds elements,
naming the parameter (TrainStep._written_shards_refusal; the stand-ins are
released again, so the step stays usable without the write).
TrainStep.whole_parameters() is the way to write: it gathers every
parameter whole on every rank (make_whole), and after the block keeps this
rank's part of what it wrote in its shards (keep_written; no collective).

Note [Gathers in flight]: a gather makes the whole parameter (its node,
resident from its step: zeros, this rank's shard written in its place) and
sums it over the ranks with one asynchronous all-reduce of
torch.distributed, in place (gloo, the CPU's backend, stages an all-gather
in buffers of its own, outside the plan). The steps after it run while it
is in flight, as the plan times it; it completes before a later step reads
or frees the parameter (_RunState.wait_before). Its storage is freed through
itself once the plan lets go of it: gloo's worker thread lets go of a tensor
a moment after its collective, and a free there would escape PyTorch's CPU
profiler (and the measured peak).

Note [One staging buffer for the reduce-scatters]: gloo has no
reduce-scatter. Each rank holds one staging buffer per dtype, of the
largest parameter's elements (rounded up to the allocator's block once the
step is planned), made before the first step and kept (the graph counts
it: a persistent node "staging:<dtype>"). A reduce-scatter
copies the local gradient into it, divides it by the number of ranks (as
FSDP averages) and starts one asynchronous all-reduce of it; the gradient's
shard (its node, resident from its step, zeros until then) takes this
rank's part once the all-reduce completes: before a step reads or frees the
shard, before the next reduce-scatter of that dtype reuses the buffer, or at
the end (ShardedRunner.settle). The steps in between run while it is in
flight, as the plan times it. The local gradient keeps its own value and is
free from the copy on (another gradient may be a view of its storage, and
the plan may reduce-scatter it again), and the buffer is the plan's memory.
One buffer serialises the reduce-scatters of a dtype, as the plan's one
network stream does; the compute waits for the previous one only where the
next starts before it is done.

Note [A unit's collectives as one message]: a plan may join a unit's
gathers, or its reduce-scatters, in a bucket (consecutive compute steps
with one "bucket" number: docs/semantics.md, "Buckets of collectives"), one
message each, as FSDP sends its flat parameter. The bucket's first step
sends it:
- gathers: one flat tensor of the members' bytes side by side (each its
  node's bytes, rounded as the plan rounds them), zeros but this rank's
  shard of each, summed by one all-reduce; each gathered parameter is a view
  of its place. The flat storage goes once its last member is freed, so a
  bucket goes as one message only where the plan frees its members in one
  run of free steps (nothing allocated between: the plan's peak holds);
- reduce-scatters: the local gradients side by side in the staging buffer,
  one all-reduce; each shard takes its part as above. Only where they fit
  the staging buffer (its dtype's largest parameter), one dtype: pebble's
  planners make no larger bucket (their cap is the staging node's bytes).
Any other bucket (one of several dtypes, or of gathers that the plan frees
apart: only a schedule from elsewhere makes them) goes member by member,
one message each: the plan's memory exactly, its time not
(ShardedRunner._messages decides; report["sharding"] counts the messages
sent and planned).

Both move twice the bytes of an all-gather or a reduce-scatter (the plan
times the latter): NCCL's own collectives would spare that, and the
reduce-scatter's buffer, and wait for a GPU to be checked.

Note [Shards on the host]: with optimizer_state="host" or "auto" the
optimizer's state shards live where the plan keeps them (opt.state, as
unsharded), and with optimizer_updates="host" or "auto" an update may run
on the host (ZeRO-Offload's rule, on 1/ranks of the state). Such an update
reads host copies of the parameter's shard and of its gradient's shard: the
plan offloads both ("offload shard:p", "offload scatter:p" here), frees the
device shard, runs the update on the host copy and fetches the updated
shard back ("prefetch shard:p") before its next gather. Each host copy is
a buffer made with the runner (pinned beside a GPU) and kept between steps,
as the plan's host memory is; a fetched shard is a new device tensor, and
the shard it replaces went at the plan's free. After a failed run, a shard
the plan had freed is fetched back from its host copy (the updated value
where its update had run). A gathered parameter may be offloaded and
fetched back too, instead of gathered again.

With optimizer_parameters="host" (or "auto", per shard as the plan
resolves its home: _host_homes) a shard lives on the host between steps
(Shards.on_host; pinned beside a GPU), and is its own host copy: the plan
fetches a device copy ("prefetch shard:p", held in ShardedRunner.fetched)
for its gathers and a device update, offloads it back after the update,
and frees it; an update on the host writes it in place. Shards.place puts
each shard where the plan of the step's shapes keeps it, before the step.

The module's parameters hold no memory between steps (an empty tensor each,
as FSDP frees them): the shards are the parameters. full_state_dict()
gathers them for its duration; a capture (the first call of each shapes)
traces stand-ins of them and calibrates under FSDP's rule (Note [Stand-ins
for sharded parameters] in _capture.py, Note [Calibrating a sharded step]).
"""

import contextlib
import json
import math
import time

import torch

from .. import _core
from ._collective_ops import ALL_REDUCE_OP
from ._compat import free_storage, storage_bytes
from ._distributed import _collective, _global_rank, agree, drain
from ._executor import PlanExecutionError, Program
from ._optimizer import host_homes, state_dict_on_cpu
from ._memory import AllocatorPeak, allocated_where_profiled, round_up


# Note [A module built in shards]: a module whose parameters do not fit one
# device cannot be given whole. It may be given on the meta device instead
# (shapes, no data), as FSDP takes one: the step then makes it a module at a
# time, in modules() order. For each module, it makes the module's own
# tensors on the device, initialises them (param_init(module), FSDP's
# param_init_fn; by default the module's reset_parameters()) and sends rank
# 0's values to every rank. It then cuts this rank's shard of each trainable
# parameter and empties the whole. A rank so holds its shards and one
# module's tensors whole at most. PyTorch 1.13 cannot move a meta tensor's
# data in place (set_data refuses it), so each parameter is a new
# Parameter, put everywhere the meta one was: in every module that holds it
# (tied weights: the first module in modules() order that holds it makes
# and initialises it), in the optimizer's param_groups and in the plan's
# optimizer (Updates.rebind), as Module.to_empty does.
#
# What can be refused is refused before anything is made (_build_order). A
# floating tensor is made full of NaN, so that one its initialisation left
# unset is found (and refused); one it replaced by another object, too. The
# ranks agree after each module's initialisation, before its broadcasts (and
# once more after the last module's shards are cut), so that a rank that
# fails anywhere in the build (or runs out of memory) stops every rank at
# once; a failure puts the meta tensors back, leaving the module as given.
# So does a failure of the first step after the build, before the step is
# made (its capture, its plan: Shards.unbuild), so that the user may try
# again with other options; past that, the module is the step's.
def on_meta(model):
    """Whether any parameter or buffer of `model` is on the meta device."""
    return any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


def holds_whole_state(updates, ranks):
    """Whether the optimizer's state of `updates` has entries (its tensors of
    a parameter's shape: Updates.state_keys), each of its parameter's whole
    shape rather than a shard's over `ranks` (a state that an unsharded
    step left, or a saved full_optimizer_state_dict(), loaded)."""
    shapes = [(tuple(state[key].shape), tuple(p.shape), -(-p.numel() // ranks))
              for p in updates.params.values() for state in [updates.optimizer.state.get(p, {})]
              for key in updates.state_keys if torch.is_tensor(state.get(key))]
    # (a 1-D parameter of one element has its shard's shape: either way)
    told = [shape == whole for shape, whole, shard in shapes if whole != (shard,)]
    return bool(told) and all(told)


def _where(name, module):
    return (f"module '{name}'" if name else "the root module") + f" ({type(module).__name__})"


def _build_order(model, param_init, sharded, optimizer):
    """([(name, module, its own meta tensors (table, key, tensor), each
    once)] in the order build_in_shards makes them, {id(meta tensor):
    [(table, key)] of every module that holds it}); ValueError for what it
    would refuse: a module without an initialisation, one that would write a
    shared parameter already cut (`sharded`: {id: name}), a state of a meta
    parameter."""
    if any(id(p) in sharded and state for p, state in optimizer.state.items()):
        raise ValueError("the optimizer has a state of a parameter on the meta device: "
                         "make the optimizer anew")
    order, made, holders = [], set(), {}
    for name, module in model.named_modules():  # (each module, and so each table, once)
        own, cut = [], []
        for table in (module._parameters, module._buffers):
            for key, t in table.items():
                if t is None or not t.is_meta:
                    continue
                holders.setdefault(id(t), []).append((table, key))
                if id(t) in made:
                    if id(t) in sharded:
                        cut.append(key)
                elif all(id(t) != id(u) for _, _, u in own):
                    own.append((table, key, t))
        if not own:
            continue
        if cut:
            raise ValueError(f"{_where(name, module)} is on the meta device and shares "
                             f"parameter '{cut[0]}' with a module built before it, whose shards "
                             "are cut: pebble builds a module at a time, so its initialisation "
                             "would write a released tensor; give the shared parameter to one "
                             "module only, or build the module whole")
        if param_init is None and not callable(getattr(module, "reset_parameters", None)):
            raise ValueError(f"{_where(name, module)} has tensors on the meta device and no "
                             "reset_parameters(): give param_init=, a function that sets a "
                             "module's own parameters and buffers in place")
        made.update(id(t) for _, _, t in own)
        order.append((name, module, own))
    return order, holders


def _made_like(t, device):
    """A tensor (a Parameter where `t` is one, its attributes kept) on
    `device` of `t`'s shape and dtype; floating ones full of NaN, others zero
    (Note [A module built in shards])."""
    fill = float("nan") if t.dtype.is_floating_point or t.dtype.is_complex else 0
    data = torch.full(t.shape, fill, dtype=t.dtype, device=device)
    if not isinstance(t, torch.nn.Parameter):
        return data
    new = torch.nn.Parameter(data, requires_grad=t.requires_grad)
    new.__dict__.update(t.__dict__)
    return new


def _initialised(name, module, made, param_init):
    """Runs the module's initialisation on its new tensors `made` ([(table,
    key, meta tensor, new)]); ValueError where it fails, replaces one or
    leaves one unset."""
    where = _where(name, module)
    try:
        (param_init or (lambda m: m.reset_parameters()))(module)
    except Exception as e:
        raise ValueError(f"initialising {where} failed: {type(e).__name__}: {e}") from e
    for table, key, _, new in made:
        if table.get(key) is not new:
            raise ValueError(f"the initialisation of {where} replaced '{key}' by another "
                             f"tensor: set it in place (module.{key}.copy_(...) under "
                             "torch.no_grad())")
        if (new.dtype.is_floating_point or new.dtype.is_complex) and \
                bool(torch.isnan(new).any()):
            raise ValueError(f"the initialisation of {where} left '{key}' unset (its "
                             "reset_parameters() does not set every tensor of the module): "
                             "give param_init=, which sets each of the module's own tensors")


class _Built:
    """What build_in_shards made of a module's meta tensors: `parameters`
    ({id(meta parameter): its new parameter}), `meta_of` ({id(new
    parameter): its meta parameter}), and undo(), which puts every meta
    tensor back in the modules that held it."""

    def __init__(self, replaced, holders):
        self._replaced, self._holders = replaced, holders  # id(meta) -> (meta, new)
        pairs = [(t, new) for t, new in replaced.values() if isinstance(t, torch.nn.Parameter)]
        self.parameters = {id(t): new for t, new in pairs}
        self.meta_of = {id(new): t for t, new in pairs}

    def undo(self):
        for t, _ in self._replaced.values():
            for holder, holder_key in self._holders[id(t)]:
                holder[holder_key] = t


def build_in_shards(model, device, group, param_init, sharded, keep_shard, optimizer):
    """Makes every meta tensor of `model` on `device`, a module at a time
    (Note [A module built in shards]). `sharded`: {id(meta parameter): its
    name} of those to shard: keep_shard(name, whole) takes each one's new
    tensor (rank 0's values), which is then emptied. Returns a _Built. On
    any failure, on any rank, every rank raises and the module is as
    given."""
    import torch.distributed as dist
    order, holders = _build_order(model, param_init, sharded, optimizer)
    replaced = {}  # id(meta tensor) -> (meta tensor, new)
    src = _global_rank(group, 0)
    broadcast = []  # the previous module's new tensors, rank 0's values: to cut
    try:
        # Each agree covers what may fail on one rank since the last
        # collective: the previous module's cut, this module's tensors and
        # initialisation (a last one, the last module's cut).
        for entry in order + [None]:
            error, made = None, []
            try:
                with torch.no_grad():
                    for t, new in broadcast:
                        if id(t) in sharded:
                            keep_shard(sharded[id(t)], new)
                            new.data = torch.empty(0, dtype=new.dtype, device=device)
                    broadcast = []
                    if entry is not None:
                        name, module, own = entry
                        for table, key, t in own:
                            new = _made_like(t, device)
                            replaced[id(t)] = (t, new)
                            for holder, holder_key in holders[id(t)]:
                                holder[holder_key] = new
                            made.append((table, key, t, new))
                        _initialised(name, module, made, param_init)
            except Exception as e:  # noqa: BLE001 (raised again by agree, on every rank)
                error = e
            agree(error, group)
            with torch.no_grad():
                for _, _, _, new in made:  # rank 0's values on every rank
                    _collective(f"sharing rank 0's values of {_where(name, module)}",
                                dist.broadcast, new, src=src, group=group)
            broadcast = [(t, new) for _, _, t, new in made]
    except BaseException:
        _Built(replaced, holders).undo()  # the module as given
        raise
    return _Built(replaced, holders)


class Shards:
    """This rank's shards of the trainable parameters of `model` (those of
    `updates`, the optimizer in the plan), over the ranks of `group`. A
    module on the meta device is made here, on `device`, a module at a time
    (build_in_shards; `param_init` as it takes it)."""

    def __init__(self, model, group, updates, device=None, param_init=None):
        import torch.distributed as dist
        self.dist = dist
        self.model = model
        self.group = group
        self.ranks = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.ranks < 2:
            raise ValueError("shard='full' shards over 2 ranks or more; this process group "
                             "has 1 (shard='none' trains it whole)")
        self.params = dict(updates.params)  # name -> the module's parameter
        meta = on_meta(model)
        for name, p in self.params.items():
            if meta and not p.is_meta:
                raise ValueError(f"parameter '{name}' is on {p.device} and others on the meta "
                                 "device: give every parameter and buffer on the meta device "
                                 "(built in shards), or none")
            if p.numel() == 0:
                raise ValueError(f"parameter '{name}' has no elements: a module that another "
                                 "train_step shards, or sharded before one of its steps failed, "
                                 "has empty parameters (make one TrainStep per module; after a "
                                 "failed step, a new module from a checkpoint); an empty "
                                 "parameter of your own cannot be sharded (freeze it)")
            if p.grad is not None:
                raise ValueError(f"parameter '{name}' has a .grad: a sharded step makes each "
                                 "rank's gradient shards itself; clear the gradients first "
                                 "(optimizer.zero_grad(set_to_none=True))")
            if p.storage_offset() != 0 or storage_bytes(p) != p.numel() * p.element_size() \
                    or not p.is_contiguous():
                raise ValueError(f"parameter '{name}' is a view of a larger storage or not "
                                 "contiguous: shard='full' shards parameters that own their "
                                 "storage")
        self.shapes = {name: tuple(p.shape) for name, p in self.params.items()}
        if device is None:
            device = next(iter(self.params.values())).device
        self.shards = {}  # name -> this rank's shard (flat, padded), where it lives
        # A clipped step's clipping nodes -> workspace (Note [Clipping sharded gradients])
        self.clip_workspace = {}
        self.on_host = set()  # the names whose shard lives on the host between steps
        self._built = None  # a module built here: its _Built, until the first step is made
        self._updates = updates
        if meta:
            def keep_shard(name, whole):
                self.shards[name] = self._shard_of(name, whole)

            self._built = build_in_shards(
                model, device, group, param_init,
                {id(p): name for name, p in self.params.items()}, keep_shard,
                updates.optimizer)
            updates.rebind(self._built.parameters)
            self.params = dict(updates.params)
            self.released = True  # (unbuild() puts the meta tensors back)
            self.released_versions = {name: p._version for name, p in self.params.items()}
            try:
                self._make_staging(device)
            except BaseException:
                self.unbuild()  # the module as given (agreed() raises on every rank)
                raise
        else:
            for name, p in self.params.items():
                self.shards[name] = self._shard_of(name, p)
            # The parameters stay whole until the first step is planned
            # (release()), so that a failure on the way leaves the module as
            # it was.
            self.released = False
            self._make_staging(device)
        # Note [Scalars without allocations] (_optimizer.py): a held 0-dim
        # tensor divides.
        self._ranks = torch.full((), float(self.ranks))
        self.round_to = 1  # the allocator's granularity (shard_graph)

    def _make_staging(self, device):
        """dtype -> the staging buffer (Note [One staging buffer for the
        reduce-scatters]); made after the build's last collective, so that a
        failure here on one rank meets the others at agreed()'s."""
        self.staging = {}
        for name, shape in self.shapes.items():
            dtype, numel = self.params[name].dtype, math.prod(shape)
            held = self.staging.get(dtype)
            if held is None or held.numel() < numel:
                self.staging[dtype] = torch.empty(numel, dtype=dtype, device=device)

    def unbuild(self):
        """After the first step of a module built here failed (its capture,
        its plan): the module and the optimizer as given, on the meta
        device, with no state of the new parameters (Note [A module built
        in shards]). Nothing where the module was given whole."""
        if self._built is None:
            return
        self._built.undo()
        for new in self._built.parameters.values():
            self._updates.optimizer.state.pop(new, None)
        self._updates.rebind(self._built.meta_of)
        self._built = None

    def built(self):
        """The first step is made: a later failure keeps what was built."""
        self._built = None

    def _shard_of(self, name, whole):
        """This rank's shard of the parameter `name`, from its `whole` tensor."""
        shard = torch.zeros(self.shard_numel(name), dtype=whole.dtype, device=whole.device)
        lo, hi = self.bounds(name)
        with torch.no_grad():
            shard[:hi - lo].copy_(whole.detach().reshape(-1)[lo:hi])
        return shard

    def cut_state(self, name, t):
        """This rank's shard of a state entry `t` of parameter `name` that is
        whole (the parameter's shape: a state saved by an unsharded step, or
        by step.full_optimizer_state_dict()); None where `t` has another
        shape."""
        if tuple(t.shape) != self.shapes[name]:
            return None
        return self._shard_of(name, t)

    def shard_numel(self, name):
        return -(-math.prod(self.shapes[name]) // self.ranks)

    def held_bytes(self, t):
        """The device memory a tensor made here holds, as the plan counts it."""
        return round_up(t.numel() * t.element_size(), self.round_to)

    def shard_held_bytes(self, name):
        """The device memory of a shard of `name` (or of its gradient's), as
        the plan counts it."""
        item = self.params[name].element_size()
        return round_up(self.shard_numel(name) * item, self.round_to)

    def bounds(self, name):
        """[lo, hi): the elements of the flattened parameter in this rank's shard."""
        numel = math.prod(self.shapes[name])
        s = self.shard_numel(name)
        return min(numel, self.rank * s), min(numel, (self.rank + 1) * s)

    @property
    def step_device(self):
        """The device the step runs on: its staging buffers'."""
        return next(iter(self.staging.values())).device

    @property
    def shard_bytes(self):
        """The device memory of the shards held there between steps."""
        return sum(self.held_bytes(s) for name, s in self.shards.items()
                   if name not in self.on_host)

    def place(self, on_host):
        """Each shard where a plan keeps it between steps: on the host (pinned
        beside a GPU) for the names in `on_host`, else on the device (Note
        [Shards on the host]). Outside the step: a shard moves where a plan
        of other shapes kept it elsewhere."""
        for name, shard in self.shards.items():
            device = self.params[name].device
            if name in on_host and name not in self.on_host:
                self.shards[name] = torch.empty(
                    shard.shape, dtype=shard.dtype, device="cpu",
                    pin_memory=device.type == "cuda").copy_(shard)
            elif name not in on_host and name in self.on_host:
                self.shards[name] = shard.to(device)
        self.on_host = set(on_host)

    # --- whole parameters --------------------------------------------------------

    def gather(self, names, nbytes=None, sources=None, local=False, collectives=None):
        """The whole parameters `names` (one dtype; one, or a bucket's: Note
        [A unit's collectives as one message]) as views of one new flat
        tensor, each at a place of its `nbytes` (the plan's bytes of its
        gathered node; default: its own), and the work of the ranks' one
        all-reduce that makes them: wait for it before reading them (Note
        [Gathers in flight]). `sources`: each one's shard on the device,
        where it is not self.shards' (a shard whose home is the host).
        `local`: no collective (the work None): this rank's shards in place,
        zeros elsewhere (Note [Calibrating a sharded step]); otherwise the
        all-reduce starts through `collectives` (a StepCollectives)."""
        if sources is None:
            sources = [self.shards[name] for name in names]
        first = self.params[names[0]]
        item = first.element_size()
        if nbytes is None:
            nbytes = [math.prod(self.shapes[name]) * item for name in names]
        places, total = [], 0
        for name, size in zip(names, nbytes):
            places.append((name, total))
            total += -(-size // item)
        flat = torch.zeros(total, dtype=first.dtype, device=first.device)
        for (name, offset), source in zip(places, sources):
            lo, hi = self.bounds(name)
            flat[offset + lo:offset + hi].copy_(source[:hi - lo])
        work = None if local else collectives.all_reduce(
            flat, self.gather_what(names[0], len(names)))
        wholes = [flat[offset:offset + math.prod(self.shapes[name])].view(self.shapes[name])
                  for name, offset in places]
        return wholes, work

    def reduce_scatter(self, names, grads, collectives):
        """Starts the reduce-scatter of the local gradients `grads` of `names`
        (one, or a bucket's of one dtype that fit the staging buffer side by
        side): one all-reduce on the staging buffer, which stays busy until
        complete_scatter() has run for each (Note [One staging buffer for the
        reduce-scatters]). Returns this rank's shards, new tensors that hold
        the gradients averaged over the ranks once complete, each gradient's
        offset in the buffer, and the work."""
        buffer = self.staging[grads[0].dtype]
        offsets, total = [], 0
        for grad in grads:
            offsets.append(total)
            buffer[total:total + grad.numel()].view(grad.shape).copy_(grad)
            total += grad.numel()
        buffer = buffer[:total]
        buffer.div_(self._ranks)
        # (made before the all-reduce starts: a failure then leaves none in flight)
        shards = [torch.zeros(self.shard_numel(name), dtype=grad.dtype, device=grad.device)
                  for name, grad in zip(names, grads)]
        work = collectives.all_reduce(buffer, self._scatter_what(names[0], len(names)))
        return shards, offsets, work

    def complete_scatter(self, name, shard, work, collectives, offset=0):
        """Waits for the reduce-scatter `work` of `name` (through
        `collectives`) and copies this rank's part of the staging buffer (its
        gradient from `offset`) into `shard`."""
        collectives.wait(work, self._scatter_what(name))
        lo, hi = self.bounds(name)
        shard[:hi - lo].copy_(self.staging[shard.dtype][offset + lo:offset + hi])

    @staticmethod
    def gather_what(name, members=1):
        more = f" and {members - 1} more in one message" if members > 1 else ""
        return f"the all-gather of parameter '{name}'{more}"

    @staticmethod
    def _scatter_what(name, members=1):
        more = f" and {members - 1} more in one message" if members > 1 else ""
        return f"the reduce-scatter of the gradient of '{name}'{more}"

    @property
    def staging_bytes(self):
        return sum(self.held_bytes(b) for b in self.staging.values())

    @contextlib.contextmanager
    def full_parameters(self, collectives):
        """The module's parameters whole for the block's duration (a collective
        through `collectives`: every rank enters it together), released
        afterwards where they were (full_state_dict())."""
        if not self.released:
            yield
            return
        try:
            self.make_whole(collectives)
            yield
        finally:
            self.release()

    def make_whole(self, collectives):
        """Each of the module's parameters whole (gathered: a collective
        through `collectives`, every rank together)."""
        with torch.no_grad():
            for name, p in self.params.items():
                (whole,), work = self.gather([name], collectives=collectives)
                collectives.wait(work, self.gather_what(name))
                p.data = whole

    def keep_written(self):
        """This rank's shards made of the module's whole parameters as they
        are now (what a block wrote into them: TrainStep.whole_parameters),
        then released; no collective. ValueError where a parameter's shape
        changed (nothing is kept then, and the parameters are released)."""
        try:
            for name, p in self.params.items():
                if tuple(p.shape) != self.shapes[name]:
                    raise ValueError(f"parameter '{name}' has shape {tuple(p.shape)} after the "
                                     f"block, where its shards are of {self.shapes[name]}: "
                                     "nothing was kept")
            with torch.no_grad():
                for name, p in self.params.items():
                    lo, hi = self.bounds(name)
                    self.shards[name][:hi - lo].copy_(p.detach().reshape(-1)[lo:hi])
        finally:
            self.release()

    def written_while_released(self):
        """The name of a module parameter written since release() (in place:
        its version moved; or given data: it holds elements), else None:
        such a write reaches no shard (Note [Writes between sharded steps])."""
        if not self.released:
            return None
        for name, p in self.params.items():
            if p.numel() != 0 or p._version != self.released_versions.get(name):
                return name
        return None

    def reallocate_where_profiled(self, names):
        """The shards of `names` (those a plan frees) as copies allocated where
        the CPU profiler sees them, so that it measures their frees
        (_memory.allocated_where_profiled)."""
        fresh = allocated_where_profiled([self.shards[name] for name in names])
        for name, t in zip(names, fresh):
            self.shards[name] = t

    def release(self):
        """The module's parameters hold no memory from here: the shards are them."""
        for p in self.params.values():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.released_versions = {name: p._version for name, p in self.params.items()}
        self.released = True

    # --- the plan ----------------------------------------------------------------

    def shard_graph(self, graph, network, updates, round_to=1):
        """The whole-step graph (the optimizer's step in it) as this rank runs
        it sharded, each shard's bytes this runner's (rounded to `round_to`,
        the allocator's granularity, as the capture rounds); `updates` (the
        optimizer in the plan) takes the sharded state's and workspaces'
        bytes. ValueError where the graph shards other parameters than the
        optimizer's."""
        kwargs = {}
        if network is not None:
            kwargs["network"], kwargs["network_latency"] = network
        sharded = _core.shard(graph, self.ranks, **kwargs)
        doc = json.loads(sharded.to_json())
        self.round_to = round_to
        for dtype, buffer in self.staging.items():
            # The allocator's whole block, which the plan counts: a bucket of
            # reduce-scatters that the plan fits in it fits (_scatters_as_one).
            numel = self.held_bytes(buffer) // buffer.element_size()
            if numel > buffer.numel():
                self.staging[dtype] = torch.empty(numel, dtype=dtype, device=buffer.device)
        self._exact_bytes(doc, round_to)
        updates.planned_state_bytes = 0  # the state that may be resident (home not the host)
        for node in doc["nodes"]:
            if node["id"] in updates.state_bytes:
                updates.state_bytes[node["id"]] = node["bytes"]
                if node.get("home") != "host":
                    updates.planned_state_bytes += node["bytes"]
            if node["id"] in updates.workspace_bytes:
                updates.workspace_bytes[node["id"]] = node.get("workspace", 0)
        if updates.max_grad_norm is not None:
            add_clipping(doc, self, updates, network, round_to)
        for dtype, buffer in self.staging.items():  # what the ranks' collectives hold
            # (op staging_buffer: the fsdp rules cap a message of reduce-scatters at it)
            doc["nodes"].append({"id": f"staging:{str(dtype).replace('torch.', '')}",
                                 "op": "staging_buffer", "persistent": True,
                                 "bytes": self.held_bytes(buffer)})
        sharded = _core.from_json(json.dumps(doc))
        gathered = {node_id[len("gather:"):] for node_id in sharded.ids
                    if node_id.startswith("gather:")}
        missing = sorted(set(self.params) - gathered)
        if missing:
            raise ValueError(f"parameter '{missing[0]}' is trainable but the step reads it "
                             "without a gradient (or not at all): freeze it "
                             "(requires_grad=False) to train with shard='full'")
        return sharded

    def _exact_bytes(self, doc, round_to):
        """The sharded graph `doc` with the bytes this runner allocates: each
        shard (and the state and updates on it, and an update's temporary)
        and each reduce-scatter's output a shard's (held_bytes), rounded to
        `round_to`. (pebble.shard takes an element's size from bytes over
        elements, which the capture's rounding on a GPU breaks.)"""
        nodes = {n["id"]: n for n in doc["nodes"]}

        def storage(node_id):
            while nodes[node_id].get("alias_of") is not None:
                node_id = nodes[node_id]["alias_of"]
            return node_id

        owner = {name: name for name in self.params}  # a sharded storage -> its parameter
        for n in doc["nodes"]:
            _, _, name = n["id"].partition(":")
            if n.get("role") == "optimizer_state" and name in self.params:
                owner[n["id"]] = name
        for n in doc["nodes"]:
            name = owner.get(storage(n["id"]))
            if name is not None and (n.get("persistent") or n.get("in_place")):
                n["bytes"] = self.held_bytes(self.shards[name])
                if n.get("workspace"):
                    n["workspace"] = self.held_bytes(self.shards[name])
            elif n.get("op") == "reduce_scatter":
                n["bytes"] = self.held_bytes(self.shards[n["id"][len("grad:"):]])
            else:
                continue
            if round_to > 1:  # the shape no longer holds the bytes
                n.pop("shape", None)
                n.pop("dtype", None)

    def translate(self, schedule):
        """The sharded plan's steps with the capture's ids where the capture
        has the node: the local gradient "local_grad:p" is the capture's
        "grad:p"; the shard "p" becomes "shard:p" and the reduce-scatter
        "grad:p" "scatter:p", which the runner owns."""
        out = []
        for action, node_id, *bucket in schedule:
            if node_id in self.params:
                node_id = "shard:" + node_id
            elif node_id.startswith("local_grad:"):
                node_id = "grad:" + node_id[len("local_grad:"):]
            elif node_id.startswith("grad:") and node_id[len("grad:"):] in self.params:
                node_id = "scatter:" + node_id[len("grad:"):]
            # A unit's collectives keep their bucket (Note [A unit's
            # collectives as one message]).
            joined = bucket and node_id.partition(":")[0] in ("gather", "scatter")
            out.append((action, node_id, bucket[0]) if joined else (action, node_id))
        return out

    def full_state_dict(self, collectives):
        """The module's state_dict with every parameter whole (copies), on every
        rank (a collective through `collectives`)."""
        with self.full_parameters(collectives):
            return {k: v.detach().clone() for k, v in
                    self.model.state_dict().items()}

    def full_optimizer_state_dict(self, optimizer, keys, collectives):
        """optimizer.state_dict() with the entries `keys` of each sharded
        parameter's state whole (the parameter's shape), every tensor a copy
        on the CPU, on every rank (collectives through `collectives`, one
        entry at a time: the device holds one whole entry at most)."""
        names = {id(p): name for name, p in self.params.items()}

        def whole(p, key, shard):  # (an entry that holds no tensor is copied as it is)
            name = names.get(id(p))
            return None if name is None or key not in keys or not torch.is_tensor(shard) else \
                self._whole_entry(name, shard, collectives)
        return state_dict_on_cpu(optimizer, whole)

    def _whole_entry(self, name, shard, collectives):
        (whole,), work = self.gather([name], sources=[shard], collectives=collectives)
        collectives.wait(work, self.gather_what(name))
        return whole.cpu()  # (a tensor of its own: the gather's, exactly its size)


# Note [Clipping sharded gradients]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# FSDP clips by the norm of the whole gradients, which no rank holds: each
# rank takes the norm of its shards, and one all-reduce of a scalar sums
# their p-th powers (the largest magnitude: their maximum), as FSDP's own
# clip_grad_norm_ does. The sharded graph gains, after the reduce-scatters
# (add_clipping; the runner's nodes, ShardedRunner._clip_step):
#   clip_part:p  the norm of p's gradient shard (float32, one element);
#   clip_local   the p-th power of the norm of those norms (a stack of them
#                is its workspace);
#   clip_total   its all-reduce over the ranks (a collective of op
#                all_reduce), sum or max;
#   grad_norm    the whole gradients' norm (an output: step.grad_norm);
#   clip:p       p's gradient shard times min(1, max_norm / (grad_norm +
#                1e-6)), a new shard;
# and each update reads clip:p where it read grad:p. Each node's workspace
# is measured when the graph is made, on zeros of its operands' shapes, by
# the allocator (a bfloat16 shard's norm in float32 copies it first; a
# large reduction on a GPU takes scratch blocks): the same functions run
# in the step. The plan places and times them as any node: clip:p may be
# offloaded for an update on the host as a gradient shard is, and a scalar
# may go to the host and back too.
CLIP_KINDS = ("clip_part", "clip_local", "clip_total", "grad_norm", "clip")


def clip_part(g, p):
    """A gradient shard's p-norm, in float32 (FSDP's): a float64 shard's is
    taken in float64 and rounded (vector_norm's dtype= refuses narrowing)."""
    if g.dtype == torch.float64:
        return torch.linalg.vector_norm(g, p).float()
    return torch.linalg.vector_norm(g, p, dtype=torch.float32)


def clip_local(parts, p):
    """This rank's part of the whole norm: the p-th power of the norm of its
    shards' norms (their largest for math.inf), to be summed (maxed)."""
    stacked = torch.stack(parts)
    t = torch.linalg.vector_norm(stacked, p)
    del stacked
    return t if p == math.inf else t.pow_(p)


def clip_root(total, p):
    """The whole norm from the ranks' sum (or maximum)."""
    return total.clone() if p == math.inf else total.pow(1.0 / p)


def clip_scaled(g, norm, bound, eps):
    """g times min(1, bound / (norm + eps)), from held 0-dim tensors."""
    return g * torch.clamp(torch.div(bound, torch.add(norm, eps)), max=1.0)


def _clip_workspaces(shards, names, p, max_norm):
    """node id -> the workspace of each clipping node, as the allocator
    measures the function the runner calls on zeros of its operands'
    shapes (once per dtype and size), above its output."""
    device = shards.step_device
    scalar = lambda: torch.zeros((), device=device)  # noqa: E731
    bound, eps = torch.full((), max_norm, device=device), torch.full((), 1e-6, device=device)
    measured = {}

    def workspace(key, make_operands, fn):
        if key not in measured:
            operands = make_operands()
            with AllocatorPeak(device, collect=False) as meter:
                out = fn(*operands)
            measured[key] = round_up(max(0, meter.peak_bytes - shards.held_bytes(out)),
                                     shards.round_to)
            del out, operands
        return measured[key]

    out = {}
    for name in names:
        dtype, numel = shards.params[name].dtype, shards.shard_numel(name)
        shard = lambda: torch.zeros(numel, dtype=dtype, device=device)  # noqa: E731
        out[f"clip_part:{name}"] = workspace(("part", dtype, numel), lambda: (shard(),),
                                             lambda g: clip_part(g, p))
        out[f"clip:{name}"] = workspace(("scaled", dtype, numel), lambda: (shard(), scalar()),
                                        lambda g, norm: clip_scaled(g, norm, bound, eps))
    out["clip_local"] = workspace(("local", len(names)),
                                  lambda: ([scalar() for _ in names],),
                                  lambda parts: clip_local(parts, p))
    out["grad_norm"] = workspace(("root",), lambda: (scalar(),), lambda t: clip_root(t, p))
    return out


def add_clipping(doc, shards, updates, network, round_to):
    """The sharded graph document `doc` with the clipping of its gradient
    shards (Note [Clipping sharded gradients]), each update reading its
    clipped shard; `updates.inputs` and `touches` follow, and
    `shards.clip_workspace` holds each node's workspace."""
    nodes = {n["id"]: n for n in doc["nodes"]}
    names = [name for name in shards.params if f"grad:{name}" in nodes]
    scalar = round_up(4, round_to)
    link = {}
    if network is not None:
        link["network"], link["network_latency"] = network
    shards.clip_workspace = _clip_workspaces(shards, names, updates.grad_norm_type,
                                             updates.max_grad_norm)
    added = [{"id": f"clip_part:{name}", "op": "clip_part", "bytes": scalar,
              "cost": nodes[f"grad:{name}"]["bytes"] / 1e10, "inputs": [f"grad:{name}"],
              "role": "backward"} for name in names]
    added.append({"id": "clip_local", "op": "clip_local", "bytes": scalar, "cost": 1e-6,
                  "inputs": [f"clip_part:{name}" for name in names], "role": "backward"})
    added.append({"id": "clip_total", "op": ALL_REDUCE_OP, "collective": True, "bytes": scalar,
                  "cost": _core.collective_seconds("all_reduce", 4, shards.ranks, **link),
                  "inputs": ["clip_local"], "role": "backward"})
    added.append({"id": "grad_norm", "op": "clip_norm", "bytes": scalar, "cost": 1e-6,
                  "inputs": ["clip_total"], "role": "backward"})
    added += [{"id": f"clip:{name}", "op": "clip_scale", "bytes": nodes[f"grad:{name}"]["bytes"],
               "cost": nodes[f"grad:{name}"]["bytes"] / 1e10,
               "inputs": [f"grad:{name}", "grad_norm"], "role": "backward"} for name in names]
    for node in added:
        if shards.clip_workspace.get(node["id"]):
            node["workspace"] = shards.clip_workspace[node["id"]]
    doc["nodes"] += added
    doc["outputs"] = list(doc.get("outputs", [])) + ["grad_norm"]
    clipped = {f"grad:{name}": f"clip:{name}" for name in names}
    for node in doc["nodes"]:
        if node["id"] in updates.inputs:
            node["inputs"] = [clipped.get(i, i) for i in node["inputs"]]
            updates.inputs[node["id"]] = frozenset(node["inputs"])
            updates.touches[node["id"]] = frozenset(clipped.get(i, i)
                                                    for i in updates.touches[node["id"]])


# Note [Calibrating a sharded step]: the capture's calibration (each node's
# seconds and temporaries, _calibrate.py) runs the step, and run unplanned it
# would hold every parameter whole on every rank at once, which sharding is
# there to avoid. So a sharded capture is calibrated under FSDP's own rule
# (the `fsdp` policy on the sharded step without the optimizer's updates:
# each parameter gathered before its forward readers, freed after them,
# gathered again for the backward), run by the sharded runner without the
# reduce-scatters (nothing reads them without the updates): a rank holds its
# shards, the activations, and the parameters and local gradients in use.
# No collective runs: a gather there makes the whole parameter from this
# rank's shard alone (zeros elsewhere: the trace is fake, so no shape
# depends on the values, and neither do the kernels' times and
# temporaries). So a rank that fails there (out of memory) fails alone, and
# the ranks agree on it at once (agreed()), and a node's time never holds a
# collective's wait. Where that run does not fit the device (activations
# held whole, a batch beyond FSDP's), it runs under dtr's least-peak plan of
# the same sharded step instead (recomputing, gathering again where it
# recomputes, as an unsharded step falls back: Note [Calibrating under a
# plan]); where that does not fit either, the costs are estimated from the
# operands' sizes. The report says which.
def calibrate_sharded(nodes, device, persistent, shards):
    """The Calibration of the captured step `nodes` (a StepGraph), run under
    FSDP's rule on `shards`, or where that does not fit the device under
    dtr's least-peak plan (Note [Calibrating a sharded step]);
    `persistent`: every persistent node's tensor but the sharded
    parameters'. Its unplanned_peak_bytes is None: a sharded step's budget
    refers to pebble's baseline of the sharded step."""
    from ._calibrate import _FALLBACK_POLICY, calibrated_by_runs, estimated
    started = time.perf_counter()
    guess = estimated(nodes, "before calibration")
    document = nodes.document(guess.costs, "calibration", order_tokens=False)
    graph = _core.shard(_core.from_json(json.dumps(document)), shards.ranks)

    def under(policy, budget):
        def make():
            plan = _core.plan(graph, policy=policy, budget=budget, ranks=shards.ranks,
                              buckets="none")
            if not plan.feasible:
                raise PlanExecutionError(f"internal: {policy} cannot plan the sharded step to "
                                         f"calibrate it: {plan.message}")
            schedule = [(action, node_id) for action, node_id, *_ in
                        shards.translate(plan.schedule) if not node_id.startswith("scatter:")]
            runner = ShardedRunner(shards, _NoUpdates(), nodes, schedule, local_gathers=True)
            return Program(nodes, schedule, device, foreign=runner)
        return make

    fallback = f"{_FALLBACK_POLICY}'s least-peak plan"
    result = calibrated_by_runs(
        nodes, [(under("fsdp", "100%"), "measured under FSDP's rule (a sharded step)",
                 lambda error: f"FSDP's rule ({error})"),
                (under(_FALLBACK_POLICY, "min"),
                 f"measured under {fallback} (a sharded step that does not fit the device "
                 "under FSDP's rule)", lambda error: f"{fallback} ({error})")],
        persistent, device, guess,
        lambda whys: "the sharded step does not fit the device under " + ", nor under ".join(whys))
    result.seconds = time.perf_counter() - started
    return result


class _NoUpdates:
    """The optimizer of a calibration run: none (Note [Calibrating a sharded step])."""

    touches = {}

    @staticmethod
    def owns(node_id):
        return False

    def begin(self, run):
        pass

    def abort(self):
        pass

    def finish(self, run):
        pass


class ShardedRunner:
    """The program's runner of the steps on nodes outside the capture (Note
    [Steps of the optimizer] in _executor.py) for a sharded plan: the
    gathers and reduce-scatters here, the optimizer's steps by `updates`,
    which read the shards (_ShardValues)."""

    def __init__(self, shards, updates, capture_nodes, schedule, local_gathers=False,
                 collectives=None):
        self.shards = shards
        # Gathers made from this rank's shards alone, no collective (a
        # calibration's: Note [Calibrating a sharded step]).
        self.local_gathers = local_gathers
        # The step's StepCollectives, through which each collective starts
        # and is waited for (Note [A rank that fails mid-step]); a step made
        # by replan() shares the shards, not the board.
        self.collectives = collectives
        self.updates = updates
        # Note [Clipping sharded gradients]: the bound (None: no clipping) and
        # the norm (a p-norm's p, or math.inf).
        self.max_grad_norm = getattr(updates, "max_grad_norm", None)
        self.norm_type = getattr(updates, "grad_norm_type", 2.0)
        self._clip_scalars = None  # (max_norm, 1e-6) held on the step's device: place_shards
        by_id = {n.id: n for n in capture_nodes.nodes}
        self.parameter = {name: by_id[name] for name in shards.params}
        self.gradient = {}
        for name in shards.params:
            node = by_id.get("grad:" + name)
            if node is None:
                raise PlanExecutionError(f"internal: the capture has no gradient of '{name}'")
            self.gradient[name] = node
        self.host_homed = self._host_homes(schedule)
        self._check(schedule)
        self.messages = self._messages(schedule)
        self.host = self._host_buffers(schedule)
        # The shards the plan frees (for their updates on the host), held on
        # the device between steps.
        self.freed_shards = sorted({node_id.partition(":")[2] for action, node_id, *_ in schedule
                                    if action == "free" and node_id.startswith("shard:")}
                                   - self.host_homed)
        self._new_run()
        self.retired = []  # (works, staging buffers) a failed run left in flight (abort)

    def _host_homes(self, schedule):
        """The parameters whose shard the plan keeps on the host between steps
        (optimizer_parameters="host", or "auto" where the plan chose it), by
        the rule the optimizer's state follows (_optimizer.host_homes)."""
        def shard_of(node_id):
            kind, _, name = node_id.partition(":")
            return name if kind == "shard" else None
        return host_homes(self.updates, schedule, shard_of, self.shards.params)

    def _host_buffers(self, schedule):
        """Note [Shards on the host]: a host buffer per shard, gradient shard
        or gathered parameter ("shard:p", "scatter:p", "gather:p") that the
        plan offloads, kept between steps."""
        buffers = {}
        for action, node_id, *_ in schedule:
            kind, _, name = node_id.partition(":")
            if action == "offload" and kind in ("gather", "shard", "scatter", "clip") and \
                    name in self.shards.params and node_id not in buffers and \
                    not (kind == "shard" and name in self.host_homed):  # (its home: Shards)
                shape = (self.shards.shapes[name] if kind == "gather" else
                         (self.shards.shard_numel(name),))
                p = self.shards.params[name]
                buffers[node_id] = torch.empty(shape, dtype=p.dtype, device="cpu",
                                               pin_memory=p.device.type == "cuda")
            elif action == "offload" and self._is_clip(node_id) and kind != "clip" and \
                    node_id not in buffers:  # a clipping scalar (float32)
                buffers[node_id] = torch.empty(
                    (), device="cpu", pin_memory=self.shards.step_device.type == "cuda")
        return buffers

    def _new_run(self):
        # The host copies current in this run: those its offloads made
        # (_host_buffers' keys), and the shards whose home is the host.
        self.on_host = {"shard:" + name for name in self.host_homed}
        self.fetched = {}  # name -> the device copy of a shard whose home is the host
        self.copied_out = {}  # host copy -> its offload's event, until the host reads it
        self.offloaded = {}  # host copy -> its offload's event, until the device copy goes
        self.ready = {}  # "shard:p", "scatter:p" -> its prefetch's event, until read
        self.fetching = {}  # host copy -> its last fetch's event (it reads the host buffer)
        self.scattered = {}  # name -> this run's gradient shard
        self.clipped = {}  # name -> this run's clipped gradient shard ("clip:p")
        # Note [Clipping sharded gradients]: the scalars' values, and the
        # all-reduce of clip_total in flight
        self.clip_values, self.clip_work = {}, None
        self.works = []  # this run's collectives (drained after a failure)
        # name -> its reduce-scatter's work, not complete yet: those of one
        # message a dtype, the one that holds that dtype's staging buffer
        self.scatters_in_flight = {}
        self.scatter_offset = {}  # name -> its gradient's offset in the staging buffer
        self.sent = {"gather": 0, "scatter": 0}  # the compute steps of each kind so far

    def _messages(self, schedule):
        """Per kind ("gather", "scatter"), per compute step of that kind in
        the plan's order: the parameters whose collectives that step sends,
        one message (its own; a whole bucket at the bucket's first step;
        none at a later step of a bucket sent so) (Note [A unit's
        collectives as one message])."""
        steps = list(schedule)
        messages = {"gather": [], "scatter": []}
        i = 0
        while i < len(steps):
            action, node_id, *bucket = steps[i]
            kind, _, name = node_id.partition(":")
            i += 1
            if action != "compute" or kind not in messages or name not in self.shards.params:
                continue
            members = [name]
            while bucket and i < len(steps) and list(steps[i][2:]) == bucket and \
                    steps[i][0] == "compute" and steps[i][1].partition(":")[0] == kind:
                members.append(steps[i][1].partition(":")[2])
                i += 1
            if len(members) > 1 and (self._gathers_as_one(members, steps, i) if kind == "gather"
                                     else self._scatters_as_one(members)):
                messages[kind] += [tuple(members)] + [()] * (len(members) - 1)
            else:
                messages[kind] += [(m,) for m in members]
        return messages

    def _gathers_as_one(self, members, steps, end):
        """Whether the gathers of `members` (the steps before `end`) may be
        one flat tensor: one dtype, and each member's next free after them
        in one run of free steps (its storage goes with the last)."""
        if len({self.shards.shards[m].dtype for m in members}) != 1:
            return False
        frees = []
        for m in members:
            at = next((j for j in range(end, len(steps))
                       if steps[j][0] == "free" and steps[j][1] == "gather:" + m), None)
            if at is None:
                return False
            frees.append(at)
        return all(steps[j][0] == "free" for j in range(min(frees), max(frees) + 1))

    def _scatters_as_one(self, members):
        """Whether the reduce-scatters of `members` fit the staging buffer
        side by side: one dtype, their gradients' elements together (the
        planners' buckets do: they cap them at the buffer's bytes)."""
        dtypes = {self.shards.shards[m].dtype for m in members}
        if len(dtypes) != 1:
            return False
        total = sum(math.prod(self.shards.shapes[m]) for m in members)
        return total <= self.shards.staging[dtypes.pop()].numel()

    def _check(self, schedule):
        """PlanExecutionError for a plan this runner cannot run: a shard, a
        gradient shard or a gathered parameter fetched before any offload
        made its host copy (a shard whose home is the host)."""
        offloaded = set()
        for action, node_id, *_ in schedule:
            kind, _, name = node_id.partition(":")
            if not self._is_clip(node_id) and (kind not in ("gather", "shard", "scatter") or
                                               name not in self.shards.params):
                continue
            if action == "offload":
                offloaded.add(node_id)
            if action == "prefetch" and node_id not in offloaded and \
                    not (kind == "shard" and name in self.host_homed):
                raise PlanExecutionError(f"the plan fetches '{node_id}' before any copy of it "
                                         "to the host, and it does not live there between "
                                         "steps")

    # --- the runner's protocol (_executor.Program) ------------------------------

    def owns(self, node_id):
        kind, _, name = node_id.partition(":")
        if kind in ("gather", "shard", "scatter") and name in self.shards.params:
            return True
        return self._is_clip(node_id) or self.updates.owns(node_id)

    def _is_clip(self, node_id):
        """Whether `node_id` is a node of the gradients' clipping."""
        kind, _, name = node_id.partition(":")
        return self.max_grad_norm is not None and kind in CLIP_KINDS and \
            (kind != "clip" or name in self.shards.params)

    def place_shards(self):
        """Before a run, outside any measurement: each shard where this plan
        keeps it between steps (Shards.place), and the clipping's held
        scalars on the step's device (where the staging buffers are)."""
        self.shards.place(self.host_homed)
        if self.max_grad_norm is not None and self._clip_scalars is None:
            device = self.shards.step_device
            self._clip_scalars = (torch.full((), self.max_grad_norm, device=device),
                                  torch.full((), 1e-6, device=device))

    def begin(self, run):
        self.retired = [(works, buffers) for works, buffers in self.retired
                        if not all(w.is_completed() for w in works)]
        self.updates.begin(_ShardValues(run, self))
        self._new_run()
        # The shards whose home is the host: held there from the step's
        # start, as the plan counts them.
        run.count_host(sum(self.shards.shard_held_bytes(n) for n in self.host_homed))

    def step(self, action, node_id, run):
        kind, _, name = node_id.partition(":")
        if kind == "gather" and name in self.shards.params and action in ("compute", "free"):
            if action == "compute":
                self._gather(self._next_message(kind, name), run)
                self._computed(node_id, run)
            else:
                run.take(self.parameter[name])  # (after its copies: _RunState.take)
        elif kind == "scatter" and name in self.shards.params and action == "compute":
            self._scatter(self._next_message(kind, name), run)
            self._computed(node_id, run)
        elif kind in ("gather", "shard", "scatter") and name in self.shards.params:
            self._move(action, node_id, run)
        elif self._is_clip(node_id):
            self._clip_step(action, node_id, run)
        else:
            self.updates.step(action, node_id, _ShardValues(run, self))

    # --- the gradients' clipping (Note [Clipping sharded gradients]) -------------

    def _clip_step(self, action, node_id, run):
        kind, _, name = node_id.partition(":")
        if kind == "clip" and action != "compute":
            self._move(action, node_id, run)  # (as a gradient shard moves)
            return
        if action in ("offload", "free", "prefetch"):
            self._move_clip_scalar(action, node_id, run)
            return
        if action != "compute":
            raise PlanExecutionError(f"internal: the plan {action}s '{node_id}'")
        if node_id in self.clip_values or (kind == "clip" and name in self.clipped):
            raise PlanExecutionError(f"the plan computes '{node_id}' again while it is resident")
        p = self.norm_type
        if kind == "clip_part":
            t = clip_part(self.device_shard("scatter:" + name, run), p)
        elif kind == "clip_local":
            t = clip_local([self._clip_value(n) for n in self.shards.clip_workspace
                            if n.startswith("clip_part:")], p)
        elif kind == "clip_total":
            t = self._clip_value("clip_local").clone()
            if self.collectives is not None:
                what = "the all-reduce of the gradients' norm"
                self.clip_work = (self.collectives.all_reduce(
                    t, what, op="MAX" if p == math.inf else "SUM"), what)
                self.works.append(self.clip_work[0])
        elif kind == "grad_norm":
            self._settle_clip_total()
            t = clip_root(self._clip_value("clip_total"), p)
        else:  # "clip": the shard times min(1, max_norm / (norm + 1e-6))
            bound, eps = self._clip_scalars  # (place_shards)
            t = clip_scaled(self.device_shard("scatter:" + name, run),
                            self._clip_value("grad_norm"), bound, eps)
            self.clipped[name] = t
        if kind != "clip":
            self.clip_values[node_id] = t
        run.hold(self.shards.held_bytes(t), self.shards.clip_workspace.get(node_id, 0))
        self._computed(node_id, run)

    def _move_clip_scalar(self, action, node_id, run):
        """An offload, free or fetch of a clipping scalar, through its host
        buffer (_host_buffers), counted as the plan counts a tensor's."""
        nbytes = round_up(4, self.shards.round_to)
        if action == "offload":
            if node_id == "clip_total":
                self._settle_clip_total()
            event = run.copy(self.host[node_id], self._clip_value(node_id))
            if event is not None:
                event.synchronize()  # (a scalar: its fetch may follow at once)
            if node_id not in self.on_host:
                self.on_host.add(node_id)
                run.count_host(nbytes)
            run.result.transfer_bytes += nbytes
        elif action == "free":
            if node_id == "clip_total":
                self._settle_clip_total()
            t = self.clip_values.pop(node_id, None)
            if t is None:
                raise PlanExecutionError(f"the plan frees '{node_id}', which is not resident")
            run.hold(-self.shards.held_bytes(t))
            if node_id == "clip_total":
                # gloo's worker thread lets go of the all-reduced scalar a
                # moment after the collective, where PyTorch's CPU profiler
                # misses the free: freed here, as _RunState frees the other
                # collectives' storages (4 bytes above the plan otherwise,
                # now and then, on a loaded machine).
                free_storage(t)
        else:  # prefetch
            if node_id not in self.on_host or node_id in self.clip_values:
                raise PlanExecutionError(f"the plan fetches '{node_id}', which has no host copy "
                                         "or is resident")
            t = torch.empty((), device=self.shards.step_device)
            event = run.copy(t, self.host[node_id])
            if event is not None:
                run.stream.wait_event(event)
            self.clip_values[node_id] = t
            run.hold(self.shards.held_bytes(t))
            run.result.transfer_bytes += nbytes

    def _clip_value(self, node_id):
        t = self.clip_values.get(node_id)
        if t is None:
            raise PlanExecutionError(f"the plan reads '{node_id}', which is not on the device")
        return t

    def _settle_clip_total(self):
        if self.clip_work is not None:
            work, what = self.clip_work
            self.clip_work = None
            self.collectives.wait(work, what)

    # --- shards on the host (Note [Shards on the host]) ---------------------------

    def device_shard(self, node_id, run):
        """The device tensor of "shard:p" or "scatter:p" (a gradient shard's
        reduce-scatter complete), its fetch complete for the compute stream."""
        kind, _, name = node_id.partition(":")
        if kind == "scatter":
            self.settle(name)
            t = self.scattered.get(name)
        elif kind == "clip":
            t = self.clipped.get(name)
        else:
            t = (self.fetched if name in self.host_homed else self.shards.shards).get(name)
        if t is None:
            raise PlanExecutionError(f"the plan reads '{node_id}', which is not on the device")
        event = self.ready.pop(node_id, None)
        if event is not None:
            run.stream.wait_event(event)
        return t

    def _put_device_shard(self, node_id, t):
        """`t` is the device tensor of "shard:p" or "scatter:p" (None: freed)."""
        kind, _, name = node_id.partition(":")
        held = (self.scattered if kind == "scatter" else self.clipped if kind == "clip" else
                self.fetched if name in self.host_homed else None)
        if held is None:
            self.shards.shards[name] = t
        elif t is None:
            del held[name]
        else:
            held[name] = t

    def _move(self, action, node_id, run):
        """An offload, free or fetch of a shard or of a gradient shard, or the
        offload or fetch of a gathered parameter (the captured parameter's
        node, which `run` holds: a copy of it to the host instead of a
        gather again, where the plan finds that faster)."""
        kind, _, name = node_id.partition(":")
        if kind == "gather":
            node = self.parameter[name]
            nbytes = node.nbytes
        else:
            nbytes = self.shards.shard_held_bytes(name)
        if action == "offload":
            t = run.device_value(node.id) if kind == "gather" else self.device_shard(node_id, run)
            event = run.copy(self._host_of(node_id), t)
            if event is not None:
                self.copied_out[node_id] = event
                if kind == "gather":  # run.take waits for it
                    run.offloaded[node.index] = event
                else:
                    self.offloaded[node_id] = event
            if node_id not in self.on_host:
                self.on_host.add(node_id)
                run.count_host(nbytes)
            run.result.transfer_bytes += nbytes
        elif action == "free":
            self.device_shard(node_id, run)  # (complete, and its fetch)
            event = self.offloaded.pop(node_id, None)
            if event is not None:  # the memory is the compute stream's once the copy is done
                run.stream.wait_event(event)
            self._put_device_shard(node_id, None)
            run.hold(-nbytes)
        elif action == "prefetch":  # (after its offload on the same copy stream)
            host = self.host_copy(node_id, synchronize=False)
            t = torch.empty(host.shape, dtype=host.dtype, device=run.device)
            event = run.copy(t, host)
            if kind == "gather":
                if event is not None:  # its readers wait for it (_RunState.compute)
                    run.ready[node.index] = event
                run.put(node, t)
            else:
                if event is not None:
                    self.ready[node_id] = event
                self._put_device_shard(node_id, t)
                run.hold(nbytes)
            if event is not None:
                self.fetching[node_id] = event
            run.result.transfer_bytes += nbytes
        else:
            raise PlanExecutionError(f"internal: the plan {action}s '{node_id}'")

    def host_copy(self, node_id, synchronize=True):
        """The host copy of "shard:p", "scatter:p" or "gather:p": an offload
        this run made it current, and (a shard) an update on the host may
        have written it since. `synchronize`: complete for the host to read
        (a fetch, queued after the offload on the copy stream, need not wait)."""
        if node_id not in self.on_host:
            raise PlanExecutionError(f"the plan reads the host copy of '{node_id}', which no "
                                     "offload made in this step")
        if synchronize:  # the offload into it done, and a fetch from it (the host may write)
            for event in (self.copied_out.pop(node_id, None), self.fetching.pop(node_id, None)):
                if event is not None:
                    event.synchronize()
        return self._host_of(node_id)

    def _host_of(self, node_id):
        """The host buffer of "shard:p", "scatter:p" or "gather:p": a shard
        whose home is the host is its own."""
        kind, _, name = node_id.partition(":")
        if kind == "shard" and name in self.host_homed:
            return self.shards.shards[name]
        return self.host[node_id]

    def _next_message(self, kind, name):
        """The parameters whose collectives of `kind` this step sends (_messages)."""
        i = self.sent[kind]
        self.sent[kind] += 1
        members = self.messages[kind][i] if i < len(self.messages[kind]) else None
        if members is None or (members and members[0] != name):
            raise PlanExecutionError(f"internal: the plan's {kind} of '{name}' is not the one "
                                     "its schedule had there")
        return members

    def _gather(self, members, run):
        """Note [Gathers in flight]: the whole parameters `members` (one, or a
        bucket's: Note [A unit's collectives as one message]), one all-reduce."""
        if not members:
            return  # sent with its bucket's first step
        nodes = [self.parameter[m] for m in members]
        # Each shard on the device (Note [Shards on the host]).
        sources = [self.device_shard("shard:" + m, run) for m in members]
        wholes, work = self.shards.gather(members, [n.nbytes for n in nodes], sources,
                                          local=self.local_gathers,
                                          collectives=self.collectives)
        # One storage: counted once, with every member's bytes.
        counted = [sum(n.nbytes for n in nodes)] + [0] * (len(nodes) - 1)
        what = self.shards.gather_what(members[0], len(members))
        for node, whole, nbytes in zip(nodes, wholes, counted):
            run.put(node, whole, nbytes)
            if work is not None:
                run.wait_before(node, lambda: self.collectives.wait(work, what))
        if work is not None:
            self.works.append(work)

    def _scatter(self, members, run):
        """The reduce-scatters of `members` (one, or a bucket's), one
        all-reduce of the staging buffer."""
        if not members:
            return  # sent with its bucket's first step
        for name in members:
            if name in self.scattered:
                raise PlanExecutionError(f"internal: the plan reduce-scatters the gradient "
                                         f"of '{name}' while its shard is resident")
        grads = [run.device_value(self.gradient[name].id) for name in members]
        for previous in [n for n in self.scatters_in_flight
                         if self.scattered[n].dtype == grads[0].dtype]:
            self.settle(previous)  # the staging buffer is free once it is done
        shards, offsets, work = self.shards.reduce_scatter(members, grads, self.collectives)
        self.works.append(work)
        for name, shard, offset in zip(members, shards, offsets):
            self.scattered[name] = shard
            self.scatters_in_flight[name] = work
            self.scatter_offset[name] = offset
            run.hold(self.shards.held_bytes(shard))

    def settle(self, name):
        """The reduce-scatter of `name`'s gradient, if in flight, is complete:
        its shard holds this rank's part (Note [One staging buffer for the
        reduce-scatters])."""
        work = self.scatters_in_flight.get(name)
        if work is None:
            return
        self.shards.complete_scatter(name, self.scattered[name], work, self.collectives,
                                     self.scatter_offset.get(name, 0))
        del self.scatters_in_flight[name]  # in flight until it returns (abort)

    @staticmethod
    def _computed(node_id, run):
        """Counts a collective's compute as the plan counts it: a gather or a
        reduce-scatter run again is a recomputation."""
        run.result.computes += 1
        run.computed.add(node_id)

    def abort(self, grace_s=5.0):
        """After a failed run: waits up to `grace_s` seconds in all for the
        gathers and reduce-scatters still in flight, ignoring their failures
        (Note [Draining the collectives of a failed run] in _distributed.py).
        A reduce-scatter still running then keeps its staging buffer: the
        next run gets a new one, and the old one is held here until its
        collective is done (so that gloo's thread does not free it)."""
        self.updates.abort()
        drain(self.works, grace_s)
        self.fetched = {}  # (a shard whose home is the host keeps its last written value)
        for name, shard in self.shards.shards.items():
            if shard is None:  # freed for its update on the host: back from the host copy
                host = self.host["shard:" + name]
                self.shards.shards[name] = host.to(self.shards.params[name].device, copy=True)
        running = [w for w in self.scatters_in_flight.values() if not w.is_completed()]
        if running:
            self.retired.append((running, self.shards.staging))
            self.shards.staging = {dtype: torch.empty_like(buffer)
                                   for dtype, buffer in self.shards.staging.items()}
        self._new_run()

    def finish(self, run):
        for name in list(self.scatters_in_flight):
            self.settle(name)
        self._settle_clip_total()
        self.works = []
        self.updates.finish(run)
        if self.scattered or self.clipped:
            raise PlanExecutionError(f"internal: the plan keeps the gradient shard of "
                                     f"'{next(iter(self.scattered or self.clipped))}' past "
                                     "the step")
        if self.max_grad_norm is not None:  # the output; the other scalars freed
            run.result.grad_norm = self.clip_values.pop("grad_norm", None)
            if self.clip_values or run.result.grad_norm is None:
                raise PlanExecutionError("internal: the plan leaves the clipping's scalars "
                                         f"{sorted(self.clip_values)} past the step, or not "
                                         "its norm")
        away = [name for name, shard in self.shards.shards.items() if shard is None]
        if away:
            raise PlanExecutionError(f"internal: the plan leaves the shard of '{away[0]}' off "
                                     "the device after the step")
        if self.fetched:
            raise PlanExecutionError(f"internal: the plan leaves a device copy of the shard of "
                                     f"'{next(iter(self.fetched))}', whose home is the host, "
                                     "after the step")
        for event in self.ready.values():  # fetched shards complete before anyone reads them
            run.stream.wait_event(event)
        self.ready = {}
        for event in self.copied_out.values():  # and the host's (a shard whose home is there)
            event.synchronize()
        self.copied_out, self.fetching = {}, {}


class _ShardValues:
    """The program's run as the optimizer's updates see it in a sharded plan:
    the parameter `p` is its shard, "grad:p" the gradient's shard, "clip:p"
    its clipped copy (Note [Clipping sharded gradients])."""

    def __init__(self, run, runner):
        self._run = run
        self._runner = runner
        self.result = run.result

    def _runner_id(self, node_id):
        """The runner's id of the plan's parameter `p` ("shard:p") or gradient
        "grad:p" ("scatter:p"), or None for another node."""
        params = self._runner.shards.params
        if node_id in params:
            return "shard:" + node_id
        if node_id.startswith("grad:") and node_id[len("grad:"):] in params:
            return "scatter:" + node_id[len("grad:"):]
        if node_id.startswith("clip:") and node_id[len("clip:"):] in params:
            return node_id
        return None

    def device_value(self, node_id):
        own = self._runner_id(node_id)
        if own is None:
            return self._run.device_value(node_id)
        if own.startswith("scatter:") and own[len("scatter:"):] not in self._runner.scattered:
            raise PlanExecutionError(f"the plan's update reads '{node_id}' before its "
                                     "reduce-scatter")
        return self._runner.device_shard(own, self._run)

    def host_value(self, node_id):
        own = self._runner_id(node_id)
        if own is None:
            return self._run.host_value(node_id)
        return self._runner.host_copy(own)

    def hold(self, nbytes, workspace=0):
        self._run.hold(nbytes, workspace)

    def count_host(self, nbytes):
        self._run.count_host(nbytes)
