"""Source datasets: where elements come from, and how each source splits.

A splittable source numbers its splits ``0 .. num_source_splits()-1`` in a
defined order and can read any one of them with ``read_split(i)``. Splits are
coarse on purpose: a range hands out chunks of indices (up to
``MAX_SPLIT_ELEMENTS``), not one split per element, so that a dispatcher
handing them out is never the bottleneck.

Example::

    >>> src = Dataset.range(10000)
    >>> src.num_source_splits(), list(src.read_split(0))[:3]
    (40, [0, 1, 2])

A pipeline sizes the splits of its range and from_tensor_slices sources from its downstream batches
(``split_size_for``'s ``unit``) when it runs over splits: ``Dataset.range(200).batch(32)`` has 7
splits of 32 elements, so that two workers share its groups.
"""

from __future__ import annotations

import glob
import itertools
import math
import operator
import os
import random
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from dataservice.data import structure
from dataservice.data.checkpoint import ChunkIterator, NodeIterator, field
from dataservice.data.dataset import Dataset, IteratorContext

__all__ = ["SplittableSource", "RangeDataset", "TensorSlicesDataset", "TensorsDataset", "GeneratorDataset",
           "ListFilesDataset", "FileListSource", "split_size_for", "MAX_SPLIT_ELEMENTS",
           "MIN_SPLIT_ELEMENTS", "MIN_BATCHED_SPLIT_ELEMENTS", "TARGET_SPLITS"]

#: Largest number of elements in one split of an indexed source (unless one downstream batch is larger).
MAX_SPLIT_ELEMENTS = 4096
#: Smallest split of an indexed source read unbatched (a smaller source is one split): its elements
#: are usually cheap, and every grouping (so every saved read position) of such pipelines stays as it was.
MIN_SPLIT_ELEMENTS = 256
#: Smallest split of a source whose pipeline batches: a split is a whole number of batches (at least one),
#: so a small dataset of costly elements, as images are, still has a split per worker or more.
MIN_BATCHED_SPLIT_ELEMENTS = 16
#: An indexed source aims at about this many splits, so that distributed_epoch has work for a cluster's
#: workers. A constant, not the cluster's size: a registered dataset's grouping (and so a saved read
#: position, which names groups) must not depend on how many workers read it, nor on the host.
TARGET_SPLITS = 64


def split_size_for(num_elements: int, unit: int = 1) -> int:
    """Elements per split for an indexed source of ``num_elements``: coarse, but balanced.

    ``unit`` is how many source elements one element of the pipeline's output takes (the product of
    the batch sizes downstream, see ``Dataset.split_groups``): a split is ``unit`` times a power of
    two, so that a group of whole splits never ends in a partial batch. It aims at ``TARGET_SPLITS``
    splits, within ``MIN_SPLIT_ELEMENTS`` (``MIN_BATCHED_SPLIT_ELEMENTS`` under a batch) and
    ``MAX_SPLIT_ELEMENTS`` (or one unit, when that is larger).

    Example::

        >>> split_size_for(200), split_size_for(200, unit=32), split_size_for(10**6, unit=32)
        (256, 32, 4096)
    """
    if not isinstance(unit, int) or isinstance(unit, bool) or unit < 1:
        raise ValueError(f"unit must be an int >= 1, got {unit!r}")
    floor = MIN_SPLIT_ELEMENTS if unit == 1 else MIN_BATCHED_SPLIT_ELEMENTS
    want = max(math.ceil(num_elements / TARGET_SPLITS), floor)
    size = unit
    while size < want and size * 2 <= max(MAX_SPLIT_ELEMENTS, unit):
        size *= 2
    return size


class _SplitCursor:
    __slots__ = ("split", "offset", "counter")

    def __init__(self) -> None:
        self.split = 0       # the split being read (or the next one to open)
        self.offset = 0      # elements of it to pass over when it is opened
        self.counter = None  # enumerate() over the open split: its count is the position in it


_SEEKABLE = (type(iter([])), type(iter(())))
_END = object()


