"""Buffering and reordering: shuffle (and shuffle_and_repeat), prefetch."""

from __future__ import annotations

import itertools
import random
import threading
import weakref
from collections import deque
from typing import Any, Callable, Iterator, Optional

from dataservice.data.background import InputPosition, Pump, direct_iterator
from dataservice.data.checkpoint import (
    NodeIterator,
    Marks,
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
from dataservice.data.options import AUTOTUNE
from dataservice.data.transformations.common import (
    STATE,
    _check_count,
    _check_int,
    _check_signed_count,
    _UnaryDataset,
    check_rewindable,
    replays,
)


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
        self._seed = seed if seed is not None or reshuffle else _DrawnSeed(random.SystemRandom().randrange(2 ** 62))
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

    def _rng_seed(self, seed: int, epoch: int, split_hint: Optional[int]) -> int:
        if split_hint is not None:
            # A split group of distributed_epoch: the order must depend on the group alone, so
            # that a group redone elsewhere (after a worker loss) comes out the same.
            return seed * 1_000_003 + 999_983 * (split_hint + 1)
        if not self._reshuffle:
            return seed
        return seed * 1_000_003 + epoch

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        epoch = next(self._epochs)
        return _ShuffleIterator(self, self._input._iterator(ctx), epoch, ctx.split_hint)


class _DrawnSeed(int):
    """The seed an unseeded shuffle without reshuffling draws at construction. Its value travels with the
    pipeline (pickled to a worker, which must shuffle alike), but it is not part of the pipeline's identity
    (``checkpoint.pipeline_fingerprint`` reads its ``repr``): the same pipeline built again draws another
    one, yet restores a state saved from the first, since the state carries the seed its iterator used."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<drawn seed>"


#: What a nested state may be (each node's save() says which).
_STATE_TYPES = (dict, list, int, str, type(None))

#: Beyond this many draws a shuffle's state holds its generator's state (625 ints) rather than the count:
#: restoring replays the draws, about 12 ns each (a pass over an infinite input would grow without end).
_MAX_REPLAYED_DRAWS = 1 << 26


class _ShuffleCursor:
    """Where a shuffle's generator is, for ``save()``: ``phase`` 0 before the buffer is filled, 1 while the
    input is read (``steady``, the enumerate over it, counts the draws from ``draws`` on), 2 draining the
    buffer once the input ended (``draws`` counts on)."""

    __slots__ = ("phase", "buffer", "draws", "steady", "seed", "rng", "rng_state")

    def __init__(self, seed: int):
        self.phase = 0
        self.buffer: list = []
        self.draws = 0
        self.steady: Optional[enumerate] = None
        self.seed = seed
        self.rng: Optional[random.Random] = None
        self.rng_state: Optional[list] = None  # restored, past _MAX_REPLAYED_DRAWS

    def draws_done(self) -> int:
        steady = self.steady
        return self.draws if steady is None else steady.__reduce__()[1][1]


def _advance(rng: random.Random, draws: int) -> None:
    """Moves ``rng`` past ``draws`` calls of ``random()``: each takes two 32-bit words of the Mersenne
    Twister, as 64 bits of ``getrandbits`` do, at C speed."""
    while draws:
        step = min(draws, 1 << 16)
        rng.getrandbits(64 * step)
        draws -= step


def _shuffled(cursor: _ShuffleCursor, it: Iterator, buffer_size: int) -> Iterator:
    rng = random.Random(cursor.seed)
    if cursor.rng_state is not None:
        rng.setstate((3, tuple(cursor.rng_state), None))
    else:
        _advance(rng, cursor.draws)
    cursor.rng = rng
    rand = rng.random
    buf = cursor.buffer
    it = direct_iterator(it)
    if cursor.phase == 0:
        whole = buffer_size == UNKNOWN_CARDINALITY
        buf.extend(it if whole else itertools.islice(it, buffer_size))
        cursor.phase = 2 if whole else 1
    if cursor.phase == 1:
        size = len(buf)
        # One draw per element: the enumerate counts them at no Python cost (save() reads its index).
        cursor.steady = steady = enumerate(it, cursor.draws)
        for _, x in steady:
            i = int(rand() * size)
            out = buf[i]
            buf[i] = x
            yield out
        cursor.draws = steady.__reduce__()[1][1]
        cursor.steady = None
        cursor.phase = 2
    while buf:
        i = int(rand() * len(buf))
        buf[i], buf[-1] = buf[-1], buf[i]
        cursor.draws += 1
        yield buf.pop()


class _ShuffleIterator(NodeIterator):
    """A shuffle's iterator. State: the epoch whose order it is, the phase, the input's position, the
    buffer's elements (``encode_elements``: the state grows with buffer_size x element size), how many
    numbers its generator drew (restoring reseeds and skips them) and, unseeded, the seed it
    drew. Restoring sets the node's epoch counter past the saved epoch, so that the next iterator (the next
    repetition under ``repeat``) reshuffles as the original's would.

    Example::

        >>> it = iter(Dataset.range(100).shuffle(10, seed=1)); _ = next(it)
        >>> sorted(it.state_dict()["position"])
        ['buffer', 'draws', 'epoch', 'input', 'phase']
    """

    __slots__ = ("__next__", "_node", "_input", "_epoch", "_split_hint", "_base_seed", "_cursor", "_elements")

    def __init__(self, node: ShuffleDataset, input_iterator: Iterator, epoch: int, split_hint: Optional[int]):
        self._node = node
        self._input = input_iterator
        self._epoch = epoch
        self._split_hint = split_hint
        # Unseeded, the order is random yet restorable: this iterator's seed is drawn now, and saved.
        self._base_seed = random.SystemRandom().randrange(2 ** 62) if node._seed is None else node._seed
        seed = self._rng_seed()
        self._cursor = _ShuffleCursor(seed)
        # Made now, run at the first element: after restore(), which sets the cursor.
        self._elements = _shuffled(self._cursor, input_iterator, node._buffer_size)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        cursor = self._cursor
        phase = cursor.phase
        draws = cursor.draws_done()
        # The input's position even once it ended: restoring it sets the epoch counters of the shuffles in
        # it, as reading it did (the next repetition's order under repeat).
        state = {"epoch": self._epoch, "phase": phase, "draws": draws,
                 "input": save_input(self._input, self._node._input),
                 "buffer": encode_elements(cursor.buffer) if phase else None}
        if self._saves_seed():
            state["seed"] = int(self._base_seed)
        if draws > _MAX_REPLAYED_DRAWS:
            state["rng"] = list(cursor.rng.getstate()[1]) if cursor.rng is not None else cursor.rng_state
        return state

    def _saves_seed(self) -> bool:
        # A seed drawn at random (by this iterator, or by the node at construction) is in the state: the
        # pipeline built again elsewhere draws another.
        return self._node._seed is None or type(self._node._seed) is _DrawnSeed

    def _rng_seed(self) -> int:
        node = self._node
        if node._seed is None:
            return self._base_seed
        return node._rng_seed(self._base_seed, self._epoch, self._split_hint)

    def restore(self, state: Any) -> None:
        node = self._node
        where = node._describe()
        cursor = self._cursor
        epoch = field(state, "epoch", int, where)
        phase = field(state, "phase", int, where)
        if phase > 2:
            raise ValueError(f"malformed iterator state for {where}: 'phase' must be 0, 1 or 2, got {phase}")
        draws = field(state, "draws", int, where)
        text = field(state, "buffer", (str, type(None)), where)
        buffer = [] if text is None else decode_elements(text, where)
        if (phase == 0) != (text is None) or (phase == 1 and node._buffer_size != UNKNOWN_CARDINALITY
                                               and len(buffer) > node._buffer_size):
            raise ValueError(f"the iterator state does not fit {where}: phase {phase} with "
                             f"{'no' if text is None else len(buffer)} buffered elements")
        rng_state = field(state, "rng", (list, type(None)), where, default=None)
        if rng_state is not None and (len(rng_state) != 625 or not all(type(v) is int for v in rng_state)):
            raise ValueError(f"malformed iterator state for {where}: 'rng' must be 625 ints")
        seed = field(state, "seed", int, where) if self._saves_seed() else None
        restore_input(self._input, node._input, field(state, "input", _STATE_TYPES, where))
        self._epoch = epoch
        node._epochs = itertools.count(epoch + 1)
        if seed is not None:
            self._base_seed = seed
        cursor.seed = self._rng_seed()
        cursor.phase, cursor.buffer[:], cursor.draws, cursor.rng_state = phase, buffer, draws, rng_state

    def close(self) -> None:
        close_input(self._elements)
        close_input(self._input)


def _check_shuffle_buffer(buffer_size: Any) -> int:
    """shuffle's buffer_size: >= 1, or UNKNOWN_CARDINALITY (-2) for the whole input, as tf.data."""
    if _check_int("buffer_size", buffer_size) == UNKNOWN_CARDINALITY:
        return UNKNOWN_CARDINALITY
    return _check_count("buffer_size", buffer_size, 1)


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
        if replays(self._input, ctx):
            rewound = ctx.rewound()
            return _PrefetchIterator(self, self._input._iterator(rewound), rewound)
        return _SnapshotPrefetchIterator(self, self._input._iterator(ctx))


