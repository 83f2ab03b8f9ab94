"""Windows: ``Dataset.window`` and ``Dataset.group_by_window``, as tf.data's.

A window is a small in-memory dataset of consecutive input elements. For an input of nested
elements (tuples, namedtuples, dicts) ``window`` yields the same nesting with a dataset in place of
each component, as tf.data does, so ``zip`` puts a window's components back together;
``group_by_window`` hands its ``reduce_func`` whole elements in one dataset.

Example::

    >>> [list(w.as_numpy_iterator()) for w in Dataset.range(7).window(3, shift=2, drop_remainder=True)]
    [[0, 1, 2], [2, 3, 4], [4, 5, 6]]
    >>> list(Dataset.range(7).window(3, 1, drop_remainder=True).flat_map(lambda w: w.batch(3)))[:2]
    [array([0, 1, 2]), array([1, 2, 3])]
    >>> ds = Dataset.range(10).group_by_window(lambda x: x % 2, lambda key, w: w.batch(5), window_size=5)
    >>> [b.tolist() for b in ds]
    [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterator, Optional

import numpy as np

from dataservice.data import structure
from dataservice.data.checkpoint import (
    NodeIterator,
    close_input,
    decode_elements,
    encode_elements,
    field,
    restore_input,
    save_input,
    skip_elements,
)
from dataservice.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    IteratorContext,
    _function_name,
)
from dataservice.data.transformations import _UnaryDataset, raise_user_error
from dataservice.data.checkpoint import Marks
from dataservice.data.transformations.common import STATE, check_rewindable, elements_of, not_replayed, replays
from dataservice.errors import NotCheckpointableError

__all__ = ["WindowDataset", "GroupByWindowDataset", "group_by_window"]

#: ``window`` records its input's position every this many input elements at most (less often when the
#: input's state is costly to save: ``Marks``); a restore reads again the elements after the mark before
#: the next window, and refills the buffer.
MARK_EVERY = 64


def _int_arg(name: str, value: Any) -> int:
    """An int64 argument taken as tf.data converts it: an int or numpy integer (or a 0-d integer array)."""
    if value is None:
        # TensorFlow: "Attempt to convert a value (None) with an unsupported type ... to a Tensor" (ValueError).
        raise ValueError(f"{name} must be an int, got None")
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def _positive(name: str, value: Any) -> int:
    from dataservice.errors import InvalidArgumentError

    n = _int_arg(name, value)
    if n <= 0:
        # tf.data's WindowDataset kernel refuses it when the dataset is made: InvalidArgumentError.
        raise InvalidArgumentError(f"Dataset.window: {name} must be greater than zero, got {n}")
    return n


class _Window(Dataset):
    """One window: a finite dataset of the elements (or of one component of them) it was given.

    Its element_spec is its source's (one component of it), computed only when asked: windows are
    made per input element and must not cost a spec computation each.
    """

    _op_name = "a window"

    def __init__(self, values: list, source: Dataset, component: Optional[int]):
        self._values = values
        self._source = source
        self._component = component

    def cardinality(self) -> int:
        return len(self._values)

    def _describe(self) -> str:
        return f"a window of {len(self._values)} elements of {self._source._describe()}"

    def _element_spec(self) -> Any:
        spec = self._source.element_spec
        return spec if self._component is None else structure.flatten(spec)[self._component]

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return _ListIterator(self._values)


class _ListIterator(NodeIterator):
    """A window's elements; its position is the list iterator's own index (``__reduce__``), so counting
    costs nothing per element.

    Example::

        >>> it = _ListIterator([1, 2, 3])
        >>> next(it), it.save()
        (1, {'index': 1})
    """

    __slots__ = ("__next__", "_items", "_values")

    def __init__(self, values: list):
        self._values = values
        self._items = items = iter(values)
        self.__next__ = items.__next__

    def save(self) -> dict:
        reduced = self._items.__reduce__()
        return {"index": reduced[2] if len(reduced) > 2 else len(self._values)}

    def restore(self, state: Any) -> None:
        index = field(state, "index", int, "a window")
        if index > len(self._values):
            raise ValueError(f"the iterator state does not fit a window of {len(self._values)} elements: it is "
                             f"at element {index}")
        self._items.__setstate__(index)


class WindowDataset(_UnaryDataset):
    """``Dataset.window``: windows of ``size`` elements taken every ``stride``-th, a window starting every
    ``shift`` elements; tf.data's algorithm, so partial windows at the end are the same."""

    _op_name = "Dataset.window"

    def __init__(self, input_dataset: Dataset, size: Any, shift: Any, stride: Any, drop_remainder: Any):
        super().__init__(input_dataset)
        self._size = _positive("size", size)
        self._shift = self._size if shift is None else _positive("shift", shift)
        self._stride = _positive("stride", stride)
        if not isinstance(drop_remainder, (bool, np.bool_)):
            raise TypeError(f"drop_remainder must be a bool, got {drop_remainder!r}")
        self._drop_remainder = bool(drop_remainder)

    def _describe(self) -> str:
        return f"Dataset.window({self._size}, shift={self._shift}, stride={self._stride})"

    def _element_spec(self) -> Any:
        from dataservice.data.specs import DatasetSpec

        return structure.map_structure(DatasetSpec, self._input.element_spec)

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if n < 0:
            return n
        if self._drop_remainder:
            rest = n - ((self._size - 1) * self._stride + 1)
            return 0 if rest < 0 else rest // self._shift + 1
        return -(-n // self._shift)

    def _window(self, elements: list) -> Any:
        first = elements[0]
        if not isinstance(first, (tuple, dict)):
            return _Window(elements, self._input, 0)
        columns = zip(*(structure.flatten(e) for e in elements))
        return structure.pack_as(first, [_Window(list(c), self._input, i) for i, c in enumerate(columns)])

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        rewound = ctx.rewound()
        return _WindowIterator(self, self._input._iterator(rewound), replays(self._input, ctx), rewound)

    def _windows(self, it: Iterator, cursor: "_WindowCursor") -> Iterator:
        # As tf.data's kernel: fill a buffer to the span of one window, emit its every stride-th element,
        # drop `shift` elements (reading past the buffer when shift is larger). After the input ends the
        # buffer still yields (shorter) windows, unless drop_remainder. Here shift >= span: the buffer is
        # empty between two windows, so nothing is marked (see _WindowIterator).
        shift, stride, drop = self._shift, self._stride, self._drop_remainder
        span = (self._size - 1) * stride + 1
        buffer = cursor.buffer
        source = elements_of(it)  # taken now, after a restore
        done = False
        while True:
            if not done:
                try:
                    while len(buffer) < span:
                        buffer.append(next(source))
                except StopIteration:
                    done = True
            if not buffer or (drop and len(buffer) < span):
                return
            elements = buffer[::stride]
            gap = shift - len(buffer)
            buffer.clear()
            if not done:
                try:
                    for _ in range(gap):
                        next(source)
                except StopIteration:
                    done = True
            yield self._window(elements)

    def _overlapping_windows(self, it: Iterator, cursor: "_WindowCursor") -> Iterator:
        # The same for shift < span: the buffer keeps span - shift elements for the next window. The cursor
        # counts what was read and marks the input's position (Marks: every MARK_EVERY elements or so).
        shift, stride, drop = self._shift, self._stride, self._drop_remainder
        span = (self._size - 1) * stride + 1
        buffer = cursor.buffer
        marks = cursor.marks
        marks.mark(0)  # the first element's position (a restored one: where it was restored)
        next_mark = marks.next
        source = elements_of(it)
        done = False
        while True:
            if not done:
                held = len(buffer)
                try:
                    while len(buffer) < span:
                        buffer.append(next(source))
                except StopIteration:
                    done = True
                # After the run the input stands before element `read`: a place to mark.
                read = cursor.read = cursor.read + len(buffer) - held
                if read >= next_mark and not done:
                    marks.taken = read - len(buffer)
                    marks.mark(read)
                    next_mark = marks.next
            if not buffer or (drop and len(buffer) < span):
                return
            elements = buffer[::stride]
            if shift >= len(buffer):
                buffer.clear()
            else:
                del buffer[:shift]
            yield self._window(elements)


class _WindowCursor:
    """What ``window`` read: the buffer (the elements read and still needed, the next window's first one
    first), how many elements were read since the start (or the restored position, after the elements it
    skipped), and the input's marks (overlapping windows only)."""

    __slots__ = ("buffer", "read", "marks")

    def __init__(self, marks: Optional[Marks]):
        self.buffer: list = []
        self.read = 0
        self.marks = marks


class _WindowIterator(NodeIterator):
    """``window``'s iterator. Its state is a position of the input, not elements: ``{"input": <the input's
    state>, "skip": n}``, the input's state at a mark before the next window's first element and how many
    elements after it come before that one. Between windows that do not overlap (shift >= the span) the
    buffer is empty: the state is the input's own. Otherwise a restore reads again the ``skip`` elements
    (at most the marks' interval, ``MARK_EVERY`` while the input's state is cheap to save, plus the
    window's span) and refills the buffer from the input. So the state does not grow with the window.

    Example::

        >>> it = iter(Dataset.range(10).window(4, 2))
        >>> _ = next(it); it.state_dict()["position"]     # the second window starts at element 2
        {'input': {'chunk': 0, 'offset': 0}, 'skip': 2}
    """

    __slots__ = ("__next__", "_node", "_input", "_cursor", "_windows", "_replays", "_rewound")

    def __init__(self, node: WindowDataset, input_iterator: Iterator, input_replays: bool = True,
                 rewound: Optional[IteratorContext] = None):
        self._replays, self._rewound = input_replays, rewound
        overlapping = node._shift < (node._size - 1) * node._stride + 1
        self._node = node
        self._input = input_iterator
        self._cursor = _WindowCursor(Marks(input_iterator, node._input, MARK_EVERY) if overlapping else None)
        # The generator refers to the cursor and the input, not to this object: no cycle.
        windows = node._overlapping_windows if overlapping else node._windows
        self._windows = windows(input_iterator, self._cursor)
        self.__next__ = self._windows.__next__

    def save(self) -> dict:
        cursor = self._cursor
        held = len(cursor.buffer)
        if not held:  # the input stands at the next window's first element
            return {"input": save_input(self._input, self._node._input), "skip": 0}
        if not self._replays:  # the open windows would be read again from an input whose order changes
            raise NotCheckpointableError(f"{self._node._describe()} cannot be checkpointed inside overlapping "
                                         f"windows: {not_replayed(self._node._input)}")
        check_rewindable(self._rewound, self._node)
        marks = cursor.marks
        marks.taken = cursor.read - held
        return marks.save()

    def restore(self, state: Any) -> None:
        node = self._node
        where = node._describe()
        inner = field(state, "input", STATE, where)
        skip = field(state, "skip", int, where)
        restore_input(self._input, node._input, inner)
        skip_elements(self._input, skip, where)
        if self._cursor.marks is not None:  # reads count from here; marks start at the restored position
            self._cursor.marks = Marks(self._input, node._input, MARK_EVERY, (inner, skip))

    def close(self) -> None:
        close_input(self._windows)
        close_input(self._input)


class GroupByWindowDataset(_UnaryDataset):
    """``Dataset.group_by_window``: elements grouped by ``key_func``; a group is handed to ``reduce_func``
    (as a window dataset) when it holds its key's window size, and what remains at the end of the input
    group by group in increasing key order, as tf.data does."""

    _op_name = "Dataset.group_by_window"

    def __init__(self, input_dataset: Dataset, key_func: Callable, reduce_func: Callable,
                 window_size: Any = None, window_size_func: Optional[Callable] = None):
        super().__init__(input_dataset)
        if (window_size is not None and window_size_func) or not (window_size is not None or window_size_func):
            raise ValueError("Either the `window_size` argument or the `window_size_func` argument must be "
                             "specified.")
        # The error kinds TensorFlow gives: it calls key_func and window_size_func through a wrapper
        # (TypeError: not callable) and checks reduce_func itself (ValueError).
        self._key_func = _callable("key_func", key_func, TypeError)
        self._reduce_func = _callable("reduce_func", reduce_func, ValueError)
        self._window_size = None if window_size is None else _int_arg("window_size", window_size)
        self._window_size_func = None if window_size_func is None else _callable("window_size_func",
                                                                                 window_size_func, TypeError)

    def _describe(self) -> str:
        return f"Dataset.group_by_window({_function_name(self._key_func)}, {_function_name(self._reduce_func)})"

    def cardinality(self) -> int:
        # As tf.data: how many elements reduce_func makes is unknown, but an infinite input stays infinite.
        n = self._input.cardinality()
        return INFINITE_CARDINALITY if n == INFINITE_CARDINALITY else UNKNOWN_CARDINALITY

    def _where(self, function: str) -> str:
        return f"{self._describe()}'s {function}"

    def _key(self, element: Any) -> int:
        # Per element: the error's wording is built only when there is an error.
        try:
            key = self._key_func(*element) if type(element) is tuple else self._key_func(element)
        except Exception as exc:
            raise_user_error(exc, self._where("key_func"))
        return _scalar_int(key, self, "key_func")

    def _size_of(self, key: int) -> int:
        from dataservice.errors import InvalidArgumentError

        if self._window_size_func is None:
            size = self._window_size
        else:
            try:
                size = _scalar_int(self._window_size_func(np.int64(key)), self, "window_size_func")
            except Exception as exc:
                raise_user_error(exc, self._where("window_size_func"))
        if size <= 0:
            # tf.data checks it when the key is first met, while iterating.
            raise InvalidArgumentError(f"{self._describe()}: the window size must be greater than zero, but got "
                                       f"{size} (for key {key})")
        return size

    def _reduced(self, key: int, group: list) -> Dataset:
        where = f"{self._describe()}'s reduce_func"
        try:
            ds = self._reduce_func(np.int64(key), _Window(group, self._input, None))
        except Exception as exc:
            raise_user_error(exc, where)
        if not isinstance(ds, Dataset):
            raise TypeError(f"{where} must return a Dataset, got {type(ds).__name__}")
        return ds

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        # That of the dataset reduce_func returns: called once on a window of the input's first element,
        # whose element_spec is the input's (so a batch in reduce_func keeps the input's static shapes).
        if self._input.cardinality() == 0:  # no element to call it on: an empty window, key 0
            return self._reduced(0, []).element_spec
        first = specs.first_element(self._input, f"{self._describe()}: its element_spec is that of the dataset "
                                                  "reduce_func returns, which needs one element of its input")
        return self._reduced(self._key(first), [first]).element_spec

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return _GroupByWindowIterator(self, self._input._iterator(ctx), ctx.without_splits())

    def _grouped(self, it: Iterator, cursor: "_Groups") -> Iterator:
        groups, sizes, ctx = cursor.groups, cursor.sizes, cursor.ctx
        if cursor.output is not None:  # restored while yielding a reduced window
            yield from elements_of(cursor.output[0])
            cursor.output = None
        for element in elements_of(it):
            key = self._key(element)
            size = sizes.get(key)
            if size is None:
                size = sizes[key] = self._size_of(key)
            group = groups.setdefault(key, [])
            group.append(element)
            if len(group) >= size:
                del groups[key]
                dataset = self._reduced(key, group)
                output = dataset._iterator(ctx)
                cursor.output = (output, dataset, key, group)
                yield from elements_of(output)
                cursor.output = None
        for key in sorted(groups):  # tf.data keeps its groups in an ordered map
            group = groups.pop(key)
            dataset = self._reduced(key, group)
            output = dataset._iterator(ctx)
            cursor.output = (output, dataset, key, group)
            yield from elements_of(output)
            cursor.output = None


class _Groups:
    """What ``group_by_window`` holds: the open groups (key -> elements), each key's window size, and the
    reduced window being yielded: (its dataset's iterator, that dataset, its key, its elements)."""

    __slots__ = ("groups", "sizes", "output", "ctx")

    def __init__(self, ctx: IteratorContext):
        self.groups: dict[int, list] = {}
        self.sizes: dict[int, int] = {}
        self.output: Optional[tuple] = None
        self.ctx = ctx


class _GroupByWindowIterator(NodeIterator):
    """``group_by_window``'s iterator. Its state holds the input's position, the open groups' elements
    (``encode_elements``: they grow with the open groups, at most each key's window size less one), each
    key's window size (one int per key met, so window_size_func is not called again), and for the reduced
    window being yielded, its key, its elements and its dataset's iterator state: a restore calls
    ``reduce_func(key, window)`` again and restores that dataset's iterator.

    Example::

        >>> ds = Dataset.range(10).group_by_window(lambda x: x % 2, lambda k, w: w.batch(2), window_size=3)
        >>> it = iter(ds); _ = next(it)
        >>> sorted(it.state_dict()["position"])
        ['elements', 'groups', 'input', 'output', 'sizes']
    """

    __slots__ = ("__next__", "_node", "_input", "_cursor", "_elements")

    def __init__(self, node: GroupByWindowDataset, input_iterator: Iterator, ctx: IteratorContext):
        self._node = node
        self._input = input_iterator
        self._cursor = _Groups(ctx)
        self._elements = node._grouped(input_iterator, self._cursor)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        cursor = self._cursor
        position = save_input(self._input, self._node._input)
        keys = list(cursor.groups)
        buffered = [e for key in keys for e in cursor.groups[key]]
        output = None
        if cursor.output is not None:
            iterator, dataset, key, group = cursor.output
            output = {"key": key, "count": len(group), "position": save_input(iterator, dataset)}
            buffered.extend(group)
        return {"input": position,
                "groups": [[key, len(cursor.groups[key])] for key in keys],
                "sizes": [[key, size] for key, size in cursor.sizes.items()],
                "elements": encode_elements(buffered),
                "output": output}

    def restore(self, state: Any) -> None:
        node = self._node
        where = node._describe()
        inner = field(state, "input", STATE, where)
        groups = [_key_count(pair, "groups", where) for pair in field(state, "groups", list, where)]
        sizes = [_key_count(pair, "sizes", where) for pair in field(state, "sizes", list, where)]
        output = field(state, "output", (dict, type(None)), where)
        elements = decode_elements(field(state, "elements", str, where), where)
        wanted = sum(n for _, n in groups)
        if output is not None:
            output_key = field(output, "key", int, where, minimum=None)
            wanted += field(output, "count", int, where)
            output_position = field(output, "position", STATE, where)
        if wanted != len(elements):
            raise ValueError(f"malformed iterator state for {where}: its groups hold {wanted} elements, but "
                             f"{len(elements)} are saved")
        restore_input(self._input, node._input, inner)
        cursor = self._cursor
        cursor.sizes.update(sizes)
        start = 0
        for key, count in groups:
            cursor.groups[key] = elements[start:start + count]
            start += count
        if output is not None:
            group = elements[start:]
            dataset = node._reduced(output_key, group)
            iterator = dataset._iterator(cursor.ctx)
            restore_input(iterator, dataset, output_position)
            cursor.output = (iterator, dataset, output_key, group)

    def close(self) -> None:
        close_input(self._elements)
        if self._cursor.output is not None:
            close_input(self._cursor.output[0])
        close_input(self._input)


def _key_count(pair: Any, name: str, where: str) -> tuple[int, int]:
    if (not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                   for v in pair) or pair[1] < 0):
        raise ValueError(f"malformed iterator state for {where}: each of {name!r} must be [key, count], got "
                         f"{pair!r}")
    return pair[0], pair[1]