def _opened(source: "SplittableSource", index: int, skip: int, where: str) -> Iterator:
    """Split ``index``'s elements after the first ``skip``: a list's (or tuple's) iterator seeks, any other
    reads again up to the position, within the split."""
    items = source.read_split(index)
    if skip:
        left = operator.length_hint(items, -1) if type(items) in _SEEKABLE else -1
        if 0 <= left < skip:
            raise ValueError(f"the iterator state does not fit {where}: split {index} has {left} "
                             f"elements, fewer than the saved 'offset' {skip}")
        if left >= 0:
            items.__setstate__(skip)
        else:
            for _ in range(skip):
                if next(items, _END) is _END:
                    raise ValueError(f"the iterator state does not fit {where}: split {index} ended "
                                     f"before the saved 'offset' {skip}")
    return items


def _split_elements(source: "SplittableSource", cursor: _SplitCursor, where: str,
                    provider: Optional[Iterator[int]] = None) -> Iterator:
    """The split iterators from the cursor's on (``chain`` flattens them): every split of the source, or
    (``provider``) the splits it hands out, ``cursor.split`` counting those passed."""
    count = source.num_source_splits()
    take = operator.itemgetter(1)
    if provider is None:
        indices = iter(range(cursor.split, count))
    else:
        for _ in range(cursor.split):  # a restored position: the splits read before it
            if next(provider, _END) is _END:
                raise ValueError(f"the iterator state does not fit {where}: it passed {cursor.split} of the splits "
                                 f"handed out, and fewer were")
        # Under repeat() a provider numbers the splits of every epoch.
        indices = (index % count if count else index for index in provider)
    for index in indices:
        skip, cursor.offset = cursor.offset, 0
        items = _opened(source, index, skip, where)
        cursor.counter = counter = enumerate(items, skip)
        yield map(take, counter)  # in C: counting costs no Python step per element
        cursor.counter = None
        cursor.split += 1


class _SplitsIterator(NodeIterator):
    """Every split of a source in order, or (``provider``: distributed_epoch on a worker) the splits a split
    provider hands out. State: ``{"split": index (of splits handed out: how many were passed), "offset":
    elements of it already taken}``. Restoring opens that split and seeks its iterator when it is a list's
    (or a tuple's), else reads the split again up to the offset: a source whose splits are large iterators
    of their own (files, chunks) overrides ``_read_all`` and ``_read_provided`` with a reader that seeks. A
    provider restored is a new one handing out the same splits (a worker's group: ``SplitGroups.splits``)."""

    __slots__ = ("__next__", "_cursor", "_count", "_where", "_elements")

    def __init__(self, source: "SplittableSource", provider: Optional[Iterator[int]] = None):
        self._cursor = _SplitCursor()
        self._where = source._describe()
        # Handed out: as many as the provider has, which only reading it tells.
        self._count = source.num_source_splits() if provider is None else None
        self._elements = _split_elements(source, self._cursor, self._where, provider)
        self.__next__ = itertools.chain.from_iterable(self._elements).__next__

    def save(self) -> dict:
        cursor = self._cursor
        if cursor.counter is None:
            return {"split": cursor.split, "offset": cursor.offset}
        return {"split": cursor.split, "offset": cursor.counter.__reduce__()[1][1]}

    def restore(self, state: Any) -> None:
        split = field(state, "split", int, self._where)
        offset = field(state, "offset", int, self._where)
        if self._count is not None and (split > self._count or (split == self._count and offset)):
            raise ValueError(f"malformed iterator state for {self._where}: 'split' must be < {self._count} (its "
                             f"number of splits), got {split} (offset {offset})")
        self._cursor.split, self._cursor.offset = split, offset

    def close(self) -> None:
        self._elements.close()


