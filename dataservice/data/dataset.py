"""The ``Dataset`` base class: a pipeline is a small tree of nodes.

Each node knows its inputs, its cardinality and how to make an iterator;
iterating builds a chain of Python iterators, one per node. A source that can
be split (``range``, ``from_tensor_slices``, ``list_files``, the file readers)
hands out numbered splits, and the whole pipeline can run over any subset of
them: that is what ``distributed_epoch`` builds on.

Example::

    >>> ds = Dataset.range(10).map(lambda x: x * 2).batch(4)
    >>> [b.tolist() for b in ds]
    [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]
"""

from __future__ import annotations

import copy
import dataclasses
import math
import operator
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Optional

from dataservice.data.options import AUTOTUNE, Options, default_parallelism
from dataservice.data.read_stats import ReaderStatsRecorder

__all__ = ["Dataset", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY", "IteratorContext", "SplitGroups"]

#: ``cardinality()`` of a dataset that never ends.
INFINITE_CARDINALITY = -1
#: ``cardinality()`` when the count cannot be known without iterating.
UNKNOWN_CARDINALITY = -2


@dataclasses.dataclass
class IteratorContext:
    """What a node's iterator needs from the pipeline it runs in.

    ``split_provider`` is an iterator of split indices when the pipeline runs
    over a subset of its source's splits (distributed_epoch), else None.
    """

    options: Options
    split_provider: Optional[Iterator[int]] = None
    #: The split group this iterator reads, in distributed_epoch (a service task redoing a
    #: group must produce the same elements: seeded shuffles key on it). See SplitGroups.
    split_hint: Optional[int] = None
    _pool: Optional[ThreadPoolExecutor] = None
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    _children: list = dataclasses.field(default_factory=list)
    #: What stops the pipeline's open readers of the service: run by an explicit ``close()``. A reader
    #: stops itself when its node's generator ends; but a generator an exception's traceback still refers
    #: to (say, one side of a zip whose other side raised) would end only when the traceback goes.
    _closers: set = dataclasses.field(default_factory=set)
    #: What the pipeline's reads of the service saw (``read_stats``), made on first use.
    _read_stats: Optional[ReaderStatsRecorder] = None
    #: Set (``rewound``) for the input of a node that restores by reading its input again from a recorded
    #: state (prefetch, a parallel map, unbatch, window, a memory cache): that input must give the same
    #: elements again. ``unrewindable`` is then why it might not (an interleave of nondeterministic datasets).
    rewinding: bool = False
    unrewindable: Optional[str] = None

    def without_splits(self) -> "IteratorContext":
        """A context for datasets built inside user functions (flat_map, interleave)."""
        child = IteratorContext(options=self.options, split_provider=None)
        child._pool = self.thread_pool()
        child._lock = self._lock
        child._closers = self._closers  # closing the pipeline's iterator stops their readers too
        child._read_stats = self.read_stats()  # and their stats add up in the pipeline's iterator
        child.rewinding = self.rewinding  # a dataset made inside a function is read again alike, or not
        return child

    def rewound(self) -> "IteratorContext":
        """This context for the input of a node that rewinds it (see ``rewinding``): a copy of its own, so
        that what the input's nodes find (``unrewindable``) stays with that node.

        Example::

            >>> input_iterator = node._input._iterator(ctx.rewound())
        """
        self.read_stats()  # made now, so that the copy records its reads of the service where this one does
        return dataclasses.replace(self, rewinding=True, unrewindable=None)

    def read_stats(self) -> ReaderStatsRecorder:
        """The recorder every distributed read of this pipeline's iterator reports to (each epoch of a
        ``repeat()``, both sides of a ``zip``): ``iter(dataset).stats()`` reads it."""
        with self._lock:
            if self._read_stats is None:
                self._read_stats = ReaderStatsRecorder()
            return self._read_stats

    def on_close(self, close: Callable[[], None]) -> Callable[[], None]:
        """Runs ``close`` when the pipeline's iterator is closed, unless the returned function (call it once
        ``close`` ran anyway) forgets it first."""
        with self._lock:
            self._closers.add(close)
        return lambda: self._forget(close)

    def _forget(self, close: Callable[[], None]) -> None:
        with self._lock:
            self._closers.discard(close)

    def thread_pool(self) -> ThreadPoolExecutor:
        """The pipeline's shared pool for user functions, made on first use."""
        with self._lock:
            if self._pool is None and self._children:
                self._pool = self._children[0]  # made by a copy of this context (``rewound``): one pool
            if self._pool is None:
                size = self.options.threading.private_threadpool_size or default_parallelism()
                self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="dataservice-pipeline")
                self._children.append(self._pool)
            return self._pool

    def close(self, stop_readers: bool = True) -> None:
        """Shuts the pipeline's thread pools down and (``stop_readers``) stops its open readers."""
        for pool in self._children:
            pool.shutdown(wait=False, cancel_futures=True)
        self._children.clear()
        if stop_readers:
            with self._lock:
                closers, self._closers = list(self._closers), set()
            for close in closers:
                close()


def _function_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


