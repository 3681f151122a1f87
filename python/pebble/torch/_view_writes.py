"""In-place writes through views, made functional in a first trace (Note
[Writes through views]).

Note [Writes through views]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
A write into a part of a tensor (`y[:, 0] = 1.0`: a fill_ of select(slice(y)))
changes the tensor and every view of it, and autograd's backward of the
write (CopySlices) writes the gradient through an as_strided view in turn.
PyTorch's functionalize makes such writes functional, but PyTorch 1.13's
fails on some of them ("setStorage: ... out of bounds"), and it needs a
second trace. This rewrite does what functionalize does, for the views it
knows the inverse of:

- each storage written in place has a root, the first tensor of it (a call
  that made a fresh tensor, or a buffer), and every other tensor of it is a
  view of a tensor of it by one known view call (_SCATTERS, _RESHAPED,
  _PERMUTED, _SAME; _READ_ONLY ones, as expand, are made anew but not
  written through), or an in-place call's result (the tensor it wrote);
- a write computes its functional variant on the view's value now, and
  puts the result back into the root through the inverses of the views
  (select_scatter for select, ...), outermost last: the root's new value;
- a read of a tensor of the storage after a write reads that tensor made
  anew from the root's value now (the view calls again), as functionalize
  does; a buffer written gets a final copy_ of its new value.

Where a case is outside this (an unknown view of a written storage read
after a write, an input or parameter written, a write without a functional
variant but the first into a fresh tensor nothing else reads, which stays, a
value not laid out as the original), nothing is rewritten and functionalize
traces the graph again. as_strided addresses its input's storage, not the input: it is taken
on the root alone, where the root's value now is laid out as the root was.
"""

import operator

import torch

from ._compat import op_name, storage_key
from ._memory import is_dense

aten = torch.ops.aten

# View call -> its inverse, called as inverse(base, src, *the view's other
# arguments): base with src put where the view lies.
_SCATTERS = {
    "select": aten.select_scatter.default,
    "slice": aten.slice_scatter.default,
    "diagonal": aten.diagonal_scatter.default,
    "as_strided": aten.as_strided_scatter.default,
}
# Views that keep every element in its row-major order: the inverse reshapes
# src to the base's shape.
_RESHAPED = frozenset({"view", "_reshape_alias", "reshape", "squeeze", "unsqueeze",
                       "flatten", "unflatten"})
# Views that permute the dimensions: the inverse permutes them back.
_PERMUTED = frozenset({"t", "transpose", "permute"})
# Views that are the whole tensor.
_SAME = frozenset({"alias", "detach", "view_as"})
# Views that are made anew after a write but not written through (no inverse:
# their elements overlap).
_READ_ONLY = frozenset({"expand", "unfold"})


class _NotSimple(Exception):
    """A case the rewrite does not take: functionalize traces the graph."""


def functional_through_views(gm, nodes, values, slots, variant_of, fake_call, written_args):
    """(gm, values) with every in-place call of the first trace `gm` replaced
    by its functional variant (Note [Writes through views]), or None where a
    case is not one this rewrite takes. values: make_fx's fake values of the
    nodes, updated here; slots: the placeholders' slots (a buffer written
    gets a final copy_). variant_of, fake_call, written_args: the capture's
    (the functional variant of an in-place call, a call made anew on fake
    values, the arguments a call writes)."""
    try:
        rewrite = _Rewrite(gm.graph, nodes, values, slots, variant_of, fake_call, written_args)
    except _NotSimple:
        return None
    if not rewrite.storages:
        return None
    try:
        rewrite.run()
    except _NotSimple:
        # The graph is half rewritten: the caller traces it again.
        raise RuntimeError("a write through a view was not simple after all") from None
    return gm, values