def _callable(name: str, fn: Any, kind: type) -> Callable:
    if not callable(fn):
        raise kind(f"{name} must be callable, got {fn!r}")
    return fn


def _scalar_int(value: Any, dataset: "GroupByWindowDataset", function: str) -> int:
    """``value`` as an int, or ValueError naming ``dataset``'s ``function`` that returned it."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    where = dataset._where(function)
    shown = f"{type(value).__name__} of dtype {value.dtype} and shape {value.shape}" \
        if isinstance(value, np.ndarray) else f"{type(value).__name__} {value!r}"
    # tf.data refuses a non-int64 result when tracing the function: ValueError.
    raise ValueError(f"{where} must return a scalar integer (tf.int64), got {shown}")


def group_by_window(key_func: Callable, reduce_func: Callable, window_size: Any = None,
                    window_size_func: Optional[Callable] = None) -> Callable[[Dataset], Dataset]:
    """``tf.data.experimental.group_by_window``: the transformation, for ``Dataset.apply``.

    Example::

        >>> ds = Dataset.range(6).apply(group_by_window(lambda x: x % 3, lambda k, w: w.batch(2), 2))
        >>> [b.tolist() for b in ds]
        [[0, 3], [1, 4], [2, 5]]
    """
    def apply(dataset: Dataset) -> Dataset:
        return dataset.group_by_window(key_func, reduce_func, window_size=window_size,
                                       window_size_func=window_size_func)

    return apply