class Dataset:
    """A pipeline of elements, modelled on ``tf.data.Dataset``.

    Build one from a source (``Dataset.range``, ``from_tensor_slices``,
    ``from_generator``, ``list_files``, the file readers) and chain
    transformations; iterate with ``for`` or ``as_numpy_iterator()``.
    """

    #: Human-readable name of the transformation, used in error messages.
    _op_name = "Dataset"

    # --- what every node provides ------------------------------------------------
    def _inputs(self) -> tuple["Dataset", ...]:
        return ()

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        raise NotImplementedError

    def cardinality(self) -> int:
        """The number of elements, ``INFINITE_CARDINALITY`` or ``UNKNOWN_CARDINALITY``."""
        return UNKNOWN_CARDINALITY

    def _describe(self) -> str:
        return self._op_name

    def _producer(self) -> "Dataset":
        """The node that made this pipeline's elements, for messages about an element: this one, unless it
        passes its input's elements on unchanged (prefetch, take, filter, ...: see ``_UnaryDataset``)."""
        return self

    def _reads_from_service(self) -> bool:
        """Whether this pipeline reads from the data service (``distribute``, ``from_dataset_id``)."""
        return any(dataset._reads_from_service() for dataset in self._inputs())

    # --- splits ------------------------------------------------------------------
    def _split_source(self):
        """The splittable source this pipeline reads, or NotSplittableError naming why not."""
        from dataservice.errors import NotSplittableError

        inputs = self._inputs()
        if len(inputs) != 1:
            raise NotSplittableError(
                f"{self._describe()} is not splittable: distributed_epoch needs a pipeline with one "
                "splittable source (range, from_tensor_slices, list_files or a file reader).")
        return inputs[0]._split_source()

    def _num_splits(self) -> int:
        """Splits a full pass of this pipeline reads (repeat multiplies its input's)."""
        return self._inputs()[0]._num_splits()

    def is_splittable(self) -> bool:
        """Whether the pipeline can run over a subset of its source's splits."""
        from dataservice.errors import NotSplittableError

        try:
            self._split_source()
        except NotSplittableError:
            return False
        return True

    def num_splits(self) -> int:
        """How many splits one pass of the pipeline reads; ``INFINITE_CARDINALITY`` under repeat()."""
        self._split_source()
        return _split_view(self)._num_splits()

    def iterate_splits(self, splits: Iterable[int]) -> Iterator:
        """Runs the whole pipeline over the given split indices, in the order given.

        Example::

            >>> ds = Dataset.range(10000).map(lambda x: x + 1)
            >>> n = ds.num_splits()
            >>> part = list(ds.iterate_splits(range(0, n, 2)))  # every other split
        """
        self._split_source()
        return self._root_iterator(iter(splits))

    # --- split groups: what a distributed_epoch task runs over (see SplitGroups) ---
    def split_groups(self, num_groups: Optional[int] = None) -> "SplitGroups":
        """How distributed_epoch groups this pipeline's splits: a worker runs the pipeline over one
        group of consecutive splits at a time, so that interleave and shuffle span the group, and a
        group is what is redone after a worker loss.

        ``num_groups`` is the count the dispatcher hands out (a worker passes the one the dataset
        was registered with); None derives it from the pipeline, as ``distribute`` does.

        Example::

            >>> ds = Dataset.list_files("/data/train-*.tfrecord").interleave(TFRecordDataset, cycle_length=4)
            >>> groups = ds.split_groups()        # 16 files
            >>> groups.num_groups, groups.splits(1)
            (4, range(4, 8))
        """
        return _split_groups(self, num_groups)

    def iterate_split_group(self, group: int, num_groups: Optional[int] = None) -> Iterator:
        """Runs the pipeline over split group ``group`` as a distributed_epoch worker does: a seeded
        shuffle is keyed on the group, so a deterministic pipeline gives the same elements in the
        same order wherever the group runs.

        Example::

            >>> ds = Dataset.range(100_000).shuffle(10_000, seed=1)
            >>> assert list(ds.iterate_split_group(2)) == list(ds.iterate_split_group(2))
        """
        groups = self.split_groups(num_groups)
        return self._root_iterator(iter(groups.splits(group)), split_hint=group)

    # --- iteration ---------------------------------------------------------------
    def _root_iterator(self, split_provider: Optional[Iterator[int]], split_hint: Optional[int] = None) -> Iterator:
        if split_provider is not None:
            view = _split_view(self)  # the splits sized from this pipeline's batches
            if view is not self:
                return view._root_iterator(split_provider, split_hint)
        ctx = IteratorContext(options=self.options(), split_provider=split_provider, split_hint=split_hint)
        stats = ctx.options.experimental_stats
        if stats.latency_all_edges and stats.aggregator is not None:  # else: not one step more per element
            from dataservice.data import stats as stats_module

            return _ClosingIterator(stats_module.instrumented_iterator(self, ctx), ctx, self)
        return _ClosingIterator(self._iterator(ctx), ctx, self)

    def __iter__(self) -> Iterator:
        return self._root_iterator(None)

    def as_numpy_iterator(self) -> Iterator:
        """Iterates numpy values; elements are numpy already, so this is ``iter(ds)``."""
        return iter(self)

    def __len__(self) -> int:
        n = self.cardinality()
        if n == INFINITE_CARDINALITY:
            raise TypeError("The dataset is infinite.")
        if n == UNKNOWN_CARDINALITY:
            raise TypeError("The dataset length is unknown.")
        if n < 0:
            # take(n) with n < -1 reports n, as tf.data. tf.data's __len__ then makes list(ds) raise
            # ValueError; a TypeError lets list() iterate, as for an unknown length.
            raise TypeError(f"The dataset length is not a count: its cardinality is {n}, which tf.data reports "
                            f"for take({n}) (a take that takes every element).")
        return n

    def __bool__(self) -> bool:
        return True  # never fall back to __len__ in a truth test

    def __repr__(self) -> str:
        return f"<{self._describe()}>"

    def reduce(self, initial_state: Any, reduce_func: Callable) -> Any:
        """Folds the dataset into one value: ``reduce_func(state, element)``.

        Example::

            >>> int(Dataset.range(5).reduce(np.int64(0), lambda state, x: state + x))
            10
        """
        if not callable(reduce_func):  # ValueError before reading anything, as tf.data
            raise ValueError(f"reduce_func must be callable, got {reduce_func!r}")
        state = initial_state
        for element in self:
            state = reduce_func(state, element)
        return state

    # --- element_spec ------------------------------------------------------------
    @property
    def element_spec(self) -> Any:
        """The type of an element: its structure (tuples, namedtuples, dicts) of ``TensorSpec``\\ s,
        ``None`` for a dimension that varies, as ``tf.data.Dataset.element_spec``. Computed without
        running the pipeline, except where only an element can tell (``dataservice.data.specs``).

        Example::

            >>> Dataset.range(10).batch(4).element_spec
            TensorSpec(shape=(None,), dtype=int64, name=None)
        """
        from dataservice.data import specs

        return specs.element_spec_of(self)

    def _element_spec(self) -> Any:
        """This node's spec, from its inputs'. A node that does not say is inspected: its first element."""
        from dataservice.data import specs

        return specs.inspected_spec(self, f"{type(self).__name__} does not compute its element_spec: it needs one "
                                          "element")

    # --- options -----------------------------------------------------------------
    def options(self) -> Options:
        """The options in force: the inputs' merged, then this node's."""
        return self._merged_options().read_only()  # as tf.data: setting one would have no effect, so it raises

    def _merged_options(self) -> Options:
        # Merged down the tree without a read-only copy per node: ``options()`` makes one at the top.
        inputs = self._inputs()
        if len(inputs) == 1:
            return inputs[0]._merged_options()
        merged = Options()
        for node in inputs:
            merged = merged.merge(node._merged_options())
        return merged

    def with_options(self, options: Options) -> "Dataset":
        """Returns this pipeline with ``options`` set (later settings win)."""
        from dataservice.data import transformations as t

        return t._OptionsDataset(self, options)

    # --- sources -----------------------------------------------------------------
    @staticmethod
    def range(*args: int, output_type: Any = None, dtype: Any = None, name: Optional[str] = None) -> "Dataset":
        """``range(stop)`` or ``range(start, stop[, step])``: scalars of ``output_type`` (int64 by default;
        any integer or floating-point dtype; ``dtype=`` is the same). ``name`` is accepted as tf.data's
        and unused. ValueError without arguments or with more than 3, InvalidArgumentError for step 0.

        Example::

            >>> list(Dataset.range(1, 5, 2, output_type=np.float32))
            [np.float32(1.0), np.float32(3.0)]
        """
        from dataservice.data import sources

        if dtype is not None and output_type is not None and dtype != output_type:
            raise TypeError(f"Dataset.range(): output_type={output_type!r} and dtype={dtype!r} disagree; give one")
        return sources.RangeDataset(*args, output_type=output_type if output_type is not None else dtype)

    @staticmethod
    def from_tensor_slices(tensors: Any) -> "Dataset":
        """Slices an array, list, or tuple/dict of arrays along their first axis."""
        from dataservice.data import sources

        return sources.TensorSlicesDataset(tensors)

    @staticmethod
    def from_tensors(tensors: Any) -> "Dataset":
        """A dataset of the single element ``tensors``."""
        from dataservice.data import sources

        return sources.TensorsDataset(tensors)

    @staticmethod
    def from_generator(generator: Callable[..., Iterable], output_types: Any = None,
                       output_shapes: Any = None, args: Optional[tuple] = None,
                       output_signature: Any = None) -> "Dataset":
        """Elements of ``generator(*args)``, called anew for each iteration. Not splittable.

        ``output_signature`` (a structure of ``TensorSpec``), or ``output_types`` with optional
        ``output_shapes``, declares the elements, as in tf.data: ``element_spec`` is then known without
        calling the generator, and each element is converted to the declared dtypes and checked.
        """
        from dataservice.data import sources, specs

        return specs.with_generator_signature(sources.GeneratorDataset(generator, args), output_types,
                                              output_shapes, output_signature)

    @staticmethod
    def list_files(file_pattern: Any, shuffle: bool = False, seed: Optional[int] = None) -> "Dataset":
        """Paths (str) matching a glob pattern or list of patterns; sorted unless shuffled."""
        from dataservice.data import sources

        return sources.ListFilesDataset(file_pattern, shuffle=shuffle, seed=seed)

    @staticmethod
    def load(path: Any, element_spec: Any = None, compression: Optional[str] = None,
             reader_func: Optional[Callable[["Dataset"], "Dataset"]] = None, wait: bool = False) -> "Dataset":
        """The dataset ``save`` (or ``distributed_save``) wrote under ``path``, as tf.data's ``Dataset.load``;
        see ``dataservice.data.saved.load``. ``wait=True`` reads a ``distributed_save`` while it is written.

        Example::

            >>> ds = Dataset.load("/tmp/saved")  # knows its cardinality and element_spec; splittable
            >>> ds = Dataset.load("/tmp/distributed", wait=True)  # elements as the save commits them
        """
        from dataservice.data import saved

        return saved.load(path, element_spec=element_spec, compression=compression, reader_func=reader_func,
                          wait=wait)

    @staticmethod
    def zip(*args: Any, datasets: Any = None) -> "Dataset":
        """Zips datasets (or a nested tuple/dict of them); stops at the shortest.

        Example::

            >>> [tuple(map(int, e)) for e in Dataset.zip(Dataset.range(3), Dataset.range(1, 3))]
            [(0, 1), (1, 2)]
        """
        from dataservice.data import transformations as t

        # TypeError for no argument and for both forms, as tf.data.
        if args and datasets is not None:
            raise TypeError("Dataset.zip takes datasets as *args or as datasets=, not both")
        if not args and datasets is None:
            raise TypeError("Dataset.zip needs at least one dataset")
        # As tf.data, a single argument is the structure itself: zip(a) yields a's
        # elements as they are, zip((a,)) yields 1-tuples.
        structure = datasets if datasets is not None else args[0] if len(args) == 1 else args
        return t.ZipDataset(structure)

    # --- transformations ---------------------------------------------------------
    def concatenate(self, dataset: "Dataset") -> "Dataset":
        from dataservice.data import transformations as t

        return t.ConcatenateDataset(self, dataset)

    def map(self, map_func: Callable, num_parallel_calls: Optional[int] = None,
            deterministic: Optional[bool] = None, name: Optional[str] = None,
            output_signature: Any = None) -> "Dataset":
        """Applies ``map_func`` to each element; a tuple element is unpacked into its arguments.

        ``output_signature`` (a structure of ``TensorSpec``) declares what ``map_func`` returns: the
        ``element_spec`` is then known without calling it, and each result is converted to the
        declared dtypes and checked, as ``from_generator``'s. Without it, ``element_spec`` calls
        ``map_func`` once, on the input's first element.
        """
        from dataservice.data import specs
        from dataservice.data import transformations as t

        mapped = t.MapDataset(self, map_func, num_parallel_calls, deterministic)
        return mapped if output_signature is None else specs.declared(mapped, output_signature, "returned")

    def filter(self, predicate: Callable) -> "Dataset":
        from dataservice.data import transformations as t

        return t.FilterDataset(self, predicate)

    def batch(self, batch_size: int, drop_remainder: bool = False,
              num_parallel_calls: Optional[int] = None, deterministic: Optional[bool] = None) -> "Dataset":
        from dataservice.data import transformations as t

        return t.BatchDataset(self, batch_size, drop_remainder)

    def padded_batch(self, batch_size: int, padded_shapes: Any = None, padding_values: Any = None,
                     drop_remainder: bool = False) -> "Dataset":
        from dataservice.data import transformations as t

        return t.PaddedBatchDataset(self, batch_size, padded_shapes, padding_values, drop_remainder)

    def unbatch(self) -> "Dataset":
        from dataservice.data import transformations as t

        return t.UnbatchDataset(self)

    def shuffle(self, buffer_size: int, seed: Optional[int] = None,
                reshuffle_each_iteration: Optional[bool] = None) -> "Dataset":
        from dataservice.data import transformations as t

        return t.ShuffleDataset(self, buffer_size, seed,
                                True if reshuffle_each_iteration is None else reshuffle_each_iteration)

    def repeat(self, count: Optional[int] = None) -> "Dataset":
        from dataservice.data import transformations as t

        return t.RepeatDataset(self, count)

    def take(self, count: int) -> "Dataset":
        from dataservice.data import transformations as t

        return t.TakeDataset(self, count)

    def skip(self, count: int) -> "Dataset":
        from dataservice.data import transformations as t

        return t.SkipDataset(self, count)

    def take_while(self, predicate: Callable) -> "Dataset":
        from dataservice.data import transformations as t

        return t.TakeWhileDataset(self, predicate)

    def shard(self, num_shards: int, index: int) -> "Dataset":
        from dataservice.data import transformations as t

        return t.ShardDataset(self, num_shards, index)

    def enumerate(self, start: int = 0) -> "Dataset":
        from dataservice.data import transformations as t

        return t.EnumerateDataset(self, start)

    def flat_map(self, map_func: Callable) -> "Dataset":
        from dataservice.data import transformations as t

        return t.InterleaveDataset(self, map_func, cycle_length=1, block_length=1,
                                   num_parallel_calls=None, deterministic=None, op_name="flat_map")

    def interleave(self, map_func: Callable, cycle_length: Optional[int] = None, block_length: Optional[int] = None,
                   num_parallel_calls: Optional[int] = None, deterministic: Optional[bool] = None) -> "Dataset":
        from dataservice.data import transformations as t

        return t.InterleaveDataset(self, map_func, cycle_length=cycle_length, block_length=block_length,
                                   num_parallel_calls=num_parallel_calls, deterministic=deterministic)

    def prefetch(self, buffer_size: int) -> "Dataset":
        from dataservice.data import transformations as t

        return t.PrefetchDataset(self, buffer_size)

    def cache(self, filename: str = "") -> "Dataset":
        """Caches elements in memory, or in ``filename`` (persisting across runs)."""
        from dataservice.data import cache

        return cache.CacheDataset(self, filename)

    def save(self, path: Any, compression: Optional[str] = None,
             shard_func: Optional[Callable[..., int]] = None) -> None:
        """Runs the pipeline once and writes its elements under ``path``, atomically; see
        ``dataservice.data.saved.save``.

        Example::

            >>> Dataset.range(10).map(lambda x: x * 2).save("/tmp/saved", compression="GZIP")
        """
        from dataservice.data import saved

        saved.save(self, path, compression=compression, shard_func=shard_func)

    def unique(self) -> "Dataset":
        from dataservice.data import transformations as t

        return t.UniqueDataset(self)

    def window(self, size: int, shift: Optional[int] = None, stride: int = 1,
               drop_remainder: bool = False) -> "Dataset":
        """A dataset of windows: each a finite dataset of ``size`` elements (fewer at the end unless
        ``drop_remainder``), taking every ``stride``-th element, a window starting every ``shift``
        elements (default ``size``). For nested elements a window is the same nesting of datasets, one
        per component, as tf.data's. Sizes must be positive (``errors.InvalidArgumentError``).

        Example::

            >>> [list(w.as_numpy_iterator()) for w in Dataset.range(7).window(3, 1, 2, True)]
            [[0, 2, 4], [1, 3, 5], [2, 4, 6]]
            >>> [b.tolist() for b in Dataset.range(5).window(2, 1, drop_remainder=True).flat_map(lambda w: w.batch(2))]
            [[0, 1], [1, 2], [2, 3], [3, 4]]
        """
        from dataservice.data.transformations import windowing as windows

        return windows.WindowDataset(self, size, shift, stride, drop_remainder)

    def group_by_window(self, key_func: Callable[..., int], reduce_func: Callable[[Any, "Dataset"], "Dataset"],
                        window_size: Optional[int] = None,
                        window_size_func: Optional[Callable[[Any], int]] = None) -> "Dataset":
        """Groups elements by ``key_func`` (an integer per element); when a key's group holds
        ``window_size`` elements (or ``window_size_func(key)``), yields the elements of
        ``reduce_func(key, window)``, ``window`` being a dataset of the group. At the end of the input
        the unfinished groups are reduced too, in increasing key order, as in tf.data.

        Example::

            >>> ds = Dataset.range(10).group_by_window(lambda x: x % 2, lambda k, w: w.batch(3), window_size=3)
            >>> [b.tolist() for b in ds]
            [[0, 2, 4], [1, 3, 5], [6, 8], [7, 9]]
        """
        from dataservice.data.transformations import windowing as windows

        return windows.GroupByWindowDataset(self, key_func, reduce_func, window_size, window_size_func)

    def apply(self, transformation_func: Callable[["Dataset"], "Dataset"]) -> "Dataset":
        """Returns ``transformation_func(self)``; chains custom transformations."""
        result = transformation_func(self)
        if not isinstance(result, Dataset):
            raise TypeError(
                f"apply() expects its function to return a Dataset, got {type(result).__name__}")
        return result


