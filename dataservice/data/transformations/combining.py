"""Combining datasets: interleave and flat_map, zip, concatenate."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import weakref
from collections import deque
from time import perf_counter
from typing import Any, Callable, Iterator, Optional

from dataservice.data import structure
from dataservice.data.background import InputPosition, Pump, direct_iterator
from dataservice.data.checkpoint import (
    NodeIterator,
    Marks,
    Pace,
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
    AUTOTUNE_CYCLE_SPLITS,
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    IteratorContext,
    _function_name,
)
from dataservice.data.options import AUTOTUNE, default_parallelism
from dataservice.data.transformations.common import (
    STATE,
    _check_callable,
    _check_count,
    _check_parallelism,
    _deterministic,
    _spec_of,
    _static_spec,
    _UnaryDataset,
    elements_of,
    raise_user_error,
    replays,
)
from dataservice.errors import InvalidArgumentError, NotCheckpointableError

#: What a nested state may be (each node's save() says which).
_STATE_TYPES = (dict, list, int, str, type(None))


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

    def _open(self, x: Any, ctx: IteratorContext) -> tuple[Dataset, Iterator]:
        """The dataset the function returns for ``x``, and its iterator."""
        where = self._describe()
        try:
            ds = self._fn(*x) if type(x) is tuple else self._fn(x)
        except Exception as exc:
            raise_user_error(exc, where)
        if not isinstance(ds, Dataset):
            raise TypeError(f"{where}: the function must return a Dataset, got {type(ds).__name__}")
        if ctx.rewinding and ctx.unrewindable is None and not replays(ds, ctx):
            # A node after this one restores by reading it again from a recorded state, and this dataset's
            # order would differ the second time: refuse to save rather than resume wrongly.
            ctx.unrewindable = (
                f"a node after it reads it ahead and restores by reading it again, but the dataset its function "
                f"returned ({ds._describe()}) has no fixed order (deterministic=False): give that dataset a fixed "
                f"order, or save the state without prefetch, parallel map, unbatch, window or cache after it")
        return ds, ds._iterator(ctx.without_splits())

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        cycle = self._cycle_length
        if cycle == AUTOTUNE:
            # A service task's group of splits must give the same order on any worker that redoes it
            # (exactly once): not the host's core count there, but a constant.
            cycle = default_parallelism() if ctx.split_hint is None else AUTOTUNE_CYCLE_SPLITS
        if self._num_parallel_calls is None:
            return _InterleaveIterator(self, ctx, cycle)
        return _ParallelInterleaveIterator(self, ctx, cycle)

    def _element_at(self, ctx: IteratorContext, at: Any, where: str) -> tuple[tuple, Any]:
        """The input's element at the position ``at`` (``{"input": a recorded state, "skip": elements after
        it}``; restoring a slot: the element that opened it), read by an iterator of its own; and ``at`` as
        (state, skip)."""
        it = self._input._iterator(ctx)
        try:
            mark = restore_rewind(it, self._input, at, where)
            skip_elements(it, mark[1], self._describe())
            try:
                return mark, next(it)
            except StopIteration:
                raise ValueError(f"the iterator state does not fit {self._describe()}: its input has no element "
                                 "at the position that opened a slot (was the state taken from another "
                                 "dataset?)") from None
        finally:
            close_input(it)


class _InterleaveState:
    """What the two interleave iterators share: the input, the cycle's position (``index``: the slot whose
    turn it is; ``in_block``: elements it gave in this turn) and, per slot, the input's position before the
    element that opened it: a recorded state of the input and the elements read after it. The input's
    state is recorded before each opening while that is cheap, less often when it is not (``Pace``: a
    shuffle's buffer upstream), so that a restore re-reads at most a few elements to reopen a slot.

    An input that does not read again alike (a parallel map or interleave with deterministic=False
    upstream: ``replays``) could give another element there: then each open slot's state holds the element
    that opened it (``{"element": "<encoded>"}``, file names or small values as a rule) instead."""

    __slots__ = ("_node", "_ctx", "_input", "_position", "_cycle", "_done", "_index", "_in_block", "_at",
                 "_pace", "_mark", "_reads", "_keeps")

    def __init__(self, node: InterleaveDataset, ctx: IteratorContext, cycle: int):
        self._node = node
        self._ctx = ctx
        # Restoring reopens a slot by reading its element again from a recorded position of the input, unless
        # the input would not give it again (``_keeps``: the element itself is saved).
        keeps = not replays(node._input, ctx)
        self._input = node._input._iterator(ctx if keeps else ctx.rewound())
        self._position = InputPosition(self._input, node._input)
        self._cycle = cycle
        self._done = False
        self._index = 0
        self._in_block = 0
        # Per open slot: (the last record before it, which read opened it); a record is (the input's state,
        # which read followed it).
        self._at: list = [None] * cycle
        self._pace = Pace(1)
        self._mark: tuple = (None, 0)
        self._reads = 0
        # Whether a slot's opening is saved as its element (``_at[j]`` is then that element).
        self._keeps = keeps

    def _read_input(self, j: int) -> Any:
        """The input's next element, for slot ``j`` (its position before it recorded); ``_END`` at the end."""
        if self._keeps:
            try:
                x = next(self._input)
            except StopIteration:
                self._done = True
                return _END
            self._at[j] = x
            return x
        n = self._reads
        if n >= self._pace.next:
            start = perf_counter()
            self._mark = (self._position.save(), n)
            self._pace.recorded(n, start, perf_counter())
        self._at[j] = (self._mark, n)
        self._reads = n + 1
        try:
            return next(self._input)
        except StopIteration:
            self._done = True
            return _END

    def _save_common(self, slots: list, failed: Optional[int] = None) -> dict:
        """The state, with ``slots`` (per slot: None, or its own state under "slot" and its opening position
        under "at"). ``failed``: the slot whose opening read raised (restored, the input reads it again)."""
        if self._ctx.unrewindable is not None:
            raise NotCheckpointableError(f"{self._node._describe()} cannot be checkpointed: {self._ctx.unrewindable}")
        check = self._position.check
        state = {"cycle": self._cycle, "input": check(self._position.save()), "done": self._done,
                 "index": self._index, "in_block": self._in_block,
                 "slots": [None if slot is None else dict(slot, at=self._opening(slot["at"])) for slot in slots]}
        if failed is not None:
            if self._keeps:  # no position before the element that failed: restored, the input reads on
                state["done"] = False
            else:
                opening = self._opening(self._at[failed])
                state["input"], state["skip"], state["done"] = opening["input"], opening["skip"], False
        return state

    def _opening(self, at: Any) -> dict:
        if self._keeps:
            try:
                return {"element": encode_elements([at])}
            except Exception as exc:
                raise NotCheckpointableError(
                    f"{self._node._describe()} cannot be checkpointed: its input does not read again alike (a "
                    "parallel map or interleave with deterministic=False upstream), so the state holds the "
                    f"element that opened each slot, and {at!r:.60} cannot be encoded ({exc})") from exc
        (state, marked), read = at
        return {"input": self._position.check(state), "skip": read - marked}

    def _opening_element(self, at: Any, where: str) -> Any:
        """The element an ``{"element": ...}`` opening holds."""
        elements = decode_elements(field(at, "element", str, where), where)
        if len(elements) != 1:
            raise ValueError(f"malformed iterator state for {where}: a slot's opening must hold one element, "
                             f"got {len(elements)}")
        return elements[0]

    def _restore_common(self, state: Any) -> list:
        """Validates ``state``, resizes the cycle to it (an AUTOTUNE cycle, resolved on another host, may
        differ) and returns, per slot, None or (the element that opened it, the slot's state). Seeks the
        input last: re-reading those elements takes iterators of the input whose restore sets the epoch
        counters of shuffles in it, which must end as the input's own position leaves them."""
        node = self._node
        where = node._describe()
        cycle = field(state, "cycle", int, where, minimum=1)
        if cycle != self._cycle and node._cycle_length != AUTOTUNE:
            raise ValueError(f"the iterator state does not fit {where}: its cycle_length is {cycle}, this "
                             f"pipeline's {self._cycle}")
        index = field(state, "index", int, where)
        in_block = field(state, "in_block", int, where)
        done = field(state, "done", bool, where)
        slots = field(state, "slots", list, where)
        skip = field(state, "skip", int, where, default=0)
        if len(slots) != cycle or index >= cycle or in_block >= node._block_length or (
                in_block and slots[index] is None):
            raise ValueError(f"malformed iterator state for {where}: {len(slots)} slots for a cycle of {cycle}, "
                             f"at slot {index}, {in_block} elements into its block of {node._block_length}")
        inner = field(state, "input", _STATE_TYPES, where)
        if self._ctx.split_provider is not None:
            restore_input(self._input, node._input, inner)  # NotCheckpointableError: it reads splits
        opened = []
        for j, slot in enumerate(slots):
            if slot is None:
                opened.append(None)
                continue
            inner_where = f"{where} slot {j}"
            slot_state = field(slot, "slot", _STATE_TYPES, inner_where)
            if self._keeps:
                x = self._opening_element(field(slot, "at", dict, inner_where), inner_where)
                opened.append((x, x, slot_state))
                continue
            at, x = node._element_at(self._ctx, field(slot, "at", dict, inner_where), inner_where)
            opened.append((at, x, slot_state))
        restore_input(self._input, node._input, inner)
        skip_elements(self._input, skip, where)
        self._cycle, self._done, self._index, self._in_block = cycle, done, index, in_block
        if self._keeps:
            self._at[:] = [None if o is None else o[0] for o in opened]
        else:
            self._at[:] = [None if o is None else ((o[0][0], 0), o[0][1]) for o in opened]
        return [None if o is None else o[1:] for o in opened]


_END = object()


class _SequentialCycle(_InterleaveState):
    """A sequential interleave's cycle: its open slots (each one's ``__next__``, iterator and dataset) and,
    while a slot has its turn (of a block longer than one), ``turn``: the range iterator over the turn's
    block, whose length hint says how far into the block the generator is, at no cost per element."""

    __slots__ = ("slots", "iterators", "datasets", "block", "turn")

    def __init__(self, node: InterleaveDataset, ctx: IteratorContext, cycle: int):
        _InterleaveState.__init__(self, node, ctx, cycle)
        self.slots: list = [None] * cycle
        self.iterators: list = [None] * cycle
        self.datasets: list = [None] * cycle
        self.block = node._block_length
        self.turn: Optional[Iterator] = None

    def set_slot(self, j: int, ds: Optional[Dataset], it: Optional[Iterator]) -> None:
        self.datasets[j], self.iterators[j] = ds, it
        self.slots[j] = None if it is None else it.__next__

    def position(self) -> tuple[int, int]:
        """(the slot whose turn it is, elements it gave in the turn), at a cut."""
        turn = self.turn
        if turn is None:  # not begun, ended, or a block of one (``_index`` is then the next turn's)
            return self._index, self._in_block
        left = turn.__length_hint__()
        if left:
            return self._index, self.block - left
        return (self._index + 1) % self._cycle, 0  # the block is done: the next slot's turn


def _interleaved(cycle: _SequentialCycle) -> Iterator:
    """tf.data's order: slot ``i`` gives up to block_length elements, then the next slot's turn; an empty
    slot takes the input's next element at its turn (which it loses if that element's dataset is empty).
    Where it is (``position``) costs a store per turn, none per element of a block."""
    slots, block, count = cycle.slots, cycle.block, cycle._cycle
    i, start = cycle._index, cycle._in_block
    cycle._in_block = 0
    while True:
        current = slots[i]
        if current is None and not start and not cycle._done:
            x = cycle._read_input(i)
            if x is not _END:
                cycle.set_slot(i, *cycle._node._open(x, cycle._ctx))
                current = slots[i]
        if current is not None:
            if block == 1:
                try:
                    y = current()
                except StopIteration:
                    cycle.set_slot(i, None, None)
                else:
                    cycle._index = (i + 1) % count  # a cut after it: the next slot's turn
                    yield y
            else:
                cycle._index = i
                cycle.turn = turn = iter(range(start, block))
                for _ in turn:
                    try:
                        y = current()
                    except StopIteration:
                        cycle.set_slot(i, None, None)
                        cycle.turn = None
                        break
                    yield y
            start = 0
        if cycle._done and slots.count(None) == count:
            cycle.turn = None
            cycle._index = 0
            return
        i = (i + 1) % count


class _InterleaveIterator(NodeIterator):
    """A sequential interleave's (and flat_map's) iterator. State: the input's position, the cycle's, and per
    open slot the input's position before the element that opened it (restoring reads that element again
    and calls the function on it; over an input that does not read again alike, the element itself) and
    the slot's own iterator's position. Its elements come from a
    generator bound directly: no Python call of its own per element.

    Example::

        >>> it = iter(Dataset.range(3).interleave(lambda x: Dataset.range(x), cycle_length=2)); _ = next(it)
        >>> sorted(it.state_dict()["position"])
        ['cycle', 'done', 'in_block', 'index', 'input', 'slots']
    """

    __slots__ = ("__next__", "_cycle", "_elements")

    def __init__(self, node: InterleaveDataset, ctx: IteratorContext, cycle: int):
        self._cycle = _SequentialCycle(node, ctx, cycle)
        # Made now, run at the first element: after restore(), which sets the cycle.
        self._elements = _interleaved(self._cycle)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        cycle = self._cycle
        slots = [None if it is None else {"at": cycle._at[j], "slot": save_input(it, cycle.datasets[j])}
                 for j, it in enumerate(cycle.iterators)]
        index, in_block = cycle.position()
        return dict(cycle._save_common(slots), index=index, in_block=in_block)

    def restore(self, state: Any) -> None:
        cycle = self._cycle
        node = cycle._node
        opened = cycle._restore_common(state)
        count = cycle._cycle
        cycle.slots[:], cycle.iterators[:], cycle.datasets[:] = [None] * count, [None] * count, [None] * count
        for j, entry in enumerate(opened):
            if entry is not None:
                x, slot_state = entry
                ds, it = node._open(x, cycle._ctx)
                restore_input(it, ds, slot_state)
                cycle.set_slot(j, ds, it)

    def close(self) -> None:
        close_input(self._elements)
        cycle = self._cycle
        for j, it in enumerate(cycle.iterators):
            if it is not None:
                close_input(it)
                cycle.set_slot(j, None, None)
        close_input(cycle._input)


class _KeptSlot:
    """A parallel interleave's slot whose dataset does not read again alike (``replays``: e.g. the function
    returns a map with deterministic=False), which a ``Marks`` cannot seek: its pump reads under ``lock``
    (``Pump.Locked``), so that the consumer sees, at one cut, the slot iterator's position and what was read
    ahead of the consumer (``pending``: restored elements not yet read by the pump; then the pump's queue)."""

    __slots__ = ("lock", "iterator", "dataset", "pending")

    def __init__(self, iterator: Iterator, dataset: Dataset):
        self.lock = threading.Lock()
        self.iterator = iterator
        self.dataset = dataset
        self.pending: deque = deque()


class _Slot:
    """An open slot of a parallel interleave: its pump, and what its reader thread publishes for ``save()``
    (the ``Marks`` over the slot's iterator, once opened; or a ``_KeptSlot``). ``restored``: the slot's
    saved state, until its thread has restored it."""

    __slots__ = ("pump", "rewind", "position", "kept", "restored", "taken", "told", "failed")

    def __init__(self, restored: Any = None):
        self.pump: Optional[Pump] = None
        self.rewind: Optional[Marks] = None
        self.position: Optional[InputPosition] = None
        self.kept: Optional[_KeptSlot] = None
        self.restored = restored
        self.taken = 0  # elements the consumer took; told to the Marks when a state is asked for
        self.told = 0
        self.failed = False  # reading the input raised: the pump re-raises it at the slot's turn

    def state(self) -> Any:
        kept = self.kept
        if kept is not None:
            return self.kept_state(kept)
        rewind = self.rewind
        if rewind is None:
            return self.restored  # nothing taken since: as it was restored (None: from its start)
        state = self.rewind_state()
        self.position.check(state["input"])
        return state

    def kept_state(self, kept: _KeptSlot) -> dict:
        """The slot iterator's position and the elements read ahead, at one cut: the pump waits meanwhile,
        and until the consumer's next element (``Pump.hold``; the caller resumes it)."""
        pump = self.pump
        with kept.lock:
            inner = save_input(kept.iterator, kept.dataset)
            ahead = list(kept.pending) + pump.buffered()
            pump.hold()
        return {"input": inner, "buffer": encode_elements(ahead)}

    def rewind_state(self) -> Optional[dict]:
        """The Marks's state, told what the consumer took (which drops its records behind that)."""
        rewind = self.rewind
        if rewind is None:  # a kept slot, or not opened yet
            return None
        if self.taken != self.told:
            rewind.taken += self.taken - self.told
            self.told = self.taken
        return rewind.save()


def _read_slot(node: InterleaveDataset, x: Any, ctx: IteratorContext, slot: _Slot) -> Iterator:
    """A slot's elements, on its pump's thread: the function runs there too (in parallel), and its error
    reaches the consumer at the slot's turn. A restored slot seeks, then skips what its ``Marks`` says; one
    whose dataset does not read again alike is read under a lock instead (``_KeptSlot``)."""
    ds, it = node._open(x, ctx)
    try:
        if not replays(ds, ctx):
            yield from _read_kept_slot(node, ds, it, slot)
            return
        base = None
        if slot.restored is not None:
            where = node._describe()
            base = restore_rewind(it, ds, slot.restored, where)
            skip_elements(it, base[1], where)
        position = InputPosition(it, ds)
        rewind = Marks(position, ds, 64, base=base)
        rewind.mark(0)  # the first record, before save() can see the Marks
        slot.position = position
        slot.rewind = rewind
        step = it.__next__
        n, record = 1, rewind.next
        while True:
            try:
                y = step()
            except StopIteration:
                return
            yield y
            if n >= record:
                rewind.mark(n)
                record = rewind.next
            n += 1
    finally:
        close_input(it)


def _read_kept_slot(node: InterleaveDataset, ds: Dataset, it: Iterator, slot: _Slot) -> Iterator:
    kept = _KeptSlot(it, ds)
    if slot.restored is not None:
        where = f"{node._describe()} (a slot)"
        buffer = decode_elements(field(slot.restored, "buffer", str, where), where)
        restore_input(it, ds, field(slot.restored, "input", STATE, where))
        kept.pending.extend(buffer)
    slot.kept = kept  # the consumer's save() reads it from now on: nothing was read yet
    yield Pump.Locked(kept.lock)  # each next step runs under the lock
    pending = kept.pending
    while pending:
        yield pending.popleft()
    yield from elements_of(it)


def _close_slots(slots: list) -> None:
    for slot in slots:
        if slot is not None and slot.pump is not None:
            slot.pump.close()


class _ParallelInterleaveIterator(_InterleaveState, NodeIterator):
    """A parallel interleave's iterator. The whole cycle is open at once, as in tf.data's parallel
    interleave: a pump thread per slot calls the function and reads ahead. The consumer keeps tf.data's
    cycle/block order; with nondeterminism allowed it takes elements in completion order instead, so a slow
    slot holds up only itself (its state then resumes exactly once, in any order). State: as the sequential
    iterator's, each slot's position being a ``Marks``'s (what the consumer took, not what was read ahead).
    A slot whose dataset does not read again alike (the function returns a map with deterministic=False)
    cannot be rewound: its state is instead its iterator's position and the elements its pump read ahead,
    taken at one cut (``_KeptSlot``: ``{"input": ..., "buffer": "<encoded>"}``).

    Example::

        >>> ds = Dataset.range(4).interleave(lambda x: Dataset.range(x), cycle_length=2, num_parallel_calls=2)
        >>> it = iter(ds); _ = next(it); state = it.state_dict()
    """

    __slots__ = ("_slots", "_ready", "_notify", "_deterministic", "_started", "_restored", "_held", "_stop",
                 "__weakref__")

    def __init__(self, node: InterleaveDataset, ctx: IteratorContext, cycle: int):
        _InterleaveState.__init__(self, node, ctx, cycle)
        self._slots: list = [None] * cycle
        self._deterministic = _deterministic(node._deterministic, ctx)
        ready = threading.Condition()

        def notify() -> None:  # a pump's: refers to the condition alone, not to this iterator
            with ready:
                ready.notify_all()

        self._ready = ready
        self._notify = notify
        self._started = False
        self._restored: Optional[list] = None
        self._held: list = []  # the pumps of kept slots a save() holds until the next element (Pump.hold)
        self._stop: Optional[weakref.finalize] = None

    def _open_slot(self, j: int, x: Any, restored: Any = None) -> None:
        slot = _Slot(restored)
        slot.pump = Pump(_read_slot(self._node, x, self._ctx, slot), capacity=max(2, 2 * self._node._block_length),
                         on_ready=self._notify, name="dataservice-interleave")
        self._slots[j] = slot

    def _fill(self) -> None:
        """Opens an input in every empty slot, in slot order. A slot emptied as the loop serves it takes the
        next input at once, which is the input tf.data's order gives it on its next turn."""
        slots = self._slots
        for j in range(self._cycle):
            if slots[j] is not None or self._done:
                continue
            try:
                x = self._read_input(j)
            except Exception as exc:  # raised when the loop reaches this slot, as without read-ahead
                self._done = True
                slot = _Slot()
                slot.failed = True
                slot.pump = Pump(_raising(exc), capacity=1, on_ready=self._notify, name="dataservice-interleave")
                slots[j] = slot
                return
            if x is _END:
                return
            self._open_slot(j, x)

    def _start(self) -> None:
        self._started = True
        # Stops the threads when this iterator is collected unclosed; it refers to the slots, not to this.
        self._stop = weakref.finalize(self, _close_slots, self._slots)
        if self._restored is not None:
            for j, entry in enumerate(self._restored):
                if entry is not None:
                    self._open_slot(j, *entry)
            self._restored = None
        self._fill()

    def __next__(self) -> Any:
        if not self._started:
            self._start()
        elif self._held:
            for pump in self._held:
                pump.resume()
            self._held.clear()
        slots = self._slots
        cycle = self._cycle
        block = self._node._block_length
        deterministic = self._deterministic
        i = self._index
        while True:
            if self._done and slots.count(None) == cycle:
                raise StopIteration
            slot = slots[i]
            if slot is None:
                i = self._index = (i + 1) % cycle
                self._in_block = 0
                continue
            pump = slot.pump
            if deterministic:
                item = pump.get()
            else:
                item = pump.poll()
                if item is Pump.EMPTY:
                    if self._in_block:
                        self._in_block = 0
                        i = self._index = (i + 1) % cycle  # not ready: another slot's turn
                        continue
                    # Completion order: wait for any open slot to have something, then serve it.
                    with self._ready:
                        self._ready.wait_for(lambda: any(s is not None and s.pump.has_buffered() for s in slots))
                    i = self._index = next(j for j in itertools.chain(range(i, cycle), range(i))
                                           if slots[j] is not None and slots[j].pump.has_buffered())
                    continue
            if item is Pump.END:
                pump.close()
                slots[i] = None
                self._fill()
                i = self._index = (i + 1) % cycle
                self._in_block = 0
                continue
            taken = slot.taken = slot.taken + 1
            if not taken & _PRUNE_EVERY:
                slot.rewind_state()  # drops the records behind what was taken, saved or not
            n = self._in_block + 1
            if n < block:
                self._in_block = n
            else:
                self._in_block = 0
                self._index = (i + 1) % cycle
            return item

    def save(self) -> dict:
        if self._restored is not None:  # restored, not started: as restored
            return self._save_restored()
        # A slot whose opening read raised: restored, the input reads that element again, in that slot.
        failed = next((j for j, s in enumerate(self._slots) if s is not None and s.failed), None)
        # Kept slots' pumps wait from their state on until the next element (resumed there, even if this
        # raises): a state taken again is the same.
        self._held[:] = [s.pump for s in self._slots if s is not None and s.kept is not None]
        slots = [None if s is None or s.failed else {"at": self._at[j], "slot": s.state()}
                 for j, s in enumerate(self._slots)]
        return self._save_common(slots, failed)

    def _save_restored(self) -> dict:
        slots = [None if entry is None else {"at": self._at[j], "slot": entry[1]}
                 for j, entry in enumerate(self._restored)]
        return self._save_common(slots)

    def restore(self, state: Any) -> None:
        self._restored = self._restore_common(state)
        self._slots[:] = [None] * self._cycle

    def close(self) -> None:
        if self._stop is not None:
            self._stop()  # each slot's thread closes its iterator once it stops
        close_input(self._input)


#: A slot's ``Marks`` drops the records behind what the consumer took every this many elements plus one
#: (a mask), whether or not a state is asked for (as each mark does).
_PRUNE_EVERY = 4095


def _raising(exc: BaseException) -> Iterator:
    raise exc
    yield  # a generator: the pump raises exc when it runs it


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

    def _not_checkpointable_reason(self) -> str:
        return _SPLITS_REASON

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if ctx.split_provider is None:
            return _ZipIterator(self, [ds._iterator(ctx) for ds in self._datasets])
        return self._split_elements(ctx)

    def _split_elements(self, ctx: IteratorContext) -> Iterator:
        fan_out = _SplitFanOut(ctx.split_provider, len(self._datasets))
        iterators = [ds._iterator(dataclasses.replace(ctx, split_provider=fan_out.branch(k)))
                     for k, ds in enumerate(self._datasets)]
        template = self._structure
        for row in zip(*iterators):
            yield structure.pack_as(template, row)


#: Why a zip or concatenate reading provided splits (distributed_epoch, on a worker) has no position.
_SPLITS_REASON = ("it reads the splits a split provider hands out (distributed_epoch on a worker), whose position the "
                  "service's dispatcher keeps, not the iterator; checkpoint a local pipeline, or the trainer's side "
                  "of the service")


class _ZipIterator(NodeIterator):
    """A zip's iterator: its inputs' iterators in lockstep. State: each input's position, in order. Elements
    come from ``zip`` (and the structure's packing) bound directly: no Python step of its own per element.

    Example::

        >>> it = iter(Dataset.zip(Dataset.range(5), Dataset.range(5))); _ = next(it)
        >>> it.state_dict()["position"]
        [{'chunk': 0, 'offset': 1}, {'chunk': 0, 'offset': 1}]
    """

    __slots__ = ("__next__", "_node", "_iterators")

    def __init__(self, node: ZipDataset, iterators: list):
        self._node = node
        self._iterators = iterators
        template = node._structure
        rows = zip(*map(direct_iterator, iterators))
        if type(template) is tuple and all(isinstance(leaf, Dataset) for leaf in template):
            self.__next__ = rows.__next__  # a flat tuple: the row is the element
        else:
            self.__next__ = map(functools.partial(structure.pack_as, template), rows).__next__

    def save(self) -> list:
        return [save_input(it, ds) for it, ds in zip(self._iterators, self._node._datasets)]

    def restore(self, state: Any) -> None:
        where = self._node._describe()
        if not isinstance(state, list) or len(state) != len(self._iterators):
            raise ValueError(f"malformed iterator state for {where}: expected a list of {len(self._iterators)} "
                             f"input positions, got {_shown(state)}")
        for it, ds, inner in zip(self._iterators, self._node._datasets, state):
            restore_input(it, ds, inner)

    def close(self) -> None:
        for it in self._iterators:
            close_input(it)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
        """``it`` (input ``index``'s elements); a spec that needed an element is checked on its first one.
        ``_SEEN`` stands for a spec learnt before a restored iterator's cut: the input's ``element_spec``."""
        from dataservice.data import specs

        for x in it:
            if specs_seen[index] is None:
                specs_seen[index] = _spec_of(x)
                if None not in specs_seen:
                    inputs = (self._first, self._second)
                    specs.concatenated(*(inputs[k].element_spec if spec is _SEEN else spec
                                         for k, spec in enumerate(specs_seen)))
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

    def _not_checkpointable_reason(self) -> str:
        return _SPLITS_REASON

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if ctx.split_provider is None:
            return _ConcatenateIterator(self, ctx)
        return self._split_elements(ctx)

    def _split_elements(self, ctx: IteratorContext) -> Iterator:
        # The inputs' specs, where known without an element; the others are learnt from their first element.
        seen = [_static_spec(self._first), _static_spec(self._second)]
        lazy = None in seen
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


_SEEN = object()


class _ConcatenateCursor:
    __slots__ = ("index", "its", "seen")

    def __init__(self, seen: list):
        self.index = 0    # the input being read; 2 once both ended
        self.its: list = []
        self.seen = seen  # per input, its spec once its first element went by (see _checked)


def _concatenated(node: ConcatenateDataset, ctx: IteratorContext, cursor: _ConcatenateCursor, lazy: bool) -> Iterator:
    while cursor.index < 2:
        index = cursor.index
        it = direct_iterator(cursor.its[index])
        yield from node._checked(it, cursor.seen, index) if lazy else it
        cursor.index = index + 1


class _ConcatenateIterator(NodeIterator):
    """A concatenate's iterator. State: which input it reads (2 after both), each input's position and
    which inputs' first elements went by: a restored iterator checks
    the second input's first element against the first's ``element_spec`` when the first's spec was learnt
    before the cut, and skips the check when it was made before the cut.

    Example::

        >>> it = iter(Dataset.range(3).concatenate(Dataset.range(3))); _ = [next(it) for _ in range(4)]
        >>> it.state_dict()["position"]
        {'index': 1, 'inputs': [{'chunk': 1, 'offset': 0}, {'chunk': 0, 'offset': 1}], 'seen': [True, True]}
    """

    __slots__ = ("__next__", "_node", "_ctx", "_cursor", "_lazy", "_elements")

    def __init__(self, node: ConcatenateDataset, ctx: IteratorContext):
        self._node = node
        self._ctx = ctx
        # The inputs' specs, where known without an element; the others are learnt from their first element.
        seen = [_static_spec(node._first), _static_spec(node._second)]
        self._lazy = None in seen
        self._cursor = _ConcatenateCursor(seen)
        # Both made now (constructing reads nothing), so that both are in every state, the second before it
        # begins and the first after it ended: restoring each sets the epoch counters of the shuffles in it
        # as reading it did, which under repeat decides the next repetition's orders.
        self._cursor.its = [node._first._iterator(ctx), node._second._iterator(ctx)]
        self._elements = _concatenated(node, ctx, self._cursor, self._lazy)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        cursor = self._cursor
        inputs = (self._node._first, self._node._second)
        return {"index": cursor.index,
                "inputs": [save_input(it, ds) for it, ds in zip(cursor.its, inputs)],
                "seen": [spec is not None for spec in cursor.seen]}

    def restore(self, state: Any) -> None:
        node = self._node
        where = node._describe()
        index = field(state, "index", int, where)
        if index > 2:
            raise ValueError(f"malformed iterator state for {where}: 'index' must be 0, 1 or 2, got {index}")
        inners = field(state, "inputs", list, where)
        seen = field(state, "seen", list, where)
        if len(seen) != 2 or not all(type(flag) is bool for flag in seen):
            raise ValueError(f"malformed iterator state for {where}: 'seen' must be two booleans, got {_shown(seen)}")
        if len(inners) != 2:
            raise ValueError(f"malformed iterator state for {where}: 'inputs' must hold the position of each of "
                             f"the 2 inputs, got {_shown(inners)}")
        cursor = self._cursor
        for it, dataset, inner in zip(cursor.its, (node._first, node._second), inners):
            restore_input(it, dataset, inner)
        cursor.index = index
        if self._lazy:
            cursor.seen[:] = [_SEEN if flag else None for flag in seen]

    def close(self) -> None:
        close_input(self._elements)
        for it in self._cursor.its:
            close_input(it)


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
