"""Per-element transformations: map (sequential and parallel), filter, take_while, enumerate, unique."""

from __future__ import annotations

from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any, Callable, Iterator, Optional

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
    _function_name,
)
from dataservice.data.checkpoint import Marks
from dataservice.data.transformations.common import (
    STATE,
    _check_callable,
    _check_int,
    _check_parallelism,
    _deterministic,
    _in_flight,
    _result,
    _spec_of,
    _static_spec,
    _UnaryDataset,
    elements_of,
    later,
    raise_user_error,
    check_rewindable,
    replays,
)
from dataservice.errors import InvalidArgumentError, NotCheckpointableError


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
        if self._num_parallel_calls is None:
            return self._sequential(self._input._iterator(ctx))
        # Read ahead, and over an input that reads again alike, restored by reading it again.
        rewound = ctx.rewound() if replays(self._input, ctx) else None
        return _ParallelMapIterator(self, self._input._iterator(rewound or ctx), ctx, rewound)

    def _sequential(self, it: Iterator) -> Iterator:
        return Follows(self._mapped(it), it, self._input)

    def _mapped(self, it: Iterator) -> Iterator:
        fn, normalize, where = self._fn, structure.normalize, self._describe()
        for x in elements_of(it):
            try:
                y = fn(*x) if type(x) is tuple else fn(x)
            except Exception as exc:
                raise_user_error(exc, where)
            yield normalize(y)


#: How often a parallel map records its input's position (``Marks``): restoring reads again, without
#: mapping them, at most this many input elements plus those that were in flight.
_MARK_EVERY = 32


class _MapCursor:
    """What a parallel map's generator shares with its iterator (not the iterator itself: no cycle)."""

    __slots__ = ("rewind", "skip", "low", "done", "flight", "pending")

    def __init__(self, rewind: Optional[Marks]):
        self.rewind = rewind     # None: the input does not replay; the state holds the inputs in flight
        self.skip = 0            # input elements to drop before the first (restoring: see Marks)
        self.low = 0             # unordered: the oldest input element not yet yielded (its number)
        self.done: set = set()   # unordered: the numbers above ``low`` already yielded
        # The inputs read and not yet yielded: a deque of (future, x); unordered, {future: (x, number)}.
        self.flight: Any = None
        self.pending: list = []  # restoring without rewind: the inputs that were in flight