class _ClosingIterator:
    """The iterator a pipeline hands out; frees the pipeline's threads when done, and saves and restores
    its position (``state_dict``, ``load_state_dict``: see ``dataservice.data.checkpoint``)."""

    __slots__ = ("_it", "_ctx", "__next__", "_dataset", "_started", "_fingerprint", "__weakref__")

    def __init__(self, it: Iterator, ctx: IteratorContext, dataset: Optional[Dataset] = None):
        self._it = it
        self._ctx = ctx
        self._dataset = dataset
        self._started = False
        self._fingerprint: Optional[str] = None
        # The first element goes through _first, which then binds the inner __next__ directly: no extra
        # Python frame per element after it. A weak reference, so that the iterator stays free of cycles
        # (its __del__ frees the pipeline's threads as soon as it is dropped).
        self.__next__ = _first_next(weakref.ref(self), it)

    def __iter__(self) -> "_ClosingIterator":
        return self

    def stats(self) -> Any:
        """What this iterator's consumer saw of the service so far (``ReaderStats``: elements,
        bytes, the time it waited for data — stall — and the elapsed time), over every distributed dataset
        read in the pipeline, whatever transformations follow it; zeros when none was read.

        Example::

            >>> it = iter(ds.apply(distribute("distributed_epoch", target)).prefetch(2))
            >>> for batch in it: ...
            >>> it.stats().stall_fraction
        """
        return self._ctx.read_stats().stats()

    # tf.data.Iterator's methods. ``for`` and ``next()`` never go through them: ``__next__`` is the
    # inner iterator's own (plain StopIteration at the end, as TensorFlow's ``next()``).
    def get_next(self) -> Any:
        """The next element; ``errors.OutOfRangeError`` at the end (a StopIteration too, so it ends a loop).

        Example::

            >>> it = iter(Dataset.range(2))
            >>> it.get_next(), it.get_next()
            (0, 1)
        """
        try:
            return self.__next__()
        except StopIteration:
            from dataservice.errors import OutOfRangeError

            raise OutOfRangeError("End of sequence") from None

    def get_next_as_optional(self) -> Any:
        """The next element in a ``dataservice.data.Optional``, one without a value at the end.

        Example::

            >>> it = iter(Dataset.from_tensors(42))
            >>> it.get_next_as_optional().get_value(), it.get_next_as_optional().has_value()
            (42, False)
        """
        from dataservice.data.iterators import Optional as _Optional

        try:
            value = self.__next__()
        except StopIteration:
            return _Optional(spec_source=self._dataset)
        return _Optional(value, spec_source=self._dataset)

    @property
    def element_spec(self) -> Any:
        """The spec of the elements this iterator yields: its dataset's ``element_spec``."""
        return self._dataset.element_spec

    # torch's Stateful protocol (torch.distributed.checkpoint, torchdata), as Grain's get_state/set_state.
    def state_dict(self) -> dict:
        """The iterator's position: a plain dict that ``json.dumps`` accepts, holding positions rather than
        elements (except the buffers of shuffle, group_by_window and unique: see the README). Taking
        it does not change what comes next. ``NotCheckpointableError`` names a transformation that cannot
        save its position (``from_generator``).

        Example::

            >>> it = iter(Dataset.range(100).batch(10))
            >>> _ = next(it)
            >>> json.dumps(it.state_dict())  # beside the model's checkpoint
        """
        from dataservice.data import checkpoint

        position = checkpoint.save_input(self._it, self._dataset)
        return {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "pipeline": self._pipeline(),
                "position": position}

    def load_state_dict(self, state: dict) -> None:
        """Seeks this new iterator (no element read yet) to where ``state`` (from ``state_dict``, of the same
        pipeline, built again in this process or another) was taken: it then yields exactly the elements the
        saved iterator would have. ValueError for a state of another pipeline (naming both fingerprints), a
        malformed state or an unknown version, and after ``next()``.

        Example::

            >>> it = iter(make_pipeline())
            >>> it.load_state_dict(json.load(open("input_state.json")))
        """
        from dataservice.data import checkpoint

        if self._started:
            raise ValueError("load_state_dict() must come before the iterator's first element: this iterator "
                             "has yielded elements already; make a new one with iter(dataset)")
        if not isinstance(state, dict):
            raise ValueError(f"load_state_dict() expects the dict state_dict() returned, got {type(state).__name__}")
        if state.get("format") != checkpoint.FORMAT:
            raise ValueError(f"this is not an iterator state of dataservice: its 'format' is {state.get('format')!r}, "
                             f"expected {checkpoint.FORMAT!r}")
        if state.get("version") != checkpoint.VERSION:
            raise ValueError(f"iterator state version {state.get('version')!r} is not known to this dataservice, "
                             f"which reads version {checkpoint.VERSION}: was it written by a newer release?")
        theirs, mine = state.get("pipeline"), self._pipeline()
        if theirs != mine:
            raise ValueError(f"the iterator state is of another pipeline: it was taken from pipeline {theirs}, "
                             f"this iterator's is {mine}; build the same pipeline (same transformations, "
                             "arguments and functions) to restore it")
        if "position" not in state:
            raise ValueError("malformed iterator state: 'position' is missing")
        try:
            checkpoint.restore_input(self._it, self._dataset, state["position"])
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed iterator state: {type(exc).__name__}: {exc}") from exc

    def _pipeline(self) -> str:
        if self._fingerprint is None:
            from dataservice.data.checkpoint import pipeline_fingerprint

            self._fingerprint = pipeline_fingerprint(self._dataset)
        return self._fingerprint

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()
        self._ctx.close()

    def __del__(self) -> None:
        try:
            # Not the readers: their generators, collected with this iterator, stop them (and a reader's close
            # talks to the dispatcher, which a collection at interpreter exit must not wait on).
            self._ctx.close(stop_readers=False)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _first_next(ref: "weakref.ref[_ClosingIterator]", it: Iterator) -> Callable[[], Any]:
    inner = it.__next__

    def first() -> Any:
        owner = ref()
        if owner is not None:
            owner._started = True
            owner.__next__ = inner
        return inner()

    return first


