"""Transformation nodes: map, filter, batch, shuffle, repeat, interleave, ...

Each node validates its arguments at construction, with the kind of error
tf.data raises there (see ``ARGUMENT_ERRORS``), naming the argument; computes
its cardinality the way tf.data does, and makes its iterator from its input's.
Where tf.data checks an input's element_spec at construction (concatenate,
padded_batch, unbatch, unique), so does the node when that spec is known without
reading an element; otherwise it checks the first elements it meets. Exceptions
raised by user functions surface with their original type and message, chained,
naming the transformation.

Example::

    >>> ds = Dataset.range(1, 6).interleave(
    ...     lambda x: Dataset.from_tensors(x).repeat(6), cycle_length=2, block_length=4)
    >>> [int(x) for x in ds][:10]
    [1, 1, 1, 1, 2, 2, 2, 2, 1, 1]
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any, Callable, Iterator, NoReturn, Optional

import numpy as np

from dataservice.data import structure
from dataservice.data.background import Pump
from dataservice.data.dataset import (AUTOTUNE_CYCLE_SPLITS, INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset,
                                      IteratorContext, _function_name)
from dataservice.data.options import AUTOTUNE, Options, default_parallelism
from dataservice.errors import InvalidArgumentError
from dataservice.data.static_sharding import SHARD_HINT

__all__ = [
    "MapDataset", "FilterDataset", "BatchDataset", "PaddedBatchDataset", "UnbatchDataset", "ShuffleDataset",
    "RepeatDataset", "TakeDataset", "SkipDataset", "TakeWhileDataset", "ShardDataset", "EnumerateDataset",
    "InterleaveDataset", "PrefetchDataset", "UniqueDataset", "ZipDataset", "ConcatenateDataset",
    "raise_user_error", "shuffle_and_repeat", "ARGUMENT_ERRORS",
]

#: The kind of error a wrong argument gets, as tf.data's (TensorFlow 2.21, eager): what the README's table lists.
ARGUMENT_ERRORS = {
    "a count, size, seed or index that is not an int (e.g. take(1.5), batch('2'))": "TypeError",
    "batch/padded_batch batch_size < 1; shuffle buffer_size < 1 (other than -2: the whole input)":
        "InvalidArgumentError",
    "prefetch buffer_size < -1; shard num_shards < 1 or index outside [0, num_shards)": "InvalidArgumentError",
    "map/interleave num_parallel_calls, interleave cycle_length: 0 or < -1; block_length < 1":
        "InvalidArgumentError",
    "map/filter/flat_map/interleave/take_while/reduce with a function that is not callable": "ValueError",
    "Dataset.zip() with no dataset, or with something other than datasets (a list included)": "TypeError",
    "concatenate of datasets whose structures or dtypes differ": "TypeError",
    "padded_batch padding_values of another dtype than its component": "TypeError",
    "padded_batch padding_values that are not scalars; padded_shapes that do not fit": "ValueError",
    "unbatch of scalar components, or of components whose leading dimensions differ": "ValueError",
    "unique of elements that are not int32, int64 or string": "TypeError",
    "unique of elements with several components": "InvalidArgumentError",
    "apply with a function that does not return a Dataset": "TypeError",
}


def raise_user_error(exc: Exception, where: str) -> NoReturn:
    """Re-raises a user function's exception: same type, message naming ``where``, chained."""
    if getattr(exc, "_dataservice_where", None) is not None:
        raise exc  # an inner transformation already named itself
    try:
        new = type(exc)(f"{exc} [raised in {where}]")
    except Exception:
        new = None
    if new is None or type(new) is not type(exc):
        if hasattr(exc, "add_note"):  # Python >= 3.11
            exc.add_note(f"raised in {where}")
        exc._dataservice_where = where
        raise exc
    new._dataservice_where = where
    raise new from exc