class _ParallelMapIterator(NodeIterator):
    """map with ``num_parallel_calls``: the function runs on the context's thread pool, at most ``limit``
    calls ahead of the consumer (the pool starts at the first ``next()``).

    Its input is read ahead, so its state is the position of what the consumer took (``Marks``, as
    ``checkpoint.Marks``): a recorded input state and how many input elements to drop after it (the
    function is not called for them). Deterministic: the elements come in input order, so what was taken
    is a prefix. Not deterministic: they come as they finish, so the state is the oldest element not yet yielded and the
    set of the later ones (at most ``window`` on) that were (``yielded``, a hex bit mask): restoring drops
    those, and every other element is yielded exactly once.

    Reading an input again gives its elements again only if its order is reproducible (``replays``); over
    one that is not (a nondeterministic map or interleave) the state is the input's position and the
    input elements in flight (``pending``, encoded), which restoring maps first.

    Example::

        >>> it = iter(Dataset.range(100).map(f, num_parallel_calls=4, deterministic=False))
        >>> _ = [next(it) for _ in range(10)]
        >>> it.state_dict()["position"]   # {"input": {...}, "skip": 7, "yielded": "1a"}
    """

    __slots__ = ("__next__", "_elements", "_input", "_node", "_cursor", "_ordered", "_window", "_rewound")

    def __init__(self, node: "MapDataset", it: Iterator, ctx: IteratorContext,
                 rewound: Optional[IteratorContext] = None):
        self._rewound = rewound
        fn, normalize, where = node._fn, structure.normalize, node._describe()

        def call(x):
            return normalize(fn(*x) if type(x) is tuple else fn(x))

        limit = _in_flight(node._num_parallel_calls, ctx)
        self._input = it
        self._node = node
        self._ordered = _deterministic(node._deterministic, ctx)
        # Unordered: how far past the oldest unfinished element reading may go. It bounds the state (the
        # set of elements yielded past it) while letting a slow element be overtaken by many.
        self._window = max(16, 4 * limit)
        rewind = Marks(it, node._input, _MARK_EVERY) if replays(node._input, ctx) else None
        self._cursor = _MapCursor(rewind)
        if self._ordered:
            self._elements = _ordered_map(it, call, self._cursor, ctx, limit, where)
        else:
            self._elements = _unordered_map(it, call, self._cursor, ctx, limit, self._window, where)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        check_rewindable(self._rewound, self._node)
        cursor = self._cursor
        if cursor.rewind is None:
            flight = cursor.flight
            if flight is None:  # not started
                pending = cursor.pending
            elif self._ordered:
                pending = [x for _, x in flight]
            else:
                pending = [x for x, _ in flight.values()]
            return {"input": save_input(self._input, self._node._input), "pending": encode_elements(pending)}
        state = cursor.rewind.save()
        if not self._ordered:
            low, mask = cursor.low, 0
            for n in cursor.done:
                mask |= 1 << (n - low)
            state["yielded"] = format(mask, "x")
        return state

    def restore(self, state: Any) -> None:
        where = self._node._describe()
        cursor = self._cursor
        if cursor.rewind is None:
            restore_input(self._input, self._node._input, field(state, "input", STATE, where))
            cursor.pending = decode_elements(field(state, "pending", str, where), where)
            return
        inner, skip = restore_rewind(self._input, self._node._input, state, where)
        cursor.rewind = Marks(self._input, self._node._input, _MARK_EVERY, base=(inner, skip))
        cursor.skip = skip
        if not self._ordered:
            text = field(state, "yielded", str, where, default="0")
            try:
                mask = int(text, 16)
            except ValueError:
                mask = -1
            if mask < 0 or mask & 1 or mask.bit_length() > self._window:
                raise ValueError(f"malformed iterator state for {where}: 'yielded' must be a hex mask of at "
                                 f"most {self._window} bits, the first clear, got {text[:80]!r}")
            cursor.done = {n for n in range(mask.bit_length()) if mask >> n & 1}
        elif "yielded" in state:
            raise ValueError(f"the iterator state does not fit {where}: it is of a map with deterministic=False")

    def close(self) -> None:
        close_input(self._elements)
        close_input(self._input)


def _ordered_map(it: Iterator, call: Callable, cursor: _MapCursor, ctx: IteratorContext, limit: int,
                 where: str) -> Iterator:
    rewind = cursor.rewind  # read at the first next(): after a restore
    if rewind is not None:
        skip_elements(it, cursor.skip, where)
    submit = ctx.thread_pool().submit
    pending: deque = deque((submit(call, x), x) for x in cursor.pending)  # restored: they come first
    cursor.flight, cursor.pending = pending, []
    popleft = pending.popleft
    n = 0  # the input elements read
    if rewind is None:
        rewind = Marks(it, None, 1)  # marks nothing: its ``next`` is never reached
        rewind.next = 1 << 62
    try:
        while True:
            if n >= rewind.next:
                rewind.mark(n)
            try:
                x = next(it)
            except StopIteration:
                break
            n += 1
            pending.append((submit(call, x), x))
            if len(pending) >= limit:
                y = _result(popleft()[0], where)
                rewind.taken += 1
                yield y
        while pending:
            y = _result(popleft()[0], where)
            rewind.taken += 1
            yield y
    finally:
        for f, _ in pending:
            f.cancel()


def _unordered_map(it: Iterator, call: Callable, cursor: _MapCursor, ctx: IteratorContext, limit: int,
                   window: int, where: str) -> Iterator:
    rewind = cursor.rewind
    track = rewind is not None
    if track:
        skip_elements(it, cursor.skip, where)
    else:
        window = 1 << 62  # nothing to bound: the state holds what is in flight, at most ``limit``
    # ``low``: the number of the oldest input element not yet yielded; ``done``: the numbers above it that
    # were (restored ones included), until ``low`` reaches them. cursor.low follows ``low`` for save().
    done, low = cursor.done, cursor.low
    submit = ctx.thread_pool().submit
    running: dict = {}  # future -> (its input element, its number; -1: restored without rewind)
    cursor.flight = running
    for x in cursor.pending:  # restored: they were in flight
        running[submit(call, x)] = (x, -1)
    cursor.pending = []
    n = 0  # the input elements read
    exhausted = False
    try:
        while True:
            while not exhausted and len(running) < limit and n - low < window:
                if track and n >= rewind.next:
                    rewind.mark(n)
                try:
                    x = next(it)
                except StopIteration:
                    exhausted = True
                    break
                if n in done:  # restored: yielded before the state was taken
                    if n == low:
                        low = _advance(done, low, rewind)
                        cursor.low = low
                else:
                    running[submit(call, x)] = (x, n if track else -1)
                n += 1
            if not running:
                return  # exhausted: below the window every element read was yielded
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                y = _result(f, where)
                number = running.pop(f)[1]
                if number == low:
                    low = _advance(done, low + 1, rewind, 1)
                    cursor.low = low
                elif number > low:
                    done.add(number)
                yield y
    finally:
        for f in running:
            f.cancel()