class _Rewrite:
    """One pass over a first trace's nodes, in order, making its writes
    functional. Per written storage: `parent` of each of its tensors (None
    for the root), `version` (writes so far) and `now` (tensor -> (node of
    its value now, the version it was made at))."""

    def __init__(self, graph, nodes, values, slots, variant_of, fake_call, written_args):
        self.graph, self.nodes, self.values = graph, nodes, values
        self.variant_of, self.fake_call = variant_of, fake_call
        self.position = {n: k for k, n in enumerate(nodes)}
        self.storage = {n: storage_key(v) for n, v in values.items()
                        if isinstance(v, torch.Tensor)}
        self.writes = {}  # in-place call -> its functional variant
        written = {}      # storage key -> its writes, in order
        for n in nodes:
            names = n.op == "call_function" and written_args(n.target)
            if not names:
                continue
            x = n.args[0] if n.args else None
            schema = n.target._schema
            if names != [schema.arguments[0].name] or not isinstance(x, torch.fx.Node) or \
                    self.storage.get(x) is None or self.storage.get(n) != self.storage[x]:
                raise _NotSimple
            self.writes[n] = variant_of(n.target)
            written.setdefault(self.storage[x], []).append(n)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        self.buffers = {n for n, slot in zip(placeholders, slots) if slot.kind == "buffer"}
        in_storage = {}  # storage key -> its tensors, in order
        for n in nodes:
            if self.storage.get(n) in written:
                in_storage.setdefault(self.storage[n], []).append(n)
        self.parent = {}    # a tensor of a written storage -> the tensor it views or writes
        self.storages = {}  # storage key -> its root
        for key, writes in written.items():
            tensors = in_storage[key]
            if self._stays(tensors, writes):
                for w in writes:
                    del self.writes[w]
                continue
            self.storages[key] = self._tree(tensors, writes)
        self.version = dict.fromkeys(self.storages, 0)
        self.now = {}

    def _stays(self, tensors, writes):
        """Whether the storage's one write stays in place: a call without a
        functional variant (bernoulli_.float) that writes a fresh tensor
        nothing else reads, as functionalize leaves it."""
        return len(writes) == 1 and self._left_in_place(writes[0], tensors[0])

    def _left_in_place(self, write, root):
        """Whether `write`, a call without a functional variant, stays where
        it is: the first write of a fresh tensor that nothing else reads, or
        of a detach of it (a dropout's bernoulli_ into an empty_like, which
        div_ may write next), as functionalize leaves it. Else it is not
        simple."""
        if self.writes[write] is not None:
            return False
        x = write.args[0]
        while x is not root and x.op == "call_function" and op_name(x.target) in _SAME and \
                len(x.users) == 1:
            x = x.args[0]  # (the whole tensor: a detach of a new_empty, as stochastic depth's)
        if x is not root or x.op != "call_function" or x.target is operator.getitem or \
                len(x.users) != 1:
            raise _NotSimple
        return True

    def _tree(self, tensors, writes):
        """The storage's root; `parent` filled for its other tensors. A
        tensor of an unknown view is taken where nothing reads it, or a
        tensor of it, once the storage is first written."""
        root = tensors[0]
        if root.op == "placeholder" and root not in self.buffers:
            raise _NotSimple  # (an input or a parameter written: functionalize's error)
        if root.op not in ("placeholder", "call_function") or _views_input(root):
            raise _NotSimple
        first_write = self.position[writes[0]]
        opaque = set()
        for n in tensors[1:]:
            base = n.args[0] if n.op == "call_function" and n.args else None
            if n in self.writes or (base in self.parent or base is root) and _known_view(n):
                if n in self.writes and self._left_in_place(n, root) and n is not writes[0]:
                    raise _NotSimple
                if base in opaque:
                    raise _NotSimple
                self.parent[n] = base
                continue
            opaque.add(n)
            if self._read_after(n, first_write, opaque):
                raise _NotSimple
        for n, base in self.parent.items():
            if op_name(n.target) == "as_strided" and (
                    not self._is_root(base) or _overlaps_itself(self.values[n])):
                # (it addresses the storage: the root's alone; a view whose
                # elements overlap has no scatter that eager's writes match)
                raise _NotSimple
            if n in self.writes and any(op_name(v.target) in _READ_ONLY
                                        for v in self._path(n)):
                raise _NotSimple
        return root

    def _path(self, n):
        """The tensors from n to its storage's root, the root left out."""
        path = []
        while n in self.parent:
            path.append(n)
            n = self.parent[n]
        return path

    def _is_root(self, n):
        """Whether `n` is the root itself: the root, or a write of it."""
        while n in self.writes:
            n = n.args[0]
        return n not in self.parent

    def _read_after(self, n, first_write, opaque):
        """Whether a read of `n`, a tensor of an unknown view, may come at or
        after the storage's first write (a view of it counts as its reads)."""
        for user in n.users:
            if self.storage.get(user) == self.storage.get(n) and user not in self.writes:
                opaque.add(user)
                if self._read_after(user, first_write, opaque):
                    return True
            elif self.position[user] >= first_write:
                return True
        return False

    def run(self):
        output = next(n for n in reversed(self.nodes) if n.op == "output")
        for n in self.nodes:
            if n.op not in ("call_function", "output"):
                continue
            with self.graph.inserting_before(n):
                if n in self.writes:
                    self._write(n)
                elif n in self.parent:
                    self._view(n)
                else:
                    n.args = torch.fx.node.map_arg(n.args, self._current)
                    n.kwargs = torch.fx.node.map_arg(n.kwargs, self._current)
        for root in self.storages.values():
            latest = self._current(root)
            if root.op == "placeholder" and latest is not root:
                with self.graph.inserting_before(output):
                    back = self.graph.call_function(aten.copy_.default, (root, latest))
                self.values[back] = self.values[root]
        for n in reversed(self.nodes):
            if self.writes.get(n) is not None:
                self.graph.erase_node(n)
                del self.values[n]

    def _view(self, n):
        """A view of a written storage, made from its base's value now."""
        base_now = self._current(n.args[0])
        if base_now is not n.args[0]:
            original = self.values[n]
            n.args = (base_now,) + tuple(n.args[1:])
            self.values[n] = self.fake_call(n, self.values)
            _check_layout(self.values[n], original)
        self.now[n] = (n, self.version[self.storage[n]])

    def _write(self, n):
        """An in-place call replaced by its functional variant on the value
        now of the tensor it writes; the result put back into the root
        through the inverses of the views from it (the root's value now)."""
        key = self.storage[n]
        written = n.args[0]
        if self.writes[n] is None:  # (it stays: _left_in_place)
            n.args = torch.fx.node.map_arg(n.args, self._current)
            n.kwargs = torch.fx.node.map_arg(n.kwargs, self._current)
            self.version[key] += 1
            while True:  # (the root, and the whole-tensor views from it to the write)
                self.now[written] = (n, self.version[key])
                if written not in self.parent:
                    return
                written = self.parent[written]
        args = torch.fx.node.map_arg(n.args, self._current)
        kwargs = torch.fx.node.map_arg(n.kwargs, self._current)
        value = self._call(self.writes[n], args, kwargs, like=written, layout=False)
        if self._is_root(written):
            value = self._laid_out(value, args[0], written)
        view = written
        while view in self.parent:
            base = self.parent[view]
            if view not in self.writes:
                target, args = self._inverse(view, self._current(base), value)
                value = self._call(target, args, {}, like=base, layout=self._is_root(base))
            view = base
        self.version[key] += 1
        self.now[view] = (value, self.version[key])  # (the root)

    def _laid_out(self, value, root_now, root):
        """`value`, a new value of the root, laid out as the root is (views
        made of it read by its strides): as is where it is so, else put into
        a copy (PyTorch's functional copy takes the source's strides: an
        expanded gradient's are 0), or put into a copy of the root's value
        now where no memory format lays it out so."""
        made, original = self.values[value], self.values[root]
        if made.stride() == original.stride() and \
                made.storage_offset() == original.storage_offset():
            return value
        if not is_dense(original) or original.storage_offset() != 0:
            raise _NotSimple
        for layout in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d):
            if original.dim() == {torch.channels_last: 4, torch.channels_last_3d: 5}.get(
                    layout, original.dim()) and original.is_contiguous(memory_format=layout):
                return self._call(aten.clone.default, (value,), {"memory_format": layout},
                                  like=root, layout=True)
        return self._call(aten.as_strided_scatter.default,
                          (root_now, value, list(original.shape), list(original.stride()), 0),
                          {}, like=root, layout=True)

    def _inverse(self, view, base_now, value):
        """(target, args) of the call that puts `value` where `view` lies in
        `base_now`."""
        name = op_name(view.target)
        if name in _SCATTERS:
            return _SCATTERS[name], (base_now, value) + tuple(_bound(view)[1:])
        if name in _RESHAPED:
            return aten.view.default, (value, list(self.values[base_now].shape))
        if name == "permute":
            dims = [d % self.values[view].dim() for d in _bound(view)[1]]
            return aten.permute.default, (value, [dims.index(k) for k in range(len(dims))])
        if name in _PERMUTED:  # (t, transpose: their own inverse)
            return view.target, (value,) + tuple(_bound(view)[1:])
        if name in _SAME:
            return aten.alias.default, (value,)
        raise _NotSimple

    def _current(self, n):
        """The node of tensor n's value now: n itself where nothing wrote its
        storage since n was made, else n made anew from its base's value now
        (at the graph's insertion point). n as it is where it is no tensor
        of a written storage."""
        if not isinstance(n, torch.fx.Node):
            return n
        key = self.storage.get(n)
        root = self.storages.get(key)
        if root is None:
            return n
        if n in self.writes:
            return self._current(n.args[0])
        version = self.version[key]
        held = self.now.get(n)
        if held is not None and held[1] == version:
            return held[0]
        if version == 0:
            return n
        if n is root:
            return held[0]
        if n not in self.parent:
            raise _NotSimple  # (an unknown view read after a write: _tree missed it)
        made = self._call(n.target, (self._current(self.parent[n]),) + tuple(n.args[1:]),
                          dict(n.kwargs), like=n, layout=True)
        self.now[n] = (made, version)
        return made

    def _call(self, target, args, kwargs, like, layout):
        """A new call at the insertion point, its fake value made. Its value
        must have `like`'s shape and dtype, and with `layout` its strides and
        offset too (views made of it read by them: a root's value, a view)."""
        made = self.graph.call_function(target, args, kwargs)
        self.values[made] = self.fake_call(made, self.values)
        _check_layout(self.values[made], self.values[like], layout)
        return made


