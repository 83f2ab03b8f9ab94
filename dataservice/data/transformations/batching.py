"""Batching: batch, padded_batch, unbatch."""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Optional

import numpy as np

from dataservice.data import structure
from dataservice.data.checkpoint import (
    Follows,
    NodeIterator,
    close_input,
    decode_elements,
    encode_elements,
    field,
    restore_input,
    restore_rewind,
    save_input,
    skip_elements,
)
from dataservice.data.dataset import (
    UNKNOWN_CARDINALITY,
    Dataset,
    IteratorContext,
)
from dataservice.data.checkpoint import Marks
from dataservice.data.transformations.common import (
    STATE,
    _check_count,
    _spec_of,
    _static_spec,
    _UnaryDataset,
    elements_of,
    check_rewindable,
    replays,
)


class BatchDataset(_UnaryDataset):
    _op_name = "Dataset.batch"

    def __init__(self, input_dataset: Dataset, batch_size: int, drop_remainder: bool):
        super().__init__(input_dataset)
        self._batch_size = _check_count("batch_size", batch_size, 1)
        self._drop_remainder = bool(drop_remainder)

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if n < 0:
            return n
        return n // self._batch_size if self._drop_remainder else -(-n // self._batch_size)

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        # As tf.data: the batch dimension is static only when a short last batch is dropped.
        return specs.batched(self._input.element_spec, self._batch_size if self._drop_remainder else None)

    def _batches(self, it: Iterator) -> Iterator[list]:
        size, drop = self._batch_size, self._drop_remainder
        islice = itertools.islice
        it = elements_of(it)
        while True:
            chunk = list(islice(it, size))
            if not chunk or (drop and len(chunk) < size):
                return
            yield chunk

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        # Between two batches it holds nothing: its position is its input's.
        it = self._input._iterator(ctx)
        return Follows(map(structure.stack, self._batches(it)), it, self._input)


class PaddedBatchDataset(BatchDataset):
    _op_name = "Dataset.padded_batch"

    def __init__(self, input_dataset: Dataset, batch_size: int, padded_shapes: Any, padding_values: Any,
                 drop_remainder: bool):
        super().__init__(input_dataset, batch_size, drop_remainder)
        self._padded_shapes = padded_shapes
        self._padding_values = padding_values
        spec = _static_spec(input_dataset)
        if spec is not None:  # as tf.data, at construction; otherwise on the first batch
            self._check_against(spec)

    def _check_against(self, spec: Any) -> None:
        from dataservice.data import specs

        specs.padded_batched(spec, None, self._padded_shapes, self._describe())  # ValueError: a shape that won't fit
        _check_padding_values(spec, self._padding_values, self._describe())

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.padded_batched(self._input.element_spec, self._batch_size if self._drop_remainder else None,
                                    self._padded_shapes, self._describe())

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        it = self._input._iterator(ctx)
        return Follows(self._padded(it), it, self._input)

    def _padded(self, it: Iterator) -> Iterator:
        from dataservice.data import specs

        checked = _static_spec(self._input) is not None
        for chunk in self._batches(it):
            if not checked:
                self._check_against(specs.relaxed(_spec_of(chunk[0])))
                checked = True
            yield structure.pad_and_stack(chunk, self._padded_shapes, self._padding_values)


def _padding_fits(value: Any, dtype: Any) -> bool:
    """Whether a padding value has its component's dtype. A Python literal has no width of its own (Python
    ints and floats are 64-bit here, where TensorFlow makes them 32-bit): an int fits any integer dtype, a
    float any floating one. A numpy value must have the component's dtype itself, as in tf.data."""
    from dataservice.data import specs

    if dtype == specs.string:
        if isinstance(value, (str, bytes)):
            return True
        array = np.asarray(value)
        return array.dtype.kind in "SU" or (array.dtype.kind == "O" and isinstance(array.item(), (str, bytes)))
    dtype = np.dtype(dtype)
    if dtype.kind == "O":
        return True  # a component of Python objects (which tf.data cannot hold): any value
    if isinstance(value, bool):
        return dtype == np.bool_
    if isinstance(value, int):
        return dtype.kind in "iu"
    if isinstance(value, float):
        return dtype.kind == "f"
    return np.asarray(value).dtype == dtype