def _advance(done: set, low: int, rewind: Marks, taken: int = 0) -> int:
    """Past the elements from ``low`` on that were yielded; the new oldest not yet yielded."""
    start = low
    while low in done:
        done.remove(low)
        low += 1
    rewind.taken += taken + low - start
    return low


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
        it = self._input._iterator(ctx)
        return Follows(self._kept(it), it, self._input)

    def _kept(self, it: Iterator) -> Iterator:
        pred, where = self._predicate, self._describe()
        for x in elements_of(it):
            try:
                keep = pred(*x) if type(x) is tuple else pred(x)
            except Exception as exc:
                raise_user_error(exc, where)
            if keep:
                yield x


class TakeWhileDataset(_UnaryDataset):
    def __init__(self, input_dataset: Dataset, predicate: Callable):
        super().__init__(input_dataset)
        self._predicate = _check_callable("predicate", predicate)

    def _describe(self) -> str:
        return f"Dataset.take_while({_function_name(self._predicate)})"

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return _TakeWhileIterator(self, self._input._iterator(ctx))

    def _taken(self, it: Iterator, ended: list) -> Iterator:
        if ended[0]:  # restored after the predicate ended it
            return
        pred, where = self._predicate, self._describe()
        for x in elements_of(it):
            try:
                keep = pred(*x) if type(x) is tuple else pred(x)
            except Exception as exc:
                raise_user_error(exc, where)
            if not keep:
                ended[0] = True
                return
            yield x


class _TakeWhileIterator(Follows):
    """take_while: its input's position, until the predicate fails; then ``{"ended": true}`` (the input
    read one element past the last yielded, which a restored iterator must not yield either).

    Example::

        >>> it = iter(Dataset.range(10).take_while(lambda x: x < 3)); list(it)
        >>> it.state_dict()["position"]
        {'ended': True}
    """

    __slots__ = ("_ended",)

    def __init__(self, node: TakeWhileDataset, it: Iterator):
        self._ended = [False]
        super().__init__(node._taken(it, self._ended), it, node._input)

    def save(self) -> dict:
        if self._ended[0]:
            return {"ended": True}
        return {"ended": False, "input": save_input(self._input, self._input_node)}

    def restore(self, state: Any) -> None:
        if field(state, "ended", bool, "Dataset.take_while"):
            self._ended[0] = True
            return
        restore_input(self._input, self._input_node, field(state, "input", STATE, "Dataset.take_while"))


class EnumerateDataset(_UnaryDataset):
    _op_name = "Dataset.enumerate"

    def __init__(self, input_dataset: Dataset, start: int):
        super().__init__(input_dataset)
        self._start = _check_int("start", start)

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return (specs.TensorSpec((), np.int64), self._input.element_spec)

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        return _EnumerateIterator(self, self._input._iterator(ctx))


class _EnumerateIterator(NodeIterator):
    """enumerate: the input's position and the count. The count is a range iterator zipped with the input
    (as fast as ``itertools.count``) whose position can be read and set.

    Example::

        >>> it = iter(Dataset.range(10).enumerate(start=5)); _ = next(it)
        >>> it.state_dict()["position"]
        {'index': 1, 'input': {'chunk': 0, 'offset': 1}}
    """

    __slots__ = ("__next__", "_counter", "_length", "_input", "_input_node")

    def __init__(self, node: EnumerateDataset, it: Iterator):
        # 2**62 counts: endless in practice; start + that past int64 overflows, as np.int64(count) would.
        numbers = range(node._start, node._start + 2 ** 62)
        self._length = len(numbers)
        self._counter = iter(numbers)
        self._input = it
        self._input_node = node._input
        self.__next__ = zip(map(np.int64, self._counter), later(it)).__next__

    def save(self) -> dict:
        # zip draws the count first: after an input that ended it is one ahead, which no element follows.
        return {"index": self._length - self._counter.__length_hint__(),
                "input": save_input(self._input, self._input_node)}

    def restore(self, state: Any) -> None:
        index = field(state, "index", int, "Dataset.enumerate")
        restore_input(self._input, self._input_node, field(state, "input", STATE, "Dataset.enumerate"))
        self._counter.__setstate__(index)  # a fresh range iterator: the index from its start

    def close(self) -> None:
        close_input(self._input)


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
        return _UniqueIterator(self, self._input._iterator(ctx))

    def _distinct(self, it: Iterator, seen: dict) -> Iterator:
        checked = _static_spec(self._input) is not None
        for x in elements_of(it):
            if not checked:
                _check_unique_spec(_spec_of(x), self._describe())
                checked = True
            key = _unique_key(x)
            if key in seen:
                continue
            seen[key] = None
            yield x