class SplittableSource(Dataset):
    """A source that can enumerate its splits and read any one of them."""

    def _split_source(self) -> "SplittableSource":
        return self

    def _num_splits(self) -> int:
        return self.num_source_splits()

    def num_source_splits(self) -> int:
        raise NotImplementedError

    def read_split(self, index: int) -> Iterator:
        """The elements of split ``index``, in order."""
        raise NotImplementedError

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if ctx.split_provider is None:
            return self._read_all()
        return self._read_provided(ctx.split_provider)

    def _read_all(self) -> Iterator:
        return _SplitsIterator(self)

    def _read_provided(self, provider: Iterator[int]) -> Iterator:
        return _SplitsIterator(self, provider)


def _range_argument(name: str, value: Any) -> int:
    """One of range()'s arguments as an int: ints, numpy integers (0-d arrays too) and bools, as tf.data takes."""
    if value is None:
        raise ValueError(f"Dataset.range() argument {name} must be an int, got None")
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if not isinstance(value, (int, np.integer)):  # bool is an int: tf.data takes True as 1
        raise TypeError(f"Dataset.range() argument {name} must be an int, got {value!r} ({type(value).__name__})")
    return int(value)


def _range_dtype(output_type: Any) -> np.dtype:
    from dataservice.data import specs
    from dataservice.errors import InvalidArgumentError

    dtype = specs.as_dtype(output_type)
    if dtype is specs.string or dtype.kind not in "iuf":
        # tf.data accepts these and fails at the first element; refused here at once.
        raise InvalidArgumentError(f"Dataset.range(): unsupported output_type {dtype}: it must be an integer or "
                                   "floating-point dtype")
    return dtype


class RangeDataset(SplittableSource):
    """``range(stop)`` / ``range(start, stop[, step])`` as scalars of ``output_type`` (int64 by default).

    Example::

        >>> list(RangeDataset(1, 5, 2, output_type=np.float32))
        [np.float32(1.0), np.float32(3.0)]
    """

    _op_name = "Dataset.range"

    def __init__(self, *args: Any, output_type: Any = None):
        from dataservice.errors import InvalidArgumentError

        if not 1 <= len(args) <= 3:
            raise ValueError(f"Dataset.range() takes 1 to 3 arguments (stop, or start, stop[, step]), got {len(args)}")
        names = ("start", "stop", "step") if len(args) > 1 else ("stop",)
        values = [_range_argument(name, value) for name, value in zip(names, args)]
        if len(values) == 3 and values[2] == 0:
            raise InvalidArgumentError("Dataset.range(): step must be a non-zero integer")
        r = range(*values)
        self._range = r
        self._dtype = np.dtype(np.int64) if output_type is None else _range_dtype(output_type)
        self._split_size = split_size_for(len(r))
        # Sized again from the pipeline's batches when it runs over splits (dataset._split_view). A
        # source pickled before this attribute existed keeps the size it was registered with.
        self._split_by_pipeline = True

    def _values(self, start: int, stop: int, step: int) -> np.ndarray:
        # Computed as int64 and cast, as tf.data does: a narrower dtype wraps (int8: 250 is -6).
        values = np.arange(start, stop, step, dtype=np.int64)
        return values if self._dtype == np.int64 else values.astype(self._dtype)

    def _describe(self) -> str:
        r = self._range
        return f"Dataset.range({r.start}, {r.stop}, {r.step})"

    def cardinality(self) -> int:
        return len(self._range)

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.TensorSpec((), self._dtype)

    def num_source_splits(self) -> int:
        return math.ceil(len(self._range) / self._split_size)

    def read_split(self, index: int) -> Iterator:
        sub = self._range[index * self._split_size:(index + 1) * self._split_size]
        return iter(self._values(sub.start, sub.stop, sub.step))

    def _read_all(self) -> Iterator:
        r = self._range

        def chunk(k: int) -> list:
            sub = r[k * MAX_SPLIT_ELEMENTS:(k + 1) * MAX_SPLIT_ELEMENTS]
            return self._values(sub.start, sub.stop, sub.step)

        return ChunkIterator(chunk, math.ceil(len(r) / MAX_SPLIT_ELEMENTS), self._describe())