def _padding_leaves(spec: Any, values: Any, where: str) -> list:
    """``values`` (one value for every component, or a structure like the elements') per leaf of ``spec``."""
    if not isinstance(values, (tuple, dict)):  # one value for every component (a list is one value too)
        return [values] * len(structure.flatten(spec))
    if isinstance(values, dict) != isinstance(spec, dict) or not isinstance(spec, (tuple, dict)):
        raise TypeError(f"{where}: padding_values {values!r} do not match the structure of the elements: {spec}")
    if isinstance(spec, dict):
        if set(values) != set(spec):
            raise ValueError(f"{where}: padding_values has the keys {sorted(values)}, the elements "
                             f"{sorted(spec)}")
        return [leaf for key in sorted(spec) for leaf in _padding_leaves(spec[key], values[key], where)]
    if len(values) != len(spec):
        raise ValueError(f"{where}: padding_values has {len(values)} components, the elements {len(spec)}")
    return [leaf for s, v in zip(spec, values) for leaf in _padding_leaves(s, v, where)]


def _check_padding_values(spec: Any, padding_values: Any, where: str) -> None:
    """As tf.data: each padding value a scalar (ValueError) of its component's dtype (TypeError)."""
    if padding_values is None:
        return
    for leaf, value in zip(structure.flatten(spec), _padding_leaves(spec, padding_values, where)):
        if value is None:
            continue  # that component's default
        if np.ndim(value) != 0:
            raise ValueError(f"{where}: padding_values must be scalars, got {value!r} of shape {np.shape(value)}")
        if not _padding_fits(value, leaf.dtype):
            raise TypeError(f"{where}: the padding value {value!r} ({type(value).__name__}) does not match the "
                            f"dtype {leaf.dtype} of its component")


class UnbatchDataset(_UnaryDataset):
    _op_name = "Dataset.unbatch"

    def __init__(self, input_dataset: Dataset):
        super().__init__(input_dataset)
        spec = _static_spec(input_dataset)
        if spec is not None:
            _leading_dimension(spec, self._describe())  # as tf.data: scalars or differing batch sizes refused now

    def cardinality(self) -> int:
        # As tf.data: the input's count times the batch size when its spec has one (from_tensors of a known
        # shape, batch(..., drop_remainder=True)); a batch size of 0 or None leaves it unknown.
        n = self._input.cardinality()
        if n < 0:
            return n
        spec = _static_spec(self._input)
        size = None if spec is None else _leading_dimension(spec, self._describe())
        return n * size if size else UNKNOWN_CARDINALITY

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.unbatched(self._input.element_spec, self._describe())

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        rewound = ctx.rewound() if replays(self._input, ctx) else None
        return _UnbatchIterator(self, self._input._iterator(rewound or ctx), rewound is not None, rewound)


#: How often unbatch records its input's position, in batches (``Marks``, paced by what a record costs):
#: restoring inside a batch reads that batch again, and at most this many before it (dropped, not unstacked).
_MARK_EVERY = 1


class _UnbatchCursor:
    __slots__ = ("marks", "read", "rows", "size", "skip", "offset", "pending")

    def __init__(self, marks: Optional[Marks]):
        self.marks = marks        # None: the input does not replay; the state holds the rows left
        self.read = 0             # the batches read (since the iterator was made or restored)
        self.rows: Any = None     # the batch being unbatched: its rows' list iterator
        self.size = 0             # how many rows it has
        self.skip = 0             # restoring: batches to read again and drop first
        self.offset = 0           # restoring: rows of the next batch already yielded
        self.pending: Any = None  # restoring without marks: the rows that were left


def _unbatched(it: Iterator, cursor: _UnbatchCursor) -> Iterator:
    """The rows' iterator of each batch, for chain.from_iterable (which then reads them directly)."""
    unstack, marks = structure.unstack, cursor.marks
    if cursor.pending is not None:  # restored with the rows that were left
        pending, cursor.pending = cursor.pending, None
        cursor.size = len(pending)
        cursor.rows = rows = iter(pending)
        yield rows
    if marks is None:
        marks = Marks(it, None, 1)  # records nothing: its ``next`` is never reached
        marks.next = 1 << 62
    else:
        skip_elements(it, cursor.skip, "Dataset.unbatch")
    n = 0
    while True:
        if n >= marks.next:
            marks.taken = n  # every row of the batches before was yielded: marks before it can go
            marks.mark(n)
        try:
            batch = next(it)
        except StopIteration:
            cursor.rows = None
            return
        n += 1
        cursor.read = n
        rows = unstack(batch)
        cursor.size = len(rows)
        rows = iter(rows)
        if cursor.offset:  # restored inside this batch
            if cursor.offset > cursor.size:
                raise ValueError(f"the iterator state does not fit Dataset.unbatch: it is at row {cursor.offset} "
                                 f"of a batch of {cursor.size}")
            rows.__setstate__(cursor.offset)
            cursor.offset = 0
        cursor.rows = rows
        yield rows