#: A read-ahead consumer that is never asked for its position still has its ``Marks`` drop the records
#: behind what it took (as each mark does), every this many elements plus one (a mask).
_PRUNE_EVERY = 4095


class _PrefetchIterator(NodeIterator):
    """A prefetch's iterator: a ``Pump`` thread reads ahead, started at the first element. Its position is
    that of what the consumer took, not of what the thread read: a ``Marks`` records the input's state
    every 64 reads (less often when that state is costly: ``Pace``), and the state is such a record
    plus the elements to skip after it. Restoring seeks the input there, and skips (at the first element,
    before the thread starts) at most the interval plus the buffer: read again, not yielded again.

    Example::

        >>> it = iter(Dataset.range(100).prefetch(4)); _ = next(it)
        >>> it.state_dict()["position"]
        {'input': {'chunk': 0, 'offset': 0}, 'skip': 1}
    """

    __slots__ = ("_node", "_input", "_position", "_pump", "_rewind", "_taken", "_told", "_base", "_stop",
                 "_rewound", "__weakref__")

    def __init__(self, node: PrefetchDataset, input_iterator: Iterator, rewound: Optional[IteratorContext] = None):
        self._rewound = rewound
        self._node = node
        self._input = input_iterator
        self._position = InputPosition(input_iterator, node._input)
        self._pump: Optional[Pump] = None
        self._rewind: Optional[Marks] = None
        self._taken = 0  # elements the consumer took; told to the Marks when a state is asked for
        self._told = 0
        self._base: Optional[tuple] = None  # the restored (state, skip)
        self._stop: Optional[weakref.finalize] = None

    def __next__(self) -> Any:
        pump = self._pump
        if pump is None:
            pump = self._start()
        item = pump.get()
        if item is Pump.END:
            raise StopIteration
        taken = self._taken = self._taken + 1
        if not taken & _PRUNE_EVERY:
            self._rewind_state()  # drops the records behind what was taken, saved or not
        return item

    def _start(self) -> Pump:
        base = self._base
        if base is not None:
            skip_elements(self._input, base[1], self._node._describe())
        rewind = Marks(self._position, self._node._input, 64, base=base)
        rewind.mark(0)  # the first record, here: a save() may come before the thread reads anything
        self._rewind = rewind
        pump = Pump(self._input, capacity=self._node._buffer_size, rewind=rewind)
        # Stops the thread when this iterator is collected unclosed; it refers to the pump, not to this.
        self._stop = weakref.finalize(self, pump.close)
        self._pump = pump
        return pump

    def save(self) -> dict:
        check_rewindable(self._rewound, self._node)
        if self._rewind is None:
            if self._base is not None:
                return {"input": self._base[0], "skip": self._base[1]}
            return {"input": save_input(self._input, self._node._input), "skip": 0}
        state = self._rewind_state()
        self._position.check(state["input"])
        return state

    def _rewind_state(self) -> dict:
        rewind = self._rewind
        if self._taken != self._told:
            rewind.taken += self._taken - self._told
            self._told = self._taken
        return rewind.save()

    def restore(self, state: Any) -> None:
        self._base = restore_rewind(self._input, self._node._input, state, self._node._describe())

    def close(self) -> None:
        if self._stop is None:
            close_input(self._input)
        else:
            self._stop()  # the thread closes the input once it stops


