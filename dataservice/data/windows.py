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
from dataservice.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, IteratorContext, \
    _function_name
from dataservice.data.transformations import _UnaryDataset, raise_user_error

__all__ = ["WindowDataset", "GroupByWindowDataset", "group_by_window"]


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
        return iter(self._values)


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
        # As tf.data's kernel: fill a buffer to the span of one window, emit its every stride-th element,
        # drop `shift` elements (reading past the buffer when shift is larger). After the input ends the
        # buffer still yields (shorter) windows, unless drop_remainder.
        shift, stride, drop = self._shift, self._stride, self._drop_remainder
        span = (self._size - 1) * stride + 1
        it = self._input._iterator(ctx)
        buffer: list = []
        done = False
        while True:
            while not done and len(buffer) < span:
                try:
                    buffer.append(next(it))
                except StopIteration:
                    done = True
            if not buffer or (drop and len(buffer) < span):
                return
            elements = buffer[::stride]
            if shift >= len(buffer):
                for _ in range(shift - len(buffer)):
                    if done:
                        break
                    try:
                        next(it)
                    except StopIteration:
                        done = True
                buffer = []
            else:
                del buffer[:shift]
            yield self._window(elements)


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
        groups: dict[int, list] = {}
        sizes: dict[int, int] = {}
        inner = ctx.without_splits()
        for element in self._input._iterator(ctx):
            key = self._key(element)
            size = sizes.get(key)
            if size is None:
                size = sizes[key] = self._size_of(key)
            group = groups.setdefault(key, [])
            group.append(element)
            if len(group) >= size:
                del groups[key]
                yield from self._reduced(key, group)._iterator(inner)
        for key in sorted(groups):  # tf.data keeps its groups in an ordered map
            yield from self._reduced(key, groups.pop(key))._iterator(inner)


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
