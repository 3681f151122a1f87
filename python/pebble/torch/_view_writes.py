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
  _PERMUTED, _SAME, a piece of _SPLITS; _READ_ONLY ones, as expand, are made
  anew but not written through), or an in-place call's result (the tensor
  it wrote);
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
traces the graph again. as_strided addresses its input's storage, not the
input: an as_strided view of any tensor of the storage is made of the
root's value now, laid out as the root was. An in-place reshape (t_,
unsqueeze_) whose tensor nothing reads after is dropped. A trace on real
tensors takes the rewrite too, on the values _capture._record_values gives
it. Besides the second trace, functionalize is avoided for what PyTorch
1.13's computes wrongly: a write through a reshape of a slice
(_reshape_alias of a tensor that is not contiguous), or through
_unsafe_view, gave other numbers than eager.
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
                       "flatten", "unflatten", "_unsafe_view"})
# Views that permute the dimensions: the inverse permutes them back.
_PERMUTED = frozenset({"t", "transpose", "permute"})
# Views that are the whole tensor.
_SAME = frozenset({"alias", "detach", "view_as"})
# Operators that make a tensor without its values.
UNFILLED = frozenset({"empty", "new_empty", "empty_like", "empty_strided",
                       "new_empty_strided"})
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
    if not rewrite.storages and not rewrite.unread:
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
        self.fake_call = fake_call
        self.position = {n: k for k, n in enumerate(nodes)}
        self.storage = {n: storage_key(v) for n, v in values.items()
                        if isinstance(v, torch.Tensor)}
        self.writes = {}  # in-place call -> its functional variant
        written = {}      # storage key -> its writes, in order
        self.unread = []  # in-place reshapes whose tensor nothing reads after
        for n in nodes:
            names = n.op == "call_function" and written_args(n.target)
            if not names:
                continue
            x = n.args[0] if n.args else None
            if op_name(n.target) in _RESHAPE_IN_PLACE and not n.users and \
                    isinstance(x, torch.fx.Node) and list(x.users) == [n]:
                self.unread.append(n)  # (a shape changed and never used: dropped)
                continue
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
        if op_name(write.target) in _RESHAPE_IN_PLACE and (
                x is not root or sum(op_name(w.target) in _RESHAPE_IN_PLACE
                                     for w in self.writes if self.storage[w] == self.storage[x])
                > 1):
            # (the trace keeps its tensor's last shape as the value of each
            # node of it: a fresh tensor reshaped once, as it is made, is the
            # shape it has for every reader)
            raise _NotSimple
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
            base = _base_of(n)
            if n in self.writes or (base in self.parent or base is root) and _known_view(n):
                if n in self.writes and self._left_in_place(n, root) and n is not writes[0]:
                    raise _NotSimple
                if base in opaque:
                    raise _NotSimple
                # (as_strided addresses the storage, whatever view it is
                # called on: of the root, laid out as it was)
                self.parent[n] = root if op_name(n.target) == "as_strided" else base
                continue
            opaque.add(n)
            if self._read_after(n, first_write, opaque):
                raise _NotSimple
        for n in self.parent:
            if n in self.writes and any(not self._written_through(v) for v in self._path(n)):
                raise _NotSimple
        return root

    def _written_through(self, view):
        """Whether a write through tensor `view` of the path of a write can be
        put back into its base: not a _READ_ONLY view, nor an as_strided
        view whose elements overlap (a scatter would not give them eager's
        values). Read alone, these are made anew."""
        name = op_name(view.target) if view.op == "call_function" else ""
        if name in _READ_ONLY:
            return False
        return name != "as_strided" or not _overlaps_itself(self.values[view])

    def _path(self, n):
        """The tensors from n to its storage's root, the root left out."""
        path = []
        while n in self.parent:
            path.append(n)
            n = self.parent[n]
        return path

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
                    args = torch.fx.node.map_arg(n.args, self._current)
                    renewed = args != n.args
                    n.args = args
                    n.kwargs = torch.fx.node.map_arg(n.kwargs, self._current)
                    if _splits(n) and self.storage.get(n.args[0]) in self.storages:
                        # (a split of a written tensor: its pieces are views)
                        if renewed:
                            self.values[n] = self.fake_call(n, self.values)
                        self.now[n] = (n, self.version[self.storage[n.args[0]]])
        for root in self.storages.values():
            latest = self._current(root)
            if root.op == "placeholder" and latest is not root:
                with self.graph.inserting_before(output):
                    back = self.graph.call_function(aten.copy_.default, (root, latest))
                self.values[back] = self.values[root]
        for n in reversed(self.nodes):
            if self.writes.get(n) is not None or n in self.unread:
                self.graph.erase_node(n)
                self.values.pop(n, None)

    def _view(self, n):
        """A view of a written storage, made from its base's value now (a
        split's piece: its split was, where run() met it)."""
        original = self.values[n]
        if n.target is operator.getitem:
            self.values[n] = self.values[n.args[0]][n.args[1]]
            _check_layout(self.values[n], original)
        else:
            base_now = self._current(n.args[0])
            # (its base may be the same node made anew in place, a view of a
            # view: its value then lies in another storage than n's did, and
            # n, charged a storage of its own, was planned at its bytes)
            if base_now is not n.args[0] or \
                    storage_key(self.values[base_now]) != storage_key(original):
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
        if self._fills_unfilled(n, written, args):
            # (the root's value before is never read: the source, laid out
            # as the root is, is its value, without the copy into it)
            value = args[1]
        else:
            value = self._call(self.writes[n], args, kwargs, like=written, layout=False)
        view = written
        while view in self.parent:
            base = self.parent[view]
            if view not in self.writes:
                target, args = self._inverse(view, self._current(base), value)
                value = self._call(target, args, {}, like=base, layout=False)
            view = base
        value = self._laid_out(value, self._current(view), view)
        self.version[key] += 1
        self.now[view] = (value, self.version[key])  # (the root)

    def _fills_unfilled(self, n, written, args):
        """Whether in-place call n is a copy_ of a tensor of the root's dtype
        and device into all of the root where the root was made unfilled
        (autograd's new_empty_strided of a gradient) and not yet written."""
        root = written
        if self.version[self.storage[n]] != 0 or root in self.parent or \
                op_name(n.target) != "copy_" or len(args) < 2 or \
                op_name(root.target) not in UNFILLED:
            return False
        source, made = self.values.get(args[1]), self.values[root]
        return isinstance(source, torch.Tensor) and source.shape == made.shape and \
            source.dtype == made.dtype and source.device == made.device

    def _laid_out(self, value, root_now, root):
        """`value`, a new value of the root, laid out as the root is (views
        made of it read by its strides): as is where it is so, else put into
        a copy (PyTorch's functional copy takes the source's strides: an
        expanded gradient's are 0), or put into a copy of the root's value
        now where no memory format lays it out so."""
        made, original = self.values[value], self.values[root]
        if _same_layout(made, original):
            return value
        if not is_dense(original) or original.storage_offset() != 0:
            raise _NotSimple
        formats = [torch.contiguous_format] + {4: [torch.channels_last],
                                               5: [torch.channels_last_3d]}.get(original.dim(), [])
        for layout in formats:
            if original.is_contiguous(memory_format=layout):
                return self._call(aten.clone.default, (value,), {"memory_format": layout},
                                  like=root, layout=True)
        return self._call(aten.as_strided_scatter.default,
                          (root_now, value, list(original.shape), list(original.stride()), 0),
                          {}, like=root, layout=True)

    def _inverse(self, view, base_now, value):
        """(target, args) of the call that puts `value` where `view` lies in
        `base_now`."""
        split = _split_call(view)
        if split is not None:
            arguments, k = _bound(split), view.args[1]
            dim = arguments[-1] % self.values[base_now].dim()
            if op_name(split.target) == "unbind":
                return aten.select_scatter.default, (base_now, value, dim, k)
            sizes = [piece.shape[dim] for piece in self.values[split]]
            start = sum(sizes[:k])
            return aten.slice_scatter.default, (base_now, value, dim, start, start + sizes[k], 1)
        name = op_name(view.target)
        if name == "slice" and self.values[view].shape == self.values[base_now].shape:
            return aten.alias.default, (value,)  # (all of it: y[:, 0]'s slice of the rows)
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
        base_now = self._current(self.parent[n])
        split = _split_call(n)
        if split is None:
            made = self._call(n.target, (base_now,) + tuple(n.args[1:]), dict(n.kwargs),
                              like=n, layout=True)
        else:  # (the split made anew, once per version, for its pieces)
            held_split = self.now.get(split)
            if held_split is None or held_split[1] != version:
                made_split = self.graph.call_function(
                    split.target, (base_now,) + tuple(split.args[1:]), dict(split.kwargs))
                self.values[made_split] = self.fake_call(made_split, self.values)
                held_split = self.now[split] = (made_split, version)
            made = self.graph.call_function(operator.getitem, (held_split[0], n.args[1]))
            self.values[made] = self.values[held_split[0]][n.args[1]]
            _check_layout(self.values[made], self.values[n])
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
    """_NotSimple unless `value` has `original`'s shape and dtype, and with
    `layout` its layout (_same_layout)."""
    if not isinstance(value, torch.Tensor) or not isinstance(original, torch.Tensor) or \
            value.shape != original.shape or value.dtype != original.dtype or \
            layout and not _same_layout(value, original):
        raise _NotSimple