def _as_slices_leaf(value: Any) -> np.ndarray:
    value = structure.normalize(value)
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (np.generic, bytes, str)):
        raise ValueError("from_tensor_slices needs at least one dimension to slice; got a scalar")
    return np.asarray(value)


class TensorSlicesDataset(SplittableSource):
    _op_name = "Dataset.from_tensor_slices"

    def __init__(self, tensors: Any):
        if isinstance(tensors, (tuple, dict)):
            leaves = [_as_slices_leaf(v) for v in structure.flatten(tensors)]
            if not leaves:
                raise ValueError("from_tensor_slices got an empty structure")
            lengths = [len(leaf) for leaf in leaves]
            if len(set(lengths)) != 1:
                raise ValueError(
                    f"from_tensor_slices: all components must have the same size in the first dimension; "
                    f"got sizes {lengths}")
            self._structure = tensors
            self._leaves = leaves
            self._length = lengths[0]
        else:
            leaf = _as_slices_leaf(tensors)
            if leaf.ndim == 0:
                raise ValueError("from_tensor_slices needs at least one dimension to slice; got a scalar")
            self._structure = None
            self._leaves = [leaf]
            self._length = len(leaf)
        self._split_size = split_size_for(self._length)
        self._split_by_pipeline = True  # as RangeDataset's

    def cardinality(self) -> int:
        return self._length

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        # Each component's rows: its shape without the first dimension.
        leaves = [specs.TensorSpec(leaf.shape[1:], specs.TensorSpec.from_value(leaf).dtype) for leaf in self._leaves]
        return leaves[0] if self._structure is None else structure.pack_as(self._structure, leaves)

    def num_source_splits(self) -> int:
        return math.ceil(self._length / self._split_size)

    def _rows(self, start: int, stop: int) -> Iterator:
        # Copy the chunk once so elements do not alias the source (repeat() stays safe).
        if self._structure is None:
            return iter(self._leaves[0][start:stop].copy())
        chunks = [leaf[start:stop].copy() for leaf in self._leaves]
        template = self._structure
        return (structure.pack_as(template, row) for row in zip(*chunks))

    def read_split(self, index: int) -> Iterator:
        start = index * self._split_size
        return self._rows(start, min(start + self._split_size, self._length))

    def _read_all(self) -> Iterator:
        def chunk(k: int) -> list:
            start = k * MAX_SPLIT_ELEMENTS
            return list(self._rows(start, min(start + MAX_SPLIT_ELEMENTS, self._length)))

        return ChunkIterator(chunk, math.ceil(self._length / MAX_SPLIT_ELEMENTS), self._op_name)


class TensorsDataset(Dataset):
    _op_name = "Dataset.from_tensors"

    def __init__(self, tensors: Any):
        self._element = structure.normalize(tensors)

    def cardinality(self) -> int:
        return 1

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.spec_from_value(self._element)

    def _split_source(self):
        from dataservice.errors import NotSplittableError

        raise NotSplittableError("Dataset.from_tensors is not splittable: it has a single element. "
                                 "Use from_tensor_slices for distributed_epoch.")

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        element = self._element
        return ChunkIterator(lambda k: [element], 1, self._op_name)


def _generator_args(args: Any) -> tuple:
    """from_generator's ``args`` as the generator receives them: numpy values, as tf.data passes them
    (a Python int is an ``np.int64``, a float an ``np.float64``, a list an array; strings stay ``str``/
    ``bytes``: the deliberate differences for literals and strings)."""
    if args is None:
        return ()
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"from_generator: args must be a tuple or list of values, got {type(args).__name__}")
    out = []
    for i, value in enumerate(args):
        if value is None:
            raise ValueError(f"from_generator: args[{i}] is None; each argument must be a value (a number, "
                             "string or array)")
        out.append(structure.normalize(value))
    return tuple(out)