def _check_layout(value, original, layout=True):
    if not isinstance(value, torch.Tensor) or not isinstance(original, torch.Tensor) or \
            value.shape != original.shape or value.dtype != original.dtype or \
            layout and (value.stride() != original.stride() or
                        value.storage_offset() != original.storage_offset()):
        raise _NotSimple


def _known_view(n):
    """Whether fx node n is a view call of _SCATTERS, _RESHAPED, _PERMUTED,
    _SAME or _READ_ONLY (a view as another dtype is none)."""
    name = op_name(n.target)
    return n.op == "call_function" and n.target is not operator.getitem and \
        getattr(n.target, "_overloadname", None) != "dtype" and \
        name in _SCATTERS.keys() | _RESHAPED | _PERMUTED | _SAME | _READ_ONLY and \
        _views_input(n)


def _views_input(n):
    """Whether fx call n's schema says its result is a view of its first
    argument."""
    schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
    return schema is not None and bool(schema.returns) and \
        schema.returns[0].alias_info is not None and \
        not (schema.arguments[0].alias_info is not None and
             schema.arguments[0].alias_info.is_write)


def _bound(n):
    """n's arguments in its schema's order, defaults filled."""
    values = []
    for k, a in enumerate(n.target._schema.arguments):
        if k < len(n.args):
            values.append(n.args[k])
        elif a.name in n.kwargs:
            values.append(n.kwargs[a.name])
        elif a.has_default_value():
            values.append(a.default_value)
        else:
            raise _NotSimple
    return values