class _UniqueIterator(Follows):
    """unique: its input's position and the keys seen so far (a buffer that grows with the distinct
    elements, as tf.data's), as compact JSON: ``{"i": [ints], "b": [bytes as latin-1], "s": [strs],
    "t": [[shape, kinds, values]]}`` (``t``: non-scalar tensors, one kind letter per value).

    Example::

        >>> it = iter(Dataset.from_tensor_slices([1, 1, 2]).unique()); _ = next(it)
        >>> it.state_dict()["position"]["seen"]
        {'i': [1]}
    """

    __slots__ = ("_seen",)

    def __init__(self, node: UniqueDataset, it: Iterator):
        self._seen: dict = {}  # a dict: insertion-ordered, so that the state is the same when taken twice
        super().__init__(node._distinct(it, self._seen), it, node._input)

    def save(self) -> dict:
        return {"input": save_input(self._input, self._input_node), "seen": _encode_keys(self._seen)}

    def restore(self, state: Any) -> None:
        restore_input(self._input, self._input_node, field(state, "input", STATE, "Dataset.unique"))
        self._seen.update(dict.fromkeys(_decode_keys(field(state, "seen", dict, "Dataset.unique"))))


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


def _key_kind(value: Any) -> tuple[str, Any]:
    # bool is no key unique takes (int32, int64 and string elements only); a numpy int is an int.
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return "i", int(value)
    if isinstance(value, bytes):
        return "b", value.decode("latin-1")  # every byte one code point: lossless, ASCII stays as it is
    if isinstance(value, str):
        return "s", str(value)
    raise NotCheckpointableError(f"Dataset.unique cannot save its seen elements: a key of type "
                                 f"{type(value).__name__} ({value!r:.40}) has no JSON form")


def _encode_keys(seen: dict) -> dict:
    groups: dict = {}
    for key in seen:
        if type(key) is tuple:  # (shape, values) of a non-scalar tensor
            shape, values = key
            kinds = [_key_kind(v) for v in values]
            groups.setdefault("t", []).append([list(shape), "".join(k for k, _ in kinds), [v for _, v in kinds]])
        else:
            kind, value = _key_kind(key)
            groups.setdefault(kind, []).append(value)
    return groups


def _decode_value(kind: str, value: Any) -> Any:
    if kind == "i" and type(value) is int:
        return value
    if kind == "b" and isinstance(value, str):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            pass
    elif kind == "s" and isinstance(value, str):
        return value
    raise ValueError(f"malformed iterator state for Dataset.unique: a seen key {value!r:.40} is not of kind {kind!r}")


def _decode_keys(groups: dict) -> list:
    keys = []
    for kind, values in groups.items():
        if kind not in ("i", "b", "s", "t") or not isinstance(values, list):
            raise ValueError(f"malformed iterator state for Dataset.unique: unknown group {kind!r} of seen keys")
        if kind != "t":
            keys.extend(_decode_value(kind, v) for v in values)
            continue
        for entry in values:
            ok = (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], list)
                  and all(type(d) is int and d >= 0 for d in entry[0]) and isinstance(entry[1], str)
                  and isinstance(entry[2], list) and len(entry[1]) == len(entry[2]))
            if not ok:
                raise ValueError(f"malformed iterator state for Dataset.unique: a seen tensor {entry!r:.80} is not "
                                 "[shape, kinds, values]")
            keys.append((tuple(entry[0]), tuple(_decode_value(k, v) for k, v in zip(entry[1], entry[2]))))
    return keys
