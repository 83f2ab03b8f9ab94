"""Slicing a stream by count: repeat, take, skip, shard."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Callable, Iterator, Optional

from dataservice.data.checkpoint import ChunkIterator, NodeIterator, close_input, field, restore_input, save_input
from dataservice.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    IteratorContext,
)
from dataservice.data.static_sharding import SHARD_HINT
from dataservice.data.transformations.common import (
    STATE,
    _check_count,
    _check_signed_count,
    _UnaryDataset,
    elements_of,
)
from dataservice.errors import InvalidArgumentError


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
            return self._input._iterator(ctx)
        return _RepeatIterator(self, ctx)


class _RepeatCursor:
    __slots__ = ("epoch", "it", "produced")

    def __init__(self, it: Optional[Iterator]):
        self.epoch = 0         # the repetition being read
        self.it = it           # its input iterator (None once the last ended)
        self.produced = False  # whether that repetition yielded an element yet


def _repetitions(cursor: _RepeatCursor, make: Callable[[], Iterator], count: int,
                 ends_when_empty: bool) -> Iterator:
    """The input iterator of each repetition, for chain.from_iterable (which then reads it directly)."""
    while count < 0 or cursor.epoch < count:
        it = cursor.it
        if it is None:
            it = cursor.it = make()
            cursor.produced = False
        if cursor.produced:  # restored inside a repetition
            yield elements_of(it)
        else:
            try:
                first = next(it)
            except StopIteration:
                if ends_when_empty:
                    return  # cursor unchanged: a state taken now ends a restored iterator here too
            else:
                cursor.produced = True
                yield itertools.chain((first,), elements_of(it))
        close_input(it)
        cursor.epoch += 1
        cursor.it = None


class _RepeatIterator(NodeIterator):
    """repeat: the repetition, whether it yielded an element yet (an empty one ends ``repeat()``), and its
    input iterator's state. Each repetition makes a new input iterator, as tf.data; the first one is made
    here (it reads nothing), so that a restored state seeks it.

    Example::

        >>> it = iter(Dataset.range(3).repeat(2)); _ = [next(it) for _ in range(4)]
        >>> it.state_dict()["position"]
        {'epoch': 1, 'produced': True, 'input': {'chunk': 0, 'offset': 1}}
    """

    __slots__ = ("__next__", "_elements", "_cursor", "_node", "_count")

    def __init__(self, node: RepeatDataset, ctx: IteratorContext):
        # As tf.data: repeat(count) goes through all its epochs, however many are empty. repeat() ends at
        # an empty epoch (an empty input would spin forever), unless its input reads from the service:
        # there an epoch is empty when other readers of a shared job took all of it, and the next
        # iteration of the job has elements again.
        count = node._count
        ends_when_empty = count < 0 and not node._input._reads_from_service()

        def make() -> Iterator:
            return node._input._iterator(ctx)

        self._node = node
        self._count = count
        self._cursor = _RepeatCursor(make() if count else None)
        # chain: each repetition's elements come straight from its iterator, no Python step per element.
        self._elements = itertools.chain.from_iterable(_repetitions(self._cursor, make, count, ends_when_empty))
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        cursor = self._cursor
        state = None if cursor.it is None else save_input(cursor.it, self._node._input)
        return {"epoch": cursor.epoch, "produced": cursor.produced, "input": state}

    def restore(self, state: Any) -> None:
        where = "Dataset.repeat"
        epoch = field(state, "epoch", int, where)
        produced = field(state, "produced", bool, where)
        inner = field(state, "input", STATE, where)
        cursor = self._cursor
        ended = inner is None
        if (self._count >= 0 and (epoch > self._count or ended != (epoch == self._count))) or (
                self._count < 0 and ended):
            raise ValueError(f"the iterator state does not fit {where}: it is at repetition {epoch} "
                             f"({'ended' if ended else 'reading'}) of {self._count}")
        if ended:
            close_input(cursor.it)
            cursor.it = None
        else:
            # The input's state holds what differs between repetitions (a shuffle's epoch): the first
            # iterator, restored, is that repetition's.
            restore_input(cursor.it, self._node._input, inner)
        cursor.epoch, cursor.produced = epoch, produced

    def close(self) -> None:
        close_input(self._elements)
        if self._cursor.it is not None:
            close_input(self._cursor.it)


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
        return it if self._count == -1 else _TakeIterator(self, it)


class _TakeCursor:
    __slots__ = ("left", "calls")

    def __init__(self, left: int):
        self.left = left    # how many elements are still to take, until ``calls`` is made
        self.calls = None   # then: itertools.repeat((), left), whose length is what is left


def _calls(cursor: _TakeCursor, it: Iterator) -> Iterator:
    # Made at the first next(), after a restore: islice(it, n) with a count that can be read (repeat's
    # length), all in C; starmap calls the input's __next__ as elements_of does.
    cursor.calls = itertools.repeat((), cursor.left)
    yield itertools.starmap(it.__next__, cursor.calls)


class _TakeIterator(NodeIterator):
    """take(n): how many it took, and its input's position.

    Example::

        >>> it = iter(Dataset.range(10).take(5)); _ = next(it)
        >>> it.state_dict()["position"]
        {'taken': 1, 'input': {'chunk': 0, 'offset': 1}}
    """

    __slots__ = ("__next__", "_elements", "_input", "_input_node", "_cursor", "_count")

    def __init__(self, node: TakeDataset, it: Iterator):
        self._input = it
        self._input_node = node._input
        self._count = node._count
        self._cursor = _TakeCursor(node._count)
        self._elements = itertools.chain.from_iterable(_calls(self._cursor, it))
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        cursor = self._cursor
        # An input that ended while one more was asked for leaves it one short: no element follows anyway.
        left = cursor.left if cursor.calls is None else cursor.calls.__length_hint__()
        return {"taken": self._count - left, "input": save_input(self._input, self._input_node)}

    def restore(self, state: Any) -> None:
        taken = field(state, "taken", int, "Dataset.take")
        if taken > self._count:
            raise ValueError(f"the iterator state does not fit Dataset.take({self._count}): it took {taken}")
        restore_input(self._input, self._input_node, field(state, "input", STATE, "Dataset.take"))
        self._cursor.left = self._count - taken

    def close(self) -> None:
        close_input(self._input)


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
            return ChunkIterator(list, 0, self._op_name)
        it = self._input._iterator(ctx)
        return _SkipIterator(it, self._input, self._count, 0, self._op_name)


class _SkipCursor:
    __slots__ = ("skip",)

    def __init__(self, skip: int):
        self.skip = skip  # input elements to drop before the next one; None once dropped


def _skipped(it: Iterator, cursor: _SkipCursor, stride: int) -> Iterator:
    """At the first next() (after a restore), drops cursor.skip elements of the input; then its elements
    (one in ``stride``), for chain.from_iterable, which reads them directly."""
    elements = elements_of(it)
    deque(itertools.islice(elements, cursor.skip), maxlen=0)  # drops them, in C
    cursor.skip = None
    yield elements if stride == 1 else itertools.islice(elements, 0, None, stride)


class _SkipIterator(NodeIterator):
    """skip and shard: the input's position, and how many input elements to drop before the next one is
    yielded: skip's count until it skipped (restoring must not skip twice), then 0; shard's index, then
    ``num_shards - 1``.

    Example::

        >>> it = iter(Dataset.range(10).shard(3, 1)); _ = next(it)
        >>> it.state_dict()["position"]
        {'skip': 2, 'input': {'chunk': 0, 'offset': 2}}
    """

    __slots__ = ("__next__", "_elements", "_input", "_input_node", "_cursor", "_then", "_where")

    def __init__(self, it: Iterator, input_node: Any, skip: int, then_skip: int, where: str):
        self._input = it
        self._input_node = input_node
        self._cursor = _SkipCursor(skip)
        # Once it skipped and yielded an element, what is to drop before the next one.
        self._then = then_skip
        self._where = where
        self._elements = itertools.chain.from_iterable(_skipped(it, self._cursor, then_skip + 1))
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        skip = self._cursor.skip
        return {"skip": self._then if skip is None else skip, "input": save_input(self._input, self._input_node)}

    def restore(self, state: Any) -> None:
        skip = field(state, "skip", int, self._where)
        restore_input(self._input, self._input_node, field(state, "input", STATE, self._where))
        self._cursor.skip = skip

    def close(self) -> None:
        close_input(self._input)


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
        it = self._input._iterator(ctx)
        return _SkipIterator(it, self._input, self._index, self._num_shards - 1, self._op_name)