# Note [Writes that read what they write]. An in-place call whose source
# shares memory with its destination, in part (y[:, 1:] = y[:, :-1], or
# y.t()[1:] += y.t()[:-1]), computes in the order of its kernel's loop: eager
# refuses the contiguous form ("some elements of the input tensor and the
# written-to tensor refer to a single memory location") but runs strided
# ones, where an element written early is read again later (the first column
# spreads along the row). A functional graph reads the old values, so the
# plan would train with other numbers: pebble.torch refuses such a call
# (overlapping_write). The same tensor as source (x.mul_(x)) and sources that
# share no element with the destination (y[:, 0] += y[:, 1]) are followed.
# A write through a view whose elements share memory (a row of an expanded
# tensor, a part of an as_strided view with overlaps) changes the elements
# that share it too, which neither functionalize nor autograd follows: it is
# refused as well.
# Storages of more than _LARGEST_CHECKED elements are not checked (the check
# marks each element).
_LARGEST_CHECKED = 1 << 27


def overlapping_write(nodes):
    """(an in-place call of a first trace, a tensor it reads that shares
    some but not all of the memory it writes, "read"), or (the call, a
    tensor it writes through whose elements share memory, "view"), or None
    (Note [Writes that read what they write]). Values are make_fx's
    (node.meta["val"])."""
    for n in nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None or not schema.arguments or n.args == () or \
                schema.arguments[0].alias_info is None or \
                not schema.arguments[0].alias_info.is_write:
            continue
        written = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
        if not isinstance(written, torch.Tensor):
            continue
        sources = []
        torch.fx.node.map_arg((n.args[1:], n.kwargs), sources.append)
        for source in sources:
            read = source.meta.get("val")
            if isinstance(read, torch.Tensor) and _overlap_in_part(written, read):
                return n, source, "read"
        view = _view_over_itself(n.args[0], storage_key(written))
        if view is not None:
            return n, view, "view"
    return None