class GeneratorDataset(Dataset):
    _op_name = "Dataset.from_generator"

    def __init__(self, generator: Callable[..., Iterable], args: Optional[tuple]):
        if not callable(generator):
            raise TypeError(f"from_generator expects a callable that returns an iterable, got {generator!r}")
        self._generator = generator
        self._args = _generator_args(args)

    def _describe(self) -> str:
        return f"Dataset.from_generator({getattr(self._generator, '__qualname__', self._generator)!r})"

    def _element_spec(self) -> Any:
        from dataservice.data import specs
        from dataservice.data.dataset import _function_name

        # No output_signature (Dataset.from_generator wraps this node when there is one): the first
        # element tells. The reason names the function without its repr, which may hold an address.
        return specs.inspected_spec(self, f"Dataset.from_generator({_function_name(self._generator)}) has no "
                                          "output_signature: its element_spec needs its first element")

    def _split_source(self):
        from dataservice.errors import NotSplittableError

        raise NotSplittableError(
            f"{self._describe()} is not splittable: a generator cannot be divided into splits. "
            "Use processing_mode='parallel_epochs', or build the pipeline from range, "
            "from_tensor_slices or list_files.")

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return map(structure.normalize, self._raw_elements(ctx))

    def _not_checkpointable_reason(self) -> str:
        # As tf.data, which refuses to save a from_generator iterator too.
        return ("a Python generator's position cannot be saved (its frame is not data; tf.data refuses it "
                "too). Build the source from data that can seek: Dataset.from_tensor_slices(values), "
                "Dataset.range(n).map(make_element), or a file reader (TFRecordDataset, TextLineDataset)")

    def _raw_elements(self, ctx: IteratorContext) -> Iterator:
        """What the generator yields, as it is: a declaration (output_types, output_signature) converts it
        by tf.data's rules, which tell a Python int from a numpy one."""
        from dataservice.data.transformations import raise_user_error

        try:
            it = iter(self._generator(*self._args))
        except Exception as exc:
            raise_user_error(exc, self._describe())
        while True:
            try:
                value = next(it)
            except StopIteration:
                return
            except Exception as exc:
                raise_user_error(exc, self._describe())
            yield value


class FileListSource(SplittableSource):
    """A source over a list of files; one file is one split.

    Subclasses implement ``_read_file(path)``.
    """

    def __init__(self, filenames: Any):
        if filenames is None:
            raise ValueError(f"{self._op_name}: filenames must be a path, a list of paths or a dataset of them, "
                             "got None")
        if isinstance(filenames, (str, bytes, os.PathLike)):
            filenames = [filenames]
        elif isinstance(filenames, Dataset):
            filenames = list(filenames)
        files = []
        for f in (filenames.tolist() if isinstance(filenames, np.ndarray) else filenames):
            if not isinstance(f, (str, bytes, os.PathLike)):
                raise TypeError(f"{self._op_name}: filenames must be paths (str, bytes or os.PathLike), got "
                                f"{f!r} ({type(f).__name__})")
            files.append(os.fsdecode(f))
        # No files is an empty dataset, as in tf.data.
        self._filenames = files

    def _describe(self) -> str:
        shown = ", ".join(self._filenames[:3]) + (", ..." if len(self._filenames) > 3 else "")
        return f"{self._op_name}([{shown}])"

    def num_source_splits(self) -> int:
        return len(self._filenames)

    def read_split(self, index: int) -> Iterator:
        return self._read_file(self._filenames[index])

    def _read_file(self, path: str) -> Iterator:
        raise NotImplementedError