class _SnapshotPrefetchIterator(NodeIterator):
    """A prefetch's iterator over an input that does not read again alike (a parallel map or interleave
    with deterministic=False upstream: ``replays``), which a ``Marks`` cannot seek. Its state is one cut
    of the input and the pump: the input's position now and the elements read but not yet taken
    (``{"input": ..., "buffer": "<encoded>"}``; the state grows with buffer_size x element size). To take
    both at one cut, the pump reads each element under a lock that ``save()`` holds; after a save it reads
    nothing more until the consumer's next element (a state taken twice is the same). Restoring seeks the
    input there; the buffered elements come first, then the pump's.

    An error the pump met but the consumer did not is not in the state: a restored iterator reads on from
    the position the input had after it (the input's own state, taken after it raised).

    Example::

        >>> ds = Dataset.range(100).map(f, num_parallel_calls=4, deterministic=False).prefetch(4)
        >>> it = iter(ds); _ = next(it)
        >>> sorted(it.state_dict()["position"])
        ['buffer', 'input']
    """

    __slots__ = ("_node", "_input", "_pump", "_lock", "_pending", "_held", "_stop", "__weakref__")

    def __init__(self, node: PrefetchDataset, input_iterator: Iterator):
        self._node = node
        self._input = input_iterator
        self._pump: Optional[Pump] = None
        self._lock = threading.Lock()
        self._pending: deque = deque()  # restored: the elements that were buffered, yielded first
        self._held = False  # saved: the pump waits for the next element (Pump.hold)
        self._stop: Optional[weakref.finalize] = None

    def __next__(self) -> Any:
        pump = self._pump
        if pump is None:
            pump = self._start()
        elif self._held:
            self._held = False
            pump.resume()
        pending = self._pending
        if pending:
            return pending.popleft()
        item = pump.get()
        if item is Pump.END:
            raise StopIteration
        return item

    def _start(self) -> Pump:
        pump = Pump(self._input, capacity=self._node._buffer_size, lock=self._lock)
        # Stops the thread when this iterator is collected unclosed; it refers to the pump, not to this.
        self._stop = weakref.finalize(self, pump.close)
        self._pump = pump
        return pump

    def save(self) -> dict:
        pump = self._pump
        if pump is None:
            inner, ahead = save_input(self._input, self._node._input), []
        else:
            with self._lock:  # the pump thread waits between two elements
                inner, ahead = save_input(self._input, self._node._input), pump.buffered()
                # Until the next element, so that a state taken again is the same.
                pump.hold()
                self._held = True
        return {"input": inner, "buffer": encode_elements(list(self._pending) + ahead)}

    def restore(self, state: Any) -> None:
        where = self._node._describe()
        buffer = decode_elements(field(state, "buffer", str, where), where)
        restore_input(self._input, self._node._input, field(state, "input", STATE, where))
        self._pending.extend(buffer)

    def close(self) -> None:
        if self._stop is None:
            close_input(self._input)
        else:
            self._stop()  # the thread closes the input once it stops


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