def _same_layout(a, b):
    """Whether tensors a and b of one shape lie alike in their storages: the
    offset, and the strides of the dimensions of more than one element (the
    others' are never stepped)."""
    return a.storage_offset() == b.storage_offset() and all(
        size <= 1 or x == y for size, x, y in zip(a.shape, a.stride(), b.stride()))


# Calls whose outputs are pieces of their input, each a view of it
# (torch.unsafe_split's are not declared views: Note [Writes that
# functionalize misses]).
_SPLITS = frozenset({"split", "split_with_sizes", "unbind"})


def _splits(n):
    """Whether fx node n is a call of _SPLITS."""
    return n.op == "call_function" and op_name(n.target) in _SPLITS and _views_input(n)


def _split_call(n):
    """The split call (_SPLITS) whose piece fx node n is, or None."""
    if n.op != "call_function" or n.target is not operator.getitem or \
            not isinstance(n.args[0], torch.fx.Node):
        return None
    return n.args[0] if _splits(n.args[0]) else None


def _base_of(n):
    """The tensor that fx node n views or writes, where n is a call: its first
    argument, or for a split's piece, the split's."""
    split = _split_call(n)
    if split is not None:
        return split.args[0]
    return n.args[0] if n.op == "call_function" and n.args else None


def _known_view(n):
    """Whether fx node n is a view call of _SCATTERS, _RESHAPED, _PERMUTED,
    _SAME or _READ_ONLY (a view as another dtype is none), or a piece of a
    split (_SPLITS)."""
    if _split_call(n) is not None:
        return True
    name = op_name(n.target)
    if name == "_unsafe_view":  # (a view its schema does not declare)
        return n.op == "call_function"
    return n.op == "call_function" and n.target is not operator.getitem and \
        getattr(n.target, "_overloadname", None) != "dtype" and \
        name in _SCATTERS.keys() | _RESHAPED | _PERMUTED | _SAME | _READ_ONLY and \
        _views_input(n)