class ListFilesDataset(SplittableSource):
    _op_name = "Dataset.list_files"

    def __init__(self, file_pattern: Any, shuffle: bool = False, seed: Optional[int] = None):
        patterns = [file_pattern] if isinstance(file_pattern, (str, bytes, os.PathLike)) else list(file_pattern)
        patterns = [os.fsdecode(p) for p in patterns]
        matches: list[str] = []
        for pattern in patterns:
            matches.extend(glob.glob(pattern))  # a file two patterns match comes twice, as in tf.data
        if not matches:
            # As tf.data: an error only when no pattern matches anything at all.
            shown = ", ".join(repr(p) for p in patterns)
            raise FileNotFoundError(f"list_files: no files matched pattern{'s' if len(patterns) > 1 else ''} {shown}")
        self._files = sorted(matches)
        self._patterns = patterns
        self._shuffle = bool(shuffle)
        self._seed = seed
        self._epoch = 0

    def __getstate__(self) -> dict:
        # As for shuffle: the epoch count is iteration state; a copy starts at epoch 0.
        state = self.__dict__.copy()
        state["_epoch"] = 0
        return state

    def _describe(self) -> str:
        return f"Dataset.list_files({self._patterns!r})"

    def cardinality(self) -> int:
        return len(self._files)

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.TensorSpec((), specs.string)

    def num_source_splits(self) -> int:
        return len(self._files)

    def read_split(self, index: int) -> Iterator:
        return iter((self._files[index],))

    def _order(self, epoch: Optional[int], seed: Optional[int]) -> list:
        files = list(self._files)
        if self._shuffle:
            random.Random(seed if epoch is None else (self._seed * 1_000_003 + epoch)).shuffle(files)
        return files

    def _read_all(self) -> Iterator:
        return _ListFilesIterator(self)


class _ListFilesIterator(NodeIterator):
    """The files of ``list_files`` in their order for this iterator. State: ``{"index": files already
    taken}``, plus, when shuffled, the ``"epoch"`` whose order it is (seeded: each iterator, so each
    repetition under ``repeat``, takes the node's next epoch) or the ``"seed"`` this iterator drew for its
    order (unseeded). Restoring rebuilds that order and seeks into it; a seeded one also sets the node's
    epoch counter past the saved epoch, so that the next repetition reshuffles as the original's would.

    Example::

        >>> it = iter(Dataset.list_files("/data/*.txt", shuffle=True, seed=3)); next(it)
        >>> it.state_dict()["position"]
        {'index': 1, 'epoch': 0}
    """

    __slots__ = ("__next__", "_node", "_at")

    def __init__(self, node: ListFilesDataset):
        self._node = node
        self._at = at = _FilesCursor(len(node._files))
        if node._shuffle:
            if node._seed is None:
                # Drawn now and saved: an unseeded order is random, yet restorable.
                at.seed = random.SystemRandom().getrandbits(63)
            else:
                at.epoch = node._epoch
                node._epoch += 1
        self.__next__ = itertools.chain.from_iterable(_ordered_files(node, at)).__next__

    def save(self) -> dict:
        at = self._at
        items = at.items
        if items is None:
            index = at.index
        else:
            reduced = items.__reduce__()
            index = reduced[2] if len(reduced) > 2 else at.count
        state: dict = {"index": index}
        if at.epoch is not None:
            state["epoch"] = at.epoch
        if at.seed is not None:
            state["seed"] = at.seed
        return state

    def restore(self, state: Any) -> None:
        node, at = self._node, self._at
        where = node._describe()
        index = field(state, "index", int, where)
        if index > at.count:
            raise ValueError(f"malformed iterator state for {where}: 'index' must be <= {at.count} (the number "
                             f"of files), got {index}")
        if at.epoch is not None:
            at.epoch = field(state, "epoch", int, where)
            node._epoch = at.epoch + 1
        elif at.seed is not None:
            at.seed = field(state, "seed", int, where)
        at.index = index


class _FilesCursor:
    __slots__ = ("count", "epoch", "seed", "index", "items")

    def __init__(self, count: int):
        self.count = count
        self.epoch: Optional[int] = None  # the seeded order's epoch
        self.seed: Optional[int] = None   # the unseeded order's seed
        self.index = 0                    # where to start, once the order is made
        self.items: Any = None            # the order's list iterator


def _ordered_files(node: ListFilesDataset, at: _FilesCursor) -> Iterator:
    # The order is made at the first element, after a restore chose it.
    at.items = items = iter(node._order(at.epoch, at.seed))
    if at.index:
        items.__setstate__(at.index)
    yield items