def _check_int(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def _check_count(name: str, value: Any, minimum: int) -> int:
    # tf.data refuses these values when it builds the op: InvalidArgumentError (a ValueError here).
    value = _check_int(name, value)
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_signed_count(name: str, value: Any) -> int:
    """take/skip/repeat's count: as tf.data, every negative count means -1 (all, or forever)."""
    return max(-1, _check_int(name, value))


def _check_parallelism(name: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if _check_int(name, value) == AUTOTUNE:
        return AUTOTUNE
    if value < 1:
        raise InvalidArgumentError(f"{name} must be >= 1 or AUTOTUNE (-1), got {value}")
    return int(value)


def _check_callable(name: str, fn: Any) -> Callable:
    # ValueError, as tf.data's "Argument `func` must be a callable".
    if not callable(fn):
        raise ValueError(f"{name} must be callable, got {fn!r}")
    return fn


def _static_spec(dataset: Dataset) -> Any:
    """``dataset``'s element_spec when it is known without reading an element (else None): what a node
    checks at construction, as tf.data does. A pipeline whose spec needs an element stays lazy."""
    from dataservice.data import specs

    return specs.static_element_spec(dataset)[0]


def _spec_of(element: Any) -> Any:
    from dataservice.data import specs

    return specs.spec_from_value(element)


class _UnaryDataset(Dataset):
    def __init__(self, input_dataset: Dataset):
        if not isinstance(input_dataset, Dataset):
            raise TypeError(f"expected a Dataset, got {type(input_dataset).__name__}")
        self._input = input_dataset

    def _inputs(self) -> tuple[Dataset, ...]:
        return (self._input,)

    def cardinality(self) -> int:
        return self._input.cardinality()

    def _element_spec(self) -> Any:
        # filter, shuffle, repeat, take, skip, prefetch, cache, ...: elements pass through unchanged.
        return self._input.element_spec

    def _producer(self) -> Dataset:
        # Those that keep this _element_spec pass their input's elements on unchanged (see above): the
        # element came from further up.
        if type(self)._element_spec is _UnaryDataset._element_spec:
            return self._input._producer()
        return self


class _OptionsDataset(_UnaryDataset):
    _op_name = "Dataset.with_options"

    def __init__(self, input_dataset: Dataset, options: Options):
        super().__init__(input_dataset)
        if not isinstance(options, Options):
            raise TypeError(f"with_options expects an Options, got {type(options).__name__}")
        self._options = options

    def _merged_options(self) -> Options:
        return self._input._merged_options().merge(self._options)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return self._input._iterator(ctx)


def _deterministic(explicit: Optional[bool], ctx: IteratorContext) -> bool:
    if explicit is not None:
        return explicit
    return ctx.options.deterministic is not False


def _in_flight(num_parallel_calls: int, ctx: IteratorContext) -> int:
    n = default_parallelism() if num_parallel_calls == AUTOTUNE else num_parallel_calls
    cap = ctx.options.threading.max_intra_op_parallelism
    return max(1, min(n, cap) if cap else n)


class MapDataset(_UnaryDataset):
    def __init__(self, input_dataset: Dataset, fn: Callable, num_parallel_calls: Optional[int],
                 deterministic: Optional[bool]):
        super().__init__(input_dataset)
        self._fn = _check_callable("map_func", fn)
        self._num_parallel_calls = _check_parallelism("num_parallel_calls", num_parallel_calls)
        self._deterministic = deterministic

    def _describe(self) -> str:
        return f"Dataset.map({_function_name(self._fn)})"

    def _element_spec(self) -> Any:
        # No output_signature (Dataset.map wraps this node when there is one): call fn on one element.
        from dataservice.data import specs

        return specs.traced_spec(self._input, self._fn, self._describe())

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        it = self._input._iterator(ctx)
        if self._num_parallel_calls is None:
            return self._sequential(it)
        return self._parallel(it, ctx)

    def _sequential(self, it: Iterator) -> Iterator:
        fn, normalize, where = self._fn, structure.normalize, self._describe()
        for x in it:
            try:
                y = fn(*x) if type(x) is tuple else fn(x)
            except Exception as exc:
                raise_user_error(exc, where)
            yield normalize(y)

    def _parallel(self, it: Iterator, ctx: IteratorContext) -> Iterator:
        fn, normalize, where = self._fn, structure.normalize, self._describe()

        def call(x):
            return normalize(fn(*x) if type(x) is tuple else fn(x))

        pool = ctx.thread_pool()
        limit = _in_flight(self._num_parallel_calls, ctx)
        if _deterministic(self._deterministic, ctx):
            pending: deque = deque()
            try:
                for x in it:
                    pending.append(pool.submit(call, x))
                    if len(pending) >= limit:
                        yield _result(pending.popleft(), where)
                while pending:
                    yield _result(pending.popleft(), where)
            finally:
                for f in pending:
                    f.cancel()
            return
        running: set = set()
        try:
            exhausted = False
            while True:
                while not exhausted and len(running) < limit:
                    try:
                        x = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    running.add(pool.submit(call, x))
                if not running:
                    return
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    yield _result(f, where)
        finally:
            for f in running:
                f.cancel()


def _result(future, where: str) -> Any:
    try:
        return future.result()
    except Exception as exc:
        raise_user_error(exc, where)


class FilterDataset(_UnaryDataset):
    def __init__(self, input_dataset: Dataset, predicate: Callable):
        super().__init__(input_dataset)
        self._predicate = _check_callable("predicate", predicate)

    def _describe(self) -> str:
        return f"Dataset.filter({_function_name(self._predicate)})"

    def cardinality(self) -> int:
        # As tf.data: unknown even over an infinite input (the predicate may reject
        # everything), e.g. range(42).repeat().filter(f) is UNKNOWN_CARDINALITY.
        return UNKNOWN_CARDINALITY

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        pred, where = self._predicate, self._describe()
        for x in self._input._iterator(ctx):
            try:
                keep = pred(*x) if type(x) is tuple else pred(x)
            except Exception as exc:
                raise_user_error(exc, where)
            if keep:
                yield x


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
        while True:
            chunk = list(islice(it, size))
            if not chunk or (drop and len(chunk) < size):
                return
            yield chunk

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        stack = structure.stack
        for chunk in self._batches(self._input._iterator(ctx)):
            yield stack(chunk)


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
        from dataservice.data import specs

        checked = _static_spec(self._input) is not None
        for chunk in self._batches(self._input._iterator(ctx)):
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
        unstack = structure.unstack
        for x in self._input._iterator(ctx):
            yield from unstack(x)


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


class ShuffleDataset(_UnaryDataset):
    _op_name = "Dataset.shuffle"

    def __init__(self, input_dataset: Dataset, buffer_size: int, seed: Optional[int], reshuffle: bool):
        super().__init__(input_dataset)
        self._buffer_size = _check_shuffle_buffer(buffer_size)
        if seed is not None:
            # Any int64, as tf.data; a negative seed is its unsigned 64-bit twin (random.Random would
            # otherwise take -3 and 3 for the same seed).
            seed = _check_int("seed", seed) % 2 ** 64
        self._reshuffle = bool(reshuffle)
        # Without a seed and without reshuffling, tf.data fixes one random order at construction.
        self._seed = seed if seed is not None or reshuffle else random.SystemRandom().randrange(2 ** 62)
        self._epochs = itertools.count()

    def __getstate__(self) -> dict:
        # The epoch counter is iteration state, not part of the pipeline: a copy
        # (e.g. on a worker) starts at the first epoch, and iterating locally does
        # not change the serialized bytes (the dataset fingerprint). Python 3.14
        # also cannot pickle itertools.count.
        state = self.__dict__.copy()
        del state["_epochs"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._epochs = itertools.count()

    def _rng(self, ctx: IteratorContext) -> random.Random:
        epoch = next(self._epochs)
        if self._seed is None:
            return random.Random()
        if ctx.split_hint is not None:
            # A split group of distributed_epoch: the order must depend on the group alone, so
            # that a group redone elsewhere (after a worker loss) comes out the same.
            return random.Random(self._seed * 1_000_003 + 999_983 * (ctx.split_hint + 1))
        if not self._reshuffle:
            return random.Random(self._seed)
        return random.Random(self._seed * 1_000_003 + epoch)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        rand = self._rng(ctx).random
        it = self._input._iterator(ctx)
        buf = list(it if self._buffer_size == UNKNOWN_CARDINALITY else itertools.islice(it, self._buffer_size))
        size = len(buf)
        for x in it:
            i = int(rand() * size)
            out = buf[i]
            buf[i] = x
            yield out
        while buf:
            i = int(rand() * len(buf))
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()


def _check_shuffle_buffer(buffer_size: Any) -> int:
    """shuffle's buffer_size: >= 1, or UNKNOWN_CARDINALITY (-2) for the whole input, as tf.data."""
    if _check_int("buffer_size", buffer_size) == UNKNOWN_CARDINALITY:
        return UNKNOWN_CARDINALITY
    return _check_count("buffer_size", buffer_size, 1)


class RepeatDataset(_UnaryDataset):
    _op_name = "Dataset.repeat"

    def __init__(self, input_dataset: Dataset, count: Optional[int]):
        super().__init__(input_dataset)
        self._count = -1 if count is None else _check_signed_count("count", count)

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if self._count < 0:
            # As tf.data: repeat() of anything but an empty input is infinite, even
            # when the input's own count is unknown.
            return 0 if n == 0 else INFINITE_CARDINALITY
        if self._count == 0:
            return 0
        if n < 0:
            return n
        return n * self._count

    def _num_splits(self) -> int:
        n = self._input._num_splits()
        if self._count < 0:
            return INFINITE_CARDINALITY if n else 0
        return n * self._count if n >= 0 else n

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if ctx.split_provider is not None:
            # The provider numbers the splits of every repetition; one pass reads them all.
            yield from self._input._iterator(ctx)
            return
        # As tf.data: repeat(count) goes through all its epochs, however many are empty. repeat() ends at
        # an empty epoch (an empty input would spin forever), unless its input reads from the service:
        # there an epoch is empty when other readers of a shared job took all of it, and the next
        # iteration of the job has elements again.
        forever = self._count < 0
        ends_when_empty = forever and not self._input._reads_from_service()
        for _ in itertools.count() if forever else range(self._count):
            produced = False
            for x in self._input._iterator(ctx):
                produced = True
                yield x
            if not produced and ends_when_empty:
                return


class TakeDataset(_UnaryDataset):
    _op_name = "Dataset.take"

    def __init__(self, input_dataset: Dataset, count: int):
        super().__init__(input_dataset)
        # Any negative count takes everything, as tf.data.
        self._count = _check_signed_count("count", count)
        # The count as given, for cardinality(): tf.data's take_dataset_op.cc computes it from the raw
        # count, so take(-5) of range(10) says min(10, -5) = -5, a negative number that is no count.
        self._given_count = int(count)

    def cardinality(self) -> int:
        # take_dataset_op.cc's CardinalityInternal, step for step.
        n = self._input.cardinality()
        if n == UNKNOWN_CARDINALITY:
            return n
        if n == INFINITE_CARDINALITY:
            return self._given_count
        if self._given_count == INFINITE_CARDINALITY:
            return n
        return min(n, self._given_count)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        it = self._input._iterator(ctx)
        return it if self._count == -1 else itertools.islice(it, self._count)


class SkipDataset(_UnaryDataset):
    _op_name = "Dataset.skip"

    def __init__(self, input_dataset: Dataset, count: int):
        super().__init__(input_dataset)
        self._count = _check_signed_count("count", count)  # any negative count skips everything

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if n < 0:
            return n  # as tf.data, even for skip(-1), which yields nothing
        if self._count == -1:
            return 0
        return max(0, n - self._count)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if self._count == -1:
            # As tf.data: nothing, without reading the input (an infinite input too).
            return iter(())
        return itertools.islice(self._input._iterator(ctx), self._count, None)


class TakeWhileDataset(_UnaryDataset):
    def __init__(self, input_dataset: Dataset, predicate: Callable):
        super().__init__(input_dataset)
        self._predicate = _check_callable("predicate", predicate)

    def _describe(self) -> str:
        return f"Dataset.take_while({_function_name(self._predicate)})"

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        pred, where = self._predicate, self._describe()
        for x in self._input._iterator(ctx):
            try:
                keep = pred(*x) if type(x) is tuple else pred(x)
            except Exception as exc:
                raise_user_error(exc, where)
            if not keep:
                return
            yield x


class ShardDataset(_UnaryDataset):
    _op_name = "Dataset.shard"

    def __init__(self, input_dataset: Dataset, num_shards: int, index: int):
        super().__init__(input_dataset)
        # num_shards == SHARD_HINT (index a number or SHARD_HINT too): a placeholder static sharding by HINT
        # replaces (data/static_sharding.py). As tf.data, a real num_shards needs 0 <= index < num_shards.
        hint = num_shards is SHARD_HINT or num_shards == SHARD_HINT
        self._num_shards = SHARD_HINT if hint else _check_count("num_shards", num_shards, 1)
        self._index = SHARD_HINT if hint and index == SHARD_HINT else _check_count("index", index, 0)
        if not hint and self._index >= self._num_shards:
            raise InvalidArgumentError(f"index must be < num_shards ({self._num_shards}), got {self._index}")

    def _unresolved_hint(self) -> bool:
        return SHARD_HINT in (self._num_shards, self._index)

    def cardinality(self) -> int:
        n = self._input.cardinality()
        if n < 0:
            return n
        if self._unresolved_hint():
            return UNKNOWN_CARDINALITY  # known once the placeholder is replaced
        return n // self._num_shards + (1 if self._index < n % self._num_shards else 0)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if self._unresolved_hint():
            raise InvalidArgumentError(
                f"Dataset.shard({'SHARD_HINT' if self._num_shards == SHARD_HINT else self._num_shards}, "
                f"{'SHARD_HINT' if self._index == SHARD_HINT else self._index}): SHARD_HINT is a placeholder that only "
                f"static sharding by HINT replaces, by shard(num_workers, worker_index): read the pipeline through "
                f"distribute(ShardingPolicy.HINT, ...) on a dispatcher with worker_addresses, or pass numbers")
        return itertools.islice(self._input._iterator(ctx), self._index, None, self._num_shards)


class EnumerateDataset(_UnaryDataset):
    _op_name = "Dataset.enumerate"

    def __init__(self, input_dataset: Dataset, start: int):
        super().__init__(input_dataset)
        self._start = _check_int("start", start)

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return (specs.TensorSpec((), np.int64), self._input.element_spec)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return zip(map(np.int64, itertools.count(self._start)), self._input._iterator(ctx))


class InterleaveDataset(_UnaryDataset):
    """``interleave`` and ``flat_map`` (an interleave with cycle_length=1)."""

    def __init__(self, input_dataset: Dataset, fn: Callable, cycle_length: Optional[int],
                 block_length: Optional[int], num_parallel_calls: Optional[int], deterministic: Optional[bool],
                 op_name: str = "interleave"):
        super().__init__(input_dataset)
        self._fn = _check_callable("map_func", fn)
        self._op = op_name
        self._cycle_length = AUTOTUNE if cycle_length is None else _check_parallelism("cycle_length", cycle_length)
        self._block_length = 1 if block_length is None else _check_count("block_length", block_length, 1)
        self._num_parallel_calls = _check_parallelism("num_parallel_calls", num_parallel_calls)
        self._deterministic = deterministic

    def _describe(self) -> str:
        return f"Dataset.{self._op}({_function_name(self._fn)})"

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        # That of the dataset the function returns, for the input's first element.
        return specs.returned_dataset_spec(self._input, self._fn, self._describe())

    def cardinality(self) -> int:
        # As tf.data: unknown whatever the input, since each input element may map
        # to any number of elements (an infinite input of empty datasets yields none).
        return UNKNOWN_CARDINALITY

    def _open(self, x: Any, ctx: IteratorContext) -> Iterator:
        where = self._describe()
        try:
            ds = self._fn(*x) if type(x) is tuple else self._fn(x)
        except Exception as exc:
            raise_user_error(exc, where)
        if not isinstance(ds, Dataset):
            raise TypeError(f"{where}: the function must return a Dataset, got {type(ds).__name__}")
        return ds._iterator(ctx.without_splits())

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        cycle = self._cycle_length
        if cycle == AUTOTUNE:
            # A service task's group of splits must give the same order on any worker that redoes it
            # (exactly once): not the host's core count there, but a constant.
            cycle = default_parallelism() if ctx.split_hint is None else AUTOTUNE_CYCLE_SPLITS
        if self._num_parallel_calls is None:
            return self._sequential(ctx, cycle)
        return self._parallel(ctx, cycle)

    def _sequential(self, ctx: IteratorContext, cycle: int) -> Iterator:
        it = self._input._iterator(ctx)
        block = self._block_length
        slots: list = [None] * cycle
        input_done = False
        i = 0
        while True:
            if slots[i] is None and not input_done:
                try:
                    x = next(it)
                except StopIteration:
                    input_done = True
                else:
                    slots[i] = self._open(x, ctx)
            current = slots[i]
            if current is not None:
                for _ in range(block):
                    try:
                        y = next(current)
                    except StopIteration:
                        slots[i] = None
                        break
                    yield y
            if input_done and all(s is None for s in slots):
                return
            i = (i + 1) % cycle

    def _parallel(self, ctx: IteratorContext, cycle: int) -> Iterator:
        # The whole cycle is open at once, as in tf.data's parallel interleave: a pump thread per input
        # calls the function and reads ahead from the start. The consumer keeps tf.data's cycle/block
        # order; with nondeterminism allowed it takes elements in completion order instead, so a slow
        # input holds up only itself.
        it = self._input._iterator(ctx)
        block = self._block_length
        deterministic = _deterministic(self._deterministic, ctx)
        ready = threading.Condition()

        def notify() -> None:
            with ready:
                ready.notify_all()

        slots: list = [None] * cycle
        input_done = False

        def fill() -> None:
            """Opens an input in every empty slot, in slot order. A slot emptied as the loop serves it
            takes the next input at once, which is the input tf.data's order gives it on its next turn."""
            nonlocal input_done
            for j in range(cycle):
                if slots[j] is not None or input_done:
                    continue
                try:
                    x = next(it)
                except StopIteration:
                    input_done = True
                    return
                except Exception as exc:  # raised when the loop reaches this slot, as without read-ahead
                    input_done = True
                    slots[j] = Pump(_raising(exc), capacity=1, on_ready=notify, name="dataservice-interleave")
                    return
                slots[j] = Pump(self._opened(x, ctx), capacity=max(2, 2 * block), on_ready=notify,
                                name="dataservice-interleave")

        def any_ready() -> bool:
            return any(s is not None and s.has_buffered() for s in slots)

        i = 0
        try:
            fill()
            while True:
                if input_done and all(s is None for s in slots):
                    return
                current = slots[i]
                if current is None:
                    i = (i + 1) % cycle
                    continue
                if deterministic:
                    item = current.get()
                else:
                    item = current.poll()
                    if item is Pump.EMPTY:
                        # Completion order: wait for any open input to have something, then serve it.
                        with ready:
                            ready.wait_for(any_ready)
                        i = next(j for j in itertools.chain(range(i, cycle), range(i)) if slots[j] is not None
                                 and slots[j].has_buffered())
                        continue
                taken = 0
                while True:
                    if item is Pump.END:
                        current.close()
                        slots[i] = None
                        fill()
                        break
                    yield item
                    taken += 1
                    if taken >= block:
                        break
                    item = current.get() if deterministic else current.poll()
                    if item is Pump.EMPTY:
                        break  # nondeterministic: not ready, so another input's turn
                i = (i + 1) % cycle
        finally:
            for s in slots:
                if s is not None:
                    s.close()

    def _opened(self, x: Any, ctx: IteratorContext) -> Iterator:
        """The input's dataset, opened on the pump's thread: the function runs in parallel too, and
        its error reaches the consumer at the input's turn."""
        yield from self._open(x, ctx)


def _raising(exc: BaseException) -> Iterator:
    raise exc
    yield  # a generator: the pump raises exc when it runs it


class PrefetchDataset(_UnaryDataset):
    _op_name = "Dataset.prefetch"

    #: What AUTOTUNE resolves to.
    AUTOTUNE_BUFFER = 16

    def __init__(self, input_dataset: Dataset, buffer_size: int):
        super().__init__(input_dataset)
        if _check_int("buffer_size", buffer_size) == AUTOTUNE:
            buffer_size = self.AUTOTUNE_BUFFER
        # 0 is no prefetching, as tf.data: the input's iterator itself.
        self._buffer_size = _check_count("buffer_size", buffer_size, 0)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if self._buffer_size == 0:
            return self._input._iterator(ctx)
        return self._prefetched(ctx)

    def _prefetched(self, ctx: IteratorContext) -> Iterator:
        pump = Pump(self._input._iterator(ctx), capacity=self._buffer_size)
        try:
            while True:
                item = pump.get()
                if item is Pump.END:
                    return
                yield item
        finally:
            pump.close()


class UniqueDataset(_UnaryDataset):
    """Each distinct element once, in order of first appearance. As tf.data: elements of one component,
    int32, int64 or string, of any shape (tensors are equal when their shapes and values are)."""

    _op_name = "Dataset.unique"

    def __init__(self, input_dataset: Dataset):
        super().__init__(input_dataset)
        spec = _static_spec(input_dataset)
        if spec is not None:
            _check_unique_spec(spec, self._describe())  # at construction, as tf.data

    def cardinality(self) -> int:
        # As tf.data: unknown even over an infinite input (it may hold few distinct values).
        return UNKNOWN_CARDINALITY

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        seen: set = set()
        checked = _static_spec(self._input) is not None
        for x in self._input._iterator(ctx):
            if not checked:
                _check_unique_spec(_spec_of(x), self._describe())
                checked = True
            key = _unique_key(x)
            if key in seen:
                continue
            seen.add(key)
            yield x


_UNIQUE_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _check_unique_spec(spec: Any, where: str) -> None:
    from dataservice.data import specs

    leaves = structure.flatten(spec)
    if len(leaves) != 1:
        raise InvalidArgumentError(f"{where} supports only elements of a single component, got {spec}")
    dtype = leaves[0].dtype
    if dtype != specs.string and dtype not in _UNIQUE_DTYPES:
        raise TypeError(f"{where} does not support the dtype {dtype}: only int32, int64 and string elements")


def _unique_key(element: Any) -> Any:
    (leaf,) = structure.flatten(element)
    if isinstance(leaf, np.ndarray):
        return leaf.item() if leaf.ndim == 0 else (leaf.shape, tuple(leaf.ravel().tolist()))
    return leaf


class ZipDataset(Dataset):
    _op_name = "Dataset.zip"

    def __init__(self, datasets: Any):
        leaves = structure.flatten(datasets)
        if not leaves:
            # zip(()) or zip({}): tf.data's op refuses an empty structure (Dataset.zip() is a TypeError there).
            raise InvalidArgumentError("Dataset.zip needs at least one dataset, got an empty structure")
        for leaf in leaves:
            if not isinstance(leaf, Dataset):
                raise TypeError(f"zip expects Datasets (or a nested tuple/dict of them), got {type(leaf).__name__}")
        self._structure = datasets
        self._datasets = tuple(leaves)

    def _inputs(self) -> tuple[Dataset, ...]:
        return self._datasets

    def _element_spec(self) -> Any:
        # The zipped structure (tuple, namedtuple, dict) with each dataset's spec in its place.
        return structure.map_structure(lambda ds: ds.element_spec, self._structure)

    def cardinality(self) -> int:
        result = INFINITE_CARDINALITY
        for ds in self._datasets:
            n = ds.cardinality()
            if n == UNKNOWN_CARDINALITY:
                return n
            if n != INFINITE_CARDINALITY:
                result = n if result == INFINITE_CARDINALITY else min(result, n)
        return result

    # Splittable when every input is, as in tf.data service's dynamic sharding: the inputs read their
    # splits in lockstep (split k of the zip is split k of each input), so a zip of inputs that split
    # alike — features and labels of one length — pairs exactly the elements it pairs locally.
    def _split_source(self):
        sources = [ds._split_source() for ds in self._datasets]  # NotSplittableError naming the culprit
        return sources[0]

    def _num_splits(self) -> int:
        counts = [ds._num_splits() for ds in self._datasets]
        finite = [n for n in counts if n != INFINITE_CARDINALITY]
        return min(finite) if finite else INFINITE_CARDINALITY

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if ctx.split_provider is None:
            iterators = [ds._iterator(ctx) for ds in self._datasets]
        else:
            fan_out = _SplitFanOut(ctx.split_provider, len(self._datasets))
            iterators = [ds._iterator(dataclasses.replace(ctx, split_provider=fan_out.branch(k)))
                         for k, ds in enumerate(self._datasets)]
        template = self._structure
        for row in zip(*iterators):
            yield structure.pack_as(template, row)


class ConcatenateDataset(Dataset):
    _op_name = "Dataset.concatenate"

    def __init__(self, first: Dataset, second: Dataset):
        from dataservice.data import specs

        if not isinstance(second, Dataset):
            raise TypeError(f"concatenate expects a Dataset, got {type(second).__name__}")
        self._first, self._second = first, second
        a, b = _static_spec(first), _static_spec(second)
        if a is not None and b is not None:
            specs.concatenated(a, b)  # as tf.data: TypeError now when the structures or dtypes differ

    def _checked(self, it: Iterator, specs_seen: list, index: int) -> Iterator:
        """``it`` (input ``index``'s elements); a spec that needed an element is checked on its first one."""
        from dataservice.data import specs

        for x in it:
            if specs_seen[index] is None:
                specs_seen[index] = _spec_of(x)
                if None not in specs_seen:
                    specs.concatenated(*specs_seen)
            yield x
            break
        yield from it

    def _inputs(self) -> tuple[Dataset, ...]:
        return (self._first, self._second)

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.concatenated(self._first.element_spec, self._second.element_spec)

    def cardinality(self) -> int:
        a, b = self._first.cardinality(), self._second.cardinality()
        if INFINITE_CARDINALITY in (a, b):
            return INFINITE_CARDINALITY
        if UNKNOWN_CARDINALITY in (a, b):
            return UNKNOWN_CARDINALITY
        return a + b

    # Splittable when both inputs are, as in tf.data service's dynamic sharding: the first input's
    # splits are numbered first, then the second's, so a pass over every split reads all of the first,
    # then all of the second.
    def _split_source(self):
        source = self._first._split_source()
        self._second._split_source()
        return source

    def _num_splits(self) -> int:
        a, b = self._first._num_splits(), self._second._num_splits()
        return INFINITE_CARDINALITY if INFINITE_CARDINALITY in (a, b) else a + b

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        # The inputs' specs, where known without an element; the others are learnt from their first element.
        seen = [_static_spec(self._first), _static_spec(self._second)]
        lazy = None in seen
        if ctx.split_provider is None:
            for index, dataset in enumerate((self._first, self._second)):
                it = dataset._iterator(ctx)
                yield from self._checked(it, seen, index) if lazy else it
            return
        first = self._first._num_splits()
        total = self._num_splits()
        splits = _Peekable(ctx.split_provider)
        # Each run of the first input's splits, then each run of the second's (renumbered from 0); under
        # repeat() the numbering goes on into the next epoch, whose first splits are the first input's again.
        while splits.has_more():
            for index, (dataset, lo, hi) in enumerate(((self._first, 0, first), (self._second, first, total))):
                provider = splits.run(lo, hi, total)
                it = dataset._iterator(dataclasses.replace(ctx, split_provider=provider))
                yield from self._checked(it, seen, index) if lazy else it


class _SplitFanOut:
    """One split provider read by several inputs in lockstep (zip): each branch yields every split
    index, in order. Thread-safe: an input may read its splits on a prefetch thread."""

    def __init__(self, provider: Iterator[int], branches: int):
        self._provider = provider
        self._queues = [deque() for _ in range(branches)]
        self._lock = threading.Lock()

    def branch(self, k: int) -> Iterator[int]:
        while True:
            with self._lock:
                queue = self._queues[k]
                if not queue:
                    try:
                        index = next(self._provider)
                    except StopIteration:
                        return
                    for other in self._queues:
                        other.append(index)
                index = queue.popleft()
            yield index


class _Peekable:
    """A split provider whose consecutive runs of indices go to different inputs (concatenate)."""

    def __init__(self, provider: Iterator[int]):
        self._provider = provider
        self._next: Optional[int] = None
        self._lock = threading.Lock()

    def has_more(self) -> bool:
        with self._lock:
            return self._peek() is not None

    def _peek(self) -> Optional[int]:
        if self._next is None:
            self._next = next(self._provider, None)
        return self._next

    def run(self, lo: int, hi: int, total: int) -> Iterator[int]:
        """The indices while they fall in [lo, hi) (modulo ``total`` when finite), less ``lo``."""
        while True:
            with self._lock:
                index = self._peek()
                if index is None:
                    return
                local = index % total if total > 0 else index
                if not lo <= local < hi and not (hi == INFINITE_CARDINALITY and local >= lo):
                    return
                self._next = None
            yield local - lo


def shuffle_and_repeat(buffer_size: int, count: Optional[int] = None,
                       seed: Optional[int] = None) -> Callable[[Dataset], Dataset]:
    """For ``Dataset.apply``: shuffle, reshuffling each repetition, then repeat.

    Example::

        >>> ds = Dataset.range(4).apply(shuffle_and_repeat(4, count=2, seed=1))
    """
    _check_shuffle_buffer(buffer_size)
    # Validate here, at construction, not later when apply() builds the nodes.
    if count is not None:
        _check_signed_count("count", count)
    if seed is not None:
        _check_int("seed", seed)

    def apply(ds: Dataset) -> Dataset:
        return ds.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=True).repeat(count)

    return apply