def _views_input(n):
    """Whether fx call n's schema says its result is a view of its first
    argument."""
    schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
    return schema is not None and bool(schema.returns) and \
        schema.returns[0].alias_info is not None and not writes_self(n)


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
# refused as well, and so is an out= that is a view of another tensor
# (torch.add(a, 1, out=y[:, 0])), which PyTorch 1.13's functionalize gave
# other numbers for.
# Storages of more than _LARGEST_CHECKED elements are not checked (the check
# marks each element), nor those whose tensors a call reshapes in place (t_:
# the trace's values then hold their last shapes).
_LARGEST_CHECKED = 1 << 27


def overlapping_write(nodes):
    """(an in-place call of a first trace, a tensor it reads that shares
    some but not all of the memory it writes, "read"), or (the call, a
    tensor it writes through whose elements share memory, "view"), or (a
    call, the view of another tensor it writes as its out=, "out"), or None
    (Note [Writes that read what they write]). Values are make_fx's
    (node.meta["val"])."""
    reshaped = _reshaped_in_place(nodes)
    first_of = {}  # storage key -> the first node of that storage
    for n in nodes:
        value = n.meta.get("val")
        if isinstance(value, torch.Tensor):
            first_of.setdefault(storage_key(value), n)
    for n in nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        out = _written_out(n, schema)
        if out is not None and first_of.get(storage_key(out.meta["val"])) is not out:
            return n, out, "out"
        if not writes_self(n) or not n.args:
            continue
        written = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
        if not isinstance(written, torch.Tensor) or n.args[0] in reshaped:
            continue
        sources = []
        torch.fx.node.map_arg((n.args[1:], n.kwargs), sources.append)
        for source in sources:
            read = source.meta.get("val")
            if isinstance(read, torch.Tensor) and source not in reshaped and \
                    _overlap_in_part(written, read):
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
        x = _base_of(x)  # (of a split's piece, the tensor split)
    return None