class _UnbatchIterator(NodeIterator):
    """unbatch: the rows of one input batch after the other. Its state is that of a node reading its input
    ahead (``Marks``: a recorded state of the input and how many batches to drop after it) and the rows of
    the next batch already yielded: restoring reads that batch again and starts past them. Records are
    paced by their cost: before each batch while the input's state is cheap to save (a position), less
    often when it is not (a shuffle of batches: more batches read again then).

    Reading the input again gives the same batches only if its order is reproducible (``replays``); over
    one that is not (a nondeterministic map) the state is the input's position and the rows still to
    yield (``{"input": ..., "rows": "<encoded>"}``).

    Example::

        >>> it = iter(Dataset.range(10).batch(4).unbatch()); _ = [next(it) for _ in range(5)]
        >>> it.state_dict()["position"]   # the second batch, its second row
        {'input': {'chunk': 0, 'offset': 4}, 'skip': 0, 'offset': 1}
    """

    __slots__ = ("__next__", "_elements", "_input", "_input_node", "_cursor", "_node", "_rewound")

    def __init__(self, node: UnbatchDataset, it: Iterator, replayable: bool = True,
                 rewound: Optional[IteratorContext] = None):
        self._node, self._rewound = node, rewound
        self._input = it
        self._input_node = node._input
        self._cursor = _UnbatchCursor(Marks(it, node._input, _MARK_EVERY) if replayable else None)
        # chain: the rows come straight from their list iterator, no Python step per row.
        self._elements = itertools.chain.from_iterable(_unbatched(it, self._cursor))
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        check_rewindable(self._rewound, self._node)
        cursor = self._cursor
        rows = cursor.rows
        left = 0 if rows is None else rows.__length_hint__()
        if cursor.marks is None:
            if left:
                rest = list(itertools.islice(rows.__reduce__()[1][0], cursor.size - left, None))
            else:
                rest = cursor.pending or []
            return {"input": save_input(self._input, self._input_node), "rows": encode_elements(rest)}
        # Inside a batch, the marks' position is before it: that batch is read again.
        cursor.marks.taken = cursor.read - 1 if left else cursor.read
        state = cursor.marks.save()
        state["offset"] = cursor.size - left if left else cursor.offset
        return state

    def restore(self, state: Any) -> None:
        where = "Dataset.unbatch"
        cursor = self._cursor
        if cursor.marks is None:
            restore_input(self._input, self._input_node, field(state, "input", STATE, where))
            cursor.pending = decode_elements(field(state, "rows", str, where), where) or None
            return
        inner, skip = restore_rewind(self._input, self._input_node, state, where)
        cursor.marks = Marks(self._input, self._input_node, _MARK_EVERY, base=(inner, skip))
        cursor.skip = skip
        cursor.offset = field(state, "offset", int, where)

    def close(self) -> None:
        close_input(self._elements)
        close_input(self._input)


def _leading_dimension(spec: Any, where: str) -> Optional[int]:
    """The batch size an unbatch input's spec gives (its components' common leading dimension), or None.
    ValueError for a scalar component or two different known sizes, as tf.data."""
    sizes = set()
    for leaf in structure.flatten(spec):
        if leaf.shape is None:
            continue
        if leaf.shape == ():
            raise ValueError(f"{where}: cannot unbatch an input with scalar components (element_spec {spec})")
        if leaf.shape[0] is not None:
            sizes.add(leaf.shape[0])
    if len(sizes) > 1:
        raise ValueError(f"{where}: the components' leading dimensions differ ({sorted(sizes)}); unbatch needs "
                         f"them to match (element_spec {spec})")
    return sizes.pop() if sizes else None