def _view_over_itself(x, key):
    """The first of x and the tensors it views (its first arguments, in one
    storage) whose elements share memory, or None."""
    while isinstance(x, torch.fx.Node):
        value = x.meta.get("val")
        if not isinstance(value, torch.Tensor) or storage_key(value) != key:
            return None
        if _overlaps_itself(value):
            return x
        x = x.args[0] if x.op == "call_function" and x.args else None
    return None


def _overlap_in_part(written, read):
    """Whether tensors `written` and `read` share some of their elements'
    memory without being the same view of it."""
    if read.numel() == 0 or written.numel() == 0 or \
            storage_key(read) != storage_key(written) or \
            read.element_size() != written.element_size():
        return False
    if (read.shape, read.stride(), read.storage_offset()) == \
            (written.shape, written.stride(), written.storage_offset()):
        return False
    size = max(t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
               for t in (written, read))
    if size > _LARGEST_CHECKED:
        return False
    marked = torch.zeros(size, dtype=torch.bool)
    marked.as_strided(written.shape, written.stride(), written.storage_offset()).fill_(True)
    return bool(marked.as_strided(read.shape, read.stride(), read.storage_offset()).any())


def _overlaps_itself(t):
    """Whether two elements of `t` may share memory (an as_strided or an
    expanded view): exactly where a sufficient condition (each stride, in
    increasing order, beyond what the smaller ones reach) fails, and `t` has
    at most _LARGEST_CHECKED elements' reach."""
    reach = 0
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s > 1):
        if stride <= reach:
            break
        reach += (size - 1) * stride
    else:
        return False
    size = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
    if size > _LARGEST_CHECKED or t.numel() > _LARGEST_CHECKED:
        return True
    offsets = torch.arange(size).as_strided(t.shape, t.stride(), t.storage_offset())
    return offsets.unique().numel() != t.numel()