# --- split groups: distributed_epoch's unit of work and of recovery ------------------------

#: A pass is cut into at least this many groups when it has this many splits, so that an epoch's
#: groups spread over workers (a larger derived group size is capped).
MIN_SPLIT_GROUPS = 4
#: Elements a split is taken to hold where the pipeline cannot tell (a file of records; what an
#: interleave, flat_map or unbatch makes), when sizing a group to fill a shuffle buffer.
ASSUMED_SPLIT_ELEMENTS = 1024
#: Splits an ``interleave(cycle_length=AUTOTUNE)`` asks a group for. Not the core count it resolves
#: to: a grouping must not depend on the host that computes it (client or worker).
AUTOTUNE_CYCLE_SPLITS = 8


@dataclasses.dataclass(frozen=True)
class SplitGroups:
    """How distributed_epoch groups a pipeline's splits (``Dataset.split_groups``).

    The dispatcher hands out group indices ``0 .. num_groups-1`` (-1: without end, under
    ``repeat()``) as it would splits. Each pass of the pipeline (``pass_splits`` splits: one
    repetition under its outermost ``repeat``) is cut into ``groups_per_pass`` runs of consecutive
    splits, as even as can be, so no group is smaller than ``group_size``; group ``g`` is run
    ``g % groups_per_pass`` of pass ``g // groups_per_pass``, and no group spans two passes.

    Example::

        >>> SplitGroups(num_splits=10, pass_splits=10, groups_per_pass=3, num_groups=3).splits(1)
        range(3, 6)
    """

    num_splits: int
    pass_splits: int
    groups_per_pass: int
    num_groups: int

    @property
    def group_size(self) -> int:
        """The fewest splits a group holds (the groups of a pass differ by one split at most)."""
        return self.pass_splits // self.groups_per_pass

    def splits(self, group: int) -> range:
        """The split indices of group ``group``, in order."""
        if not isinstance(group, int) or isinstance(group, bool):
            try:
                group = operator.index(group)  # numpy integers
            except TypeError:
                raise TypeError(f"group must be an int, got {group!r}") from None
        if group < 0 or 0 <= self.num_groups <= group:
            bound = "without end" if self.num_groups < 0 else f"below {self.num_groups}"
            raise ValueError(f"group must be >= 0 and {bound}, got {group}")
        passes, run = divmod(group, self.groups_per_pass)
        base, size, runs = passes * self.pass_splits, self.pass_splits, self.groups_per_pass
        return range(base + run * size // runs, base + (run + 1) * size // runs)


def _split_groups(dataset: Dataset, registered: Optional[int], sized: bool = True) -> SplitGroups:
    """``sized=False``: the groups of the sources' own split sizes, as every pipeline had before splits were
    sized from its batches (``unsized_num_groups``)."""
    if registered is not None and (not isinstance(registered, int) or isinstance(registered, bool)
                                   or registered < INFINITE_CARDINALITY):
        raise ValueError(f"num_groups must be an int >= -1 or None, got {registered!r}")
    if sized:
        n = dataset.num_splits()  # NotSplittableError naming the culprit
        dataset = _split_view(dataset)
    else:
        dataset._split_source()  # NotSplittableError naming the culprit
        n = dataset._num_splits()
    passes = _pass_splits(dataset)
    if n == 0:
        groups = SplitGroups(0, 1, 1, 0)
    elif passes <= 0 or (n > 0 and n % passes):
        # No pass to cut (say, an infinite input under a finite repeat): one split per group.
        groups = SplitGroups(n, 1, 1, n)
    elif registered is not None and registered >= 0 and n > 0:
        # The registered count decides, not this process's derivation: a registration made by another
        # version (or before groups existed: one split per group) is read as it was meant.
        per_pass, extra = divmod(registered, n // passes)
        if extra or not 1 <= per_pass <= passes:
            per_pass = 0  # no whole groups: the check below says so
        groups = SplitGroups(n, passes, max(1, per_pass), per_pass * (n // passes))
    else:
        per_pass = max(1, passes // _group_size(dataset, passes))
        groups = SplitGroups(n, passes, per_pass, per_pass * (n // passes) if n > 0 else INFINITE_CARDINALITY)
    if registered is not None and (registered != groups.num_groups or (registered == 0 and n != 0)):
        raise ValueError(
            f"{dataset._describe()}: the dataset was registered with {registered} split groups, which do not "
            f"divide its {n} splits ({passes} per pass) into whole groups; was it registered by another "
            "version of dataservice? Register it again with this one.")
    return groups


def unsized_num_groups(dataset: Dataset) -> int:
    """The split groups ``dataset`` had before splits were sized from its batches (dataservice before
    issue 28's split sizing): what a read position saved then counts in. Equal to
    ``dataset.split_groups().num_groups`` for every pipeline without a batch over a range or
    from_tensor_slices source; a small batched one had fewer groups then.

    Example::

        >>> ds = Dataset.range(200).batch(32)
        >>> ds.split_groups().num_groups, unsized_num_groups(ds)
        (7, 1)
    """
    return _split_groups(dataset, None, sized=False).num_groups


_SPLIT_VIEWS: "weakref.WeakKeyDictionary[Dataset, Optional[Dataset]]" = weakref.WeakKeyDictionary()
_SPLIT_VIEWS_LOCK = threading.Lock()


def _split_view(root: Dataset) -> Dataset:
    """``root`` with the splits of its range and from_tensor_slices sources sized for it: each holds a
    whole number of the pipeline's output elements (``split_size_for``'s ``unit``: the product of the
    batch sizes above the source), so that a group of whole splits ends on a batch's end, and small
    batched datasets still have a group per batch or so for every worker. What this reads is the
    pipeline only, never the cluster or the host, so the client that registers a dataset and every
    worker that runs it derive the same splits. A source pickled before it was sized so keeps its
    registered size. The sources changed are copies (and the nodes above them): ``root`` itself, and
    a source shared with another pipeline, stay as they were.

    Example::

        >>> ds = Dataset.range(200).map(lambda x: x * 2).batch(32)
        >>> ds.num_splits(), len(ds.split_groups().splits(0))
        (7, 1)
    """
    try:
        with _SPLIT_VIEWS_LOCK:
            cached = _SPLIT_VIEWS.get(root, _SPLIT_VIEW_UNKNOWN)
    except TypeError:  # not weakly referable, or unhashable: derived every time
        cached = _SPLIT_VIEW_UNKNOWN
    if cached is not _SPLIT_VIEW_UNKNOWN:
        return root if cached is None else cached
    view = _sized_for_pipeline(root)
    try:
        with _SPLIT_VIEWS_LOCK:
            _SPLIT_VIEWS[root] = None if view is root else view  # None: no reference back to the key
    except TypeError:
        pass
    return view


_SPLIT_VIEW_UNKNOWN = object()


def _split_units(root: Dataset) -> dict:
    """``{id(source): (source, unit)}`` for the pipeline's indexed sources: ``unit`` source elements
    make one output element (the largest over the paths from the source to ``root``)."""
    from dataservice.data import cache, experimental, sources, specs
    from dataservice.data import transformations as t

    passing = (t.MapDataset, t.FilterDataset, t.RepeatDataset, t.TakeDataset, t.SkipDataset, t.TakeWhileDataset,
               t.EnumerateDataset, t.PrefetchDataset, t.UniqueDataset, t._OptionsDataset, t.ZipDataset,
               t.ConcatenateDataset, t.ShuffleDataset, cache.CacheDataset, specs.DeclaredSpecDataset,
               experimental._StatsDataset)
    units: dict = {}
    seen: set = set()
    stack = [(root, 1)]
    while stack:
        node, unit = stack.pop()
        if (id(node), unit) in seen:
            continue
        seen.add((id(node), unit))
        if isinstance(node, (sources.RangeDataset, sources.TensorSlicesDataset)):
            if unit > units.get(id(node), (node, 0))[1]:
                units[id(node)] = (node, unit)
            continue
        if isinstance(node, t.BatchDataset):  # and padded_batch
            below = unit * node._batch_size
        elif isinstance(node, t.ShardDataset) and node._num_shards > 0:
            below = unit * node._num_shards
        elif isinstance(node, passing):
            below = unit
        else:  # interleave, unbatch, window, ...: its output elements are not a count of its input's
            below = 1
        stack.extend((child, below) for child in node._inputs())
    return units


def _sized_for_pipeline(root: Dataset) -> Dataset:
    from dataservice.data import sources
    from dataservice.data.static_sharding import _rewrite

    sizes = {}
    for key, (source, unit) in _split_units(root).items():
        if getattr(source, "_split_by_pipeline", False):
            size = sources.split_size_for(source.cardinality(), unit)
            if size != source._split_size:
                sizes[key] = size
    if not sizes:
        return root

    def change(node: Dataset) -> Optional[Dataset]:
        if id(node) not in sizes:
            return None
        new = copy.copy(node)
        new._split_size = sizes[id(node)]
        return new

    return _rewrite(root, change)


def _pass_splits(dataset: Dataset) -> int:
    """Splits of one pass: those of the outermost repeat's input (every split, without a repeat)."""
    from dataservice.data.transformations import RepeatDataset

    node = dataset
    while True:
        if isinstance(node, RepeatDataset):
            return node._input._num_splits()
        inputs = node._inputs()
        if len(inputs) != 1:
            return node._num_splits()
        node = inputs[0]


def _group_size(dataset: Dataset, passes: int) -> int:
    """The fewest splits a group should hold: the option, else what the pipeline wants, capped so
    that a pass has ``MIN_SPLIT_GROUPS`` groups."""
    chosen = dataset.options().experimental_distribute.split_group_size
    if chosen is None:
        chosen = min(_group_profile(dataset)[1], passes // MIN_SPLIT_GROUPS)
    return max(1, min(chosen, passes))


def _group_profile(node: Dataset) -> tuple[Optional[float], int]:
    """(elements per split at ``node``'s output, None where unknown; splits a group needs for the
    interleaves and shuffles at or below ``node`` to span splits). Only the nodes that read the
    split provider count: datasets built inside an interleave's function read none."""
    from dataservice.data import cache, experimental, sources, specs
    from dataservice.data import transformations as t

    if isinstance(node, sources.SplittableSource):
        if isinstance(node, sources.ListFilesDataset):
            return 1.0, 1
        if isinstance(node, (sources.RangeDataset, sources.TensorSlicesDataset)):
            return float(node._split_size), 1
        return None, 1  # files of records: how many is not known without reading them
    profiles = [_group_profile(child) for child in node._inputs()]
    need = max((wanted for _, wanted in profiles), default=1)
    sizes = [size for size, _ in profiles]
    size = min(sizes) if sizes and None not in sizes else None
    if isinstance(node, t.ShuffleDataset) and node._buffer_size == UNKNOWN_CARDINALITY:
        need = max(need, node._num_splits())  # shuffle(-2) buffers its whole input: as many splits as capped
    elif isinstance(node, t.ShuffleDataset):
        need = max(need, math.ceil(node._buffer_size / (size or ASSUMED_SPLIT_ELEMENTS)))
    elif isinstance(node, t.InterleaveDataset):
        cycle = AUTOTUNE_CYCLE_SPLITS if node._cycle_length == AUTOTUNE else node._cycle_length
        need = max(need, math.ceil(cycle / (size or ASSUMED_SPLIT_ELEMENTS)))
        size = None
    elif isinstance(node, t.BatchDataset):  # and padded_batch
        size = size / node._batch_size if size else None
    elif isinstance(node, t.ShardDataset):
        size = size / node._num_shards if size else None
    elif not isinstance(node, (t.MapDataset, t.FilterDataset, t.RepeatDataset, t.TakeDataset, t.SkipDataset,
                               t.TakeWhileDataset, t.EnumerateDataset, t.PrefetchDataset, t.UniqueDataset,
                               t._OptionsDataset, t.ZipDataset, t.ConcatenateDataset, cache.CacheDataset,
                               specs.DeclaredSpecDataset, experimental._StatsDataset)):
        size = None  # unbatch, or a node this estimate does not know
    return size, need