def _written_out(n, schema):
    """The fx node of the tensor that call n writes by an argument other than
    its first (out=), or None."""
    if schema is None:
        return None
    for k, a in enumerate(schema.arguments):
        if k == 0 or a.alias_info is None or not a.alias_info.is_write:
            continue
        out = n.args[k] if k < len(n.args) else n.kwargs.get(a.name)
        if isinstance(out, torch.fx.Node) and isinstance(out.meta.get("val"), torch.Tensor):
            return out
    return None


# In-place calls that change a tensor's shape or strides, not its values.
_RESHAPE_IN_PLACE = frozenset({"t_", "transpose_", "swapdims_", "swapaxes_", "unsqueeze_",
                               "squeeze_", "as_strided_", "resize_", "resize_as_", "set_"})


def _reshaped_in_place(nodes):
    """The nodes of tensors that a call of _RESHAPE_IN_PLACE changes (the
    call, and its argument through the in-place calls that returned it): the
    trace keeps one value per tensor, with the last shape it had, so the
    shape and strides it says of such a node are not the node's (not
    checked: a read would be taken for an overlap it is not)."""
    reshaped = set()
    for n in nodes:
        if n.op == "call_function" and op_name(n.target) in _RESHAPE_IN_PLACE:
            x = n
            while isinstance(x, torch.fx.Node) and x not in reshaped:
                reshaped.add(x)
                x = x.args[0] if writes_self(x) and x.args else None
    return reshaped


def writes_self(n):
    """Whether fx node n is a call that writes its first argument in place."""
    schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
    if schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def reshaped_and_written(nodes):
    """(a call of _RESHAPE_IN_PLACE, an in-place call that writes values into
    the same storage), or None: PyTorch 1.13's functionalize computed other
    numbers than eager for such steps, and the one-pass rewrite does not
    take them (Note [Writes that read what they write])."""
    reshaped = {storage_key(r.meta["val"]): r for r in _reshaped_in_place(nodes)
                if op_name(r.target) in _RESHAPE_IN_PLACE and
                isinstance(r.meta.get("val"), torch.Tensor)}
    for n in nodes:
        if not writes_self(n) or op_name(n.target) in _RESHAPE_IN_PLACE or not n.args or \
                not isinstance(n.args[0], torch.fx.Node):
            continue
        written = n.args[0].meta.get("val")
        if isinstance(written, torch.Tensor) and storage_key(written) in reshaped:
            return reshaped[storage_key(written)], n
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
    size = max(_reach(written), _reach(read))
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
    size = _reach(t)
    if size > _LARGEST_CHECKED or t.numel() > _LARGEST_CHECKED:
        return True
    offsets = torch.arange(size).as_strided(t.shape, t.stride(), t.storage_offset())
    return offsets.unique().numel() != t.numel()


def _reach(t):
    """The elements of its storage that tensor `t` reaches: one past its
    last element's offset."""
    return t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
