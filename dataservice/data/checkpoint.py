"""Iterator state: what ``it.state_dict()`` returns and ``it.load_state_dict(state)`` restores.

Every node's iterator owns its position, as tf.data's ``SaveInternal``/``RestoreInternal`` and Grain's
``get_state``: ``save()`` returns it as small JSON data (ints, strings, lists, dicts; never a pickle), and
``restore(state)``, called on a fresh iterator before its first element, *seeks* there: a range jumps to
its index, a record file to its byte offset, a map restores its input and calls its function for nothing
before. A node's state nests its inputs' states, so the root's state is the pipeline's position.

The document ``state_dict()`` returns::

    {"format": "dataservice.iterator", "version": 1,
     "pipeline": "<fingerprint: the pipeline's structure and functions>",
     "position": <the root iterator's save()>}

Rules for an iterator class (subclass ``NodeIterator``):

- Constructing it reads nothing and starts no thread: ``restore`` may come before the first ``__next__``.
- ``save()`` is called between two ``__next__`` calls, on the consumer's thread; it must not change what
  comes next. A node that reads ahead (prefetch, parallel map and interleave) saves the position of what
  its consumer took, not of what it read: see ``Marks``.
- ``restore(state)`` validates what it reads (``field``) so that a malformed state is a ``ValueError``
  naming what is wrong, never a crash later.

Example::

    >>> it = iter(Dataset.range(10).map(lambda x: x * 2))
    >>> next(it), next(it)
    (0, 2)
    >>> state = it.state_dict()          # json.dumps(state) works
    >>> it2 = iter(Dataset.range(10).map(lambda x: x * 2))
    >>> it2.load_state_dict(state)
    >>> next(it2)
    4
"""

from __future__ import annotations

import base64
import functools
import hashlib
import pickle
import threading
import types
import weakref
from collections import deque
from time import perf_counter
from typing import Any, Iterator, Optional

import numpy as np

from dataservice.errors import NotCheckpointableError

__all__ = ["FORMAT", "VERSION", "NodeIterator", "save_input", "restore_input", "field", "encode_elements",
           "decode_elements", "pipeline_fingerprint", "Marks", "Pace", "skip_elements"]

FORMAT = "dataservice.iterator"
VERSION = 1


class NodeIterator:
    """Base of a node's iterator: ``__next__``, ``save()`` and ``restore(state)``.

    Example::

        >>> class Counting(NodeIterator):
        ...     __slots__ = ("_n",)
        ...     def __init__(self): self._n = 0
        ...     def __next__(self): self._n += 1; return self._n
        ...     def save(self): return {"n": self._n}
        ...     def restore(self, state): self._n = field(state, "n", int, "Counting")
    """

    __slots__ = ()

    def __iter__(self) -> "NodeIterator":
        return self

    def __next__(self) -> Any:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def save(self) -> Any:
        raise NotImplementedError

    def restore(self, state: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stops what the iterator started (threads, readers); its inputs' too."""


def _why_not(node: Any) -> str:
    reason = getattr(node, "_not_checkpointable_reason", None)
    if callable(reason):
        return reason()
    return "its iterator does not save its position"


def save_input(it: Iterator, node: Any) -> Any:
    """The position of ``it``, the iterator ``node`` made; ``NotCheckpointableError`` naming ``node``
    when it cannot say."""
    save = getattr(it, "save", None)
    if save is None:
        raise NotCheckpointableError(f"{node._describe()} cannot be checkpointed: {_why_not(node)}")
    return save()


def restore_input(it: Iterator, node: Any, state: Any) -> None:
    """Seeks ``it`` (``node``'s iterator, not yet read) to ``state``."""
    restore = getattr(it, "restore", None)
    if restore is None:
        raise NotCheckpointableError(f"{node._describe()} cannot be restored: {_why_not(node)}")
    restore(state)


_MISSING = object()


def field(state: Any, key: str, kind: Any, where: str, default: Any = _MISSING, minimum: Optional[int] = 0) -> Any:
    """``state[key]``, checked to be a ``kind`` (a type or tuple of types); ValueError naming ``where`` and
    ``key`` otherwise. An int field refuses bools and values below ``minimum`` (None: any); ``default`` is
    returned for a missing key.

    Example::

        >>> field({"index": 3}, "index", int, "Dataset.range")
        3
    """
    if not isinstance(state, dict):
        raise ValueError(f"malformed iterator state for {where}: expected an object, got {_shown(state)}")
    value = state.get(key, _MISSING)
    if value is _MISSING:
        if default is not _MISSING:
            return default
        raise ValueError(f"malformed iterator state for {where}: {key!r} is missing (got keys {sorted(state)})")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ if k is not type(None) else "null" for k in kinds)
        raise ValueError(f"malformed iterator state for {where}: {key!r} must be {names}, got {_shown(value)}")
    if minimum is not None and isinstance(value, int) and not isinstance(value, bool) and value < minimum:
        raise ValueError(f"malformed iterator state for {where}: {key!r} must be >= {minimum}, got {value}")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- elements in a state: what a buffering node (shuffle, window, unique, cache) must keep ----------------

def encode_elements(elements: Any) -> str:
    """Elements as one ASCII string: the wire format's frame (arrays, strings, nestings), base64. For the
    buffers that a state must hold; a position never needs one."""
    from dataservice.service import wire

    frame = wire.encode_elements(list(elements))
    return base64.b64encode(b"".join(bytes(part) for part in frame.parts)).decode("ascii")


def decode_elements(text: Any, where: str) -> list:
    """The elements ``encode_elements`` wrote; ValueError naming ``where`` for anything else."""
    from dataservice.service import wire

    if not isinstance(text, str):
        raise ValueError(f"malformed iterator state for {where}: buffered elements must be a string, got "
                         f"{_shown(text)}")
    try:
        return wire.decode_elements(memoryview(base64.b64decode(text.encode("ascii"), validate=True)))
    except Exception as exc:
        raise ValueError(f"malformed iterator state for {where}: its buffered elements cannot be decoded "
                         f"({type(exc).__name__}: {exc})") from exc


# --- read-ahead: the position of what the consumer took, not of what was read ------------------------------

class Pace:
    """When a reader records its input's state (``Marks``, an interleave's slot openings): at read ``next``,
    then every ``interval`` reads, the interval growing so that recording costs at most ``BUDGET`` of the
    time the reads take. A position is cheap to save (a few hundred ns), but the state of a buffering node
    upstream (a shuffle's buffer, encoded) may cost milliseconds: recorded every 64 reads, it would cost more
    than the reading; paced, it costs 2%, and a restore replays at most ``interval`` reads, whose time is at
    most 1/BUDGET times one record's.

    Example::

        >>> pace = Pace(64)
        >>> if n >= pace.next: start = perf_counter(); record(); pace.recorded(n, start, perf_counter())
    """

    BUDGET = 0.02
    #: However costly a record, a restore replays at most this many reads.
    MAXIMUM = 1 << 20

    __slots__ = ("next", "interval", "_minimum", "_since", "_at", "_cost")

    def __init__(self, minimum: int):
        self._minimum = self.interval = max(1, minimum)
        self.next = 0
        self._since = 0.0  # when the last record ended
        self._at = 0       # at which read
        self._cost = 0.0   # what a record costs, as paced: at most twice the one before

    def recorded(self, n: int, start: float, end: float) -> None:
        """A record was made before read ``n``, from ``start`` to ``end`` (``time.perf_counter``)."""
        # One record stopped by something else (a garbage collection, another process on the core) must not
        # stretch the interval a hundredfold: a restore would then replay that many reads. A record that is
        # costly every time still gets its interval within a few records, doubling each time.
        cost = end - start if not self._cost else min(end - start, 2 * self._cost)
        self._cost = cost
        if n > self._at:
            per_read = (start - self._since) / (n - self._at)
            wanted = cost / (self.BUDGET * per_read) if per_read > 0 else self.MAXIMUM
            self.interval = min(self.MAXIMUM, max(self._minimum, int(wanted)))
        self._since, self._at = end, n
        self.next = n + self.interval


class Marks:
    """The position of an input that is read ahead of its consumer (prefetch, a parallel map or interleave,
    unbatch, window, a memory cache): records ("marks") of the input's state, and what the consumer took.

    The reader calls ``mark(n)`` before it reads element ``n`` of the input (counted from 0) whenever
    ``n >= marks.next``, on its own thread if it has one: no call per element. The consumer adds what it
    took to ``taken``. ``save()`` is then ``{"input": a recorded state, "skip": elements to drop after
    restoring it}``: a restore reads again at most one interval plus what was read ahead, and drops it.
    Marks are paced by their cost (``Pace``): every ``every`` reads while the input's state is cheap to
    save, less often when it is not (a shuffle's buffer). The marks behind what the consumer took are
    dropped at each mark, so a reader nobody checkpoints keeps few. An input that cannot save its position
    is read all the same: ``save()`` raises its error.

    Example::

        >>> marks = Marks(source_iterator, node._input, every=64)
        >>> for n in itertools.count():                    # the reader
        ...     if n >= marks.next: marks.mark(n)
        ...     x = next(source_iterator); ...
        >>> marks.taken += 1                               # the consumer, when x reaches it
        >>> marks.save()                                   # {"input": ..., "skip": 1}
    """

    __slots__ = ("taken", "next", "_input", "_node", "_marks", "_base", "_error", "_pace", "_lock")

    def __init__(self, input_iterator: Iterator, node: Any, every: int = 64,
                 base: Optional[tuple[Any, int]] = None):
        self.taken = 0
        self._pace = Pace(every)
        self.next = self._pace.next
        self._input = input_iterator
        self._node = node
        # (elements read before it, the input's state then, elements to drop after that state), oldest first.
        self._marks: deque = deque()
        self._base = base  # restored: (the state, the elements after it to drop)
        self._error: Optional[str] = None
        self._lock = threading.Lock()  # the reader marks on its thread, the consumer saves on its own

    def mark(self, n: int) -> None:
        """Records the input's state before read ``n`` (the reads before it done)."""
        start = perf_counter()
        mark = None
        if n == 0 and self._base is not None:
            mark = (0, self._base[0], self._base[1])
        elif self._error is None:
            try:
                mark = (n, save_input(self._input, self._node), 0)
            except NotCheckpointableError as exc:
                self._error = str(exc)
        if mark is not None:
            with self._lock:
                self._prune()
                self._marks.append(mark)
        self._pace.recorded(n, start, perf_counter())
        self.next = self._pace.next if self._error is None else 1 << 62

    def _prune(self) -> None:
        """Drops the marks the consumer is past (the newest at or before it is kept); under the lock."""
        taken, marks = self.taken, self._marks
        while len(marks) > 1 and marks[1][0] <= taken:
            marks.popleft()

    def save(self) -> dict:
        if self._error is not None:
            raise NotCheckpointableError(self._error)
        with self._lock:
            taken = self.taken
            self._prune()
            first = self._marks[0] if self._marks else None
        if first is None:  # nothing read yet
            if self._base is not None:
                return {"input": self._base[0], "skip": self._base[1]}
            return {"input": save_input(self._input, self._node), "skip": 0}
        at, state, skipped = first
        return {"input": state, "skip": skipped + taken - at}


def skip_elements(it: Iterator, count: int, where: str) -> None:
    """Reads and drops ``count`` elements of ``it`` (restoring a read-ahead node: see ``Marks``)."""
    for _ in range(count):
        try:
            next(it)
        except StopIteration:
            raise ValueError(f"the iterator state does not fit {where}: its input ended before the saved "
                             "position (was the state taken from another dataset?)") from None


def restore_rewind(it: Iterator, node: Any, state: Any, where: str) -> tuple[Any, int]:
    """Restores ``it`` at a ``Marks.save()``'s recorded state; returns (that state, elements still to skip)."""
    inner = field(state, "input", (dict, list, int, str, type(None)), where)
    skip = field(state, "skip", int, where)
    restore_input(it, node, inner)
    return inner, skip


# --- the pipeline's identity -----------------------------------------------------------------------------

_fingerprints: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def pipeline_fingerprint(dataset: Any) -> str:
    """A sha256 of the pipeline's structure and functions: each node's class and settings, each function's
    pickled code (by value for lambdas and functions of ``__main__``, by name for importable ones), each
    array's dtype, shape and bytes. Not its ``repr``, and not what an iterator changed (epoch counters).
    The same pipeline built again, in another process, has the same fingerprint.

    Example::

        >>> pipeline_fingerprint(Dataset.range(3)) == pipeline_fingerprint(Dataset.range(3))
        True
        >>> pipeline_fingerprint(Dataset.range(3)) == pipeline_fingerprint(Dataset.range(4))
        False
    """
    try:
        return _fingerprints[dataset]
    except (KeyError, TypeError):
        pass
    digest = hashlib.sha256()
    _digest_node(dataset, digest, {})
    fingerprint = digest.hexdigest()
    try:
        _fingerprints[dataset] = fingerprint
    except TypeError:  # pragma: no cover - not weakly referenceable
        pass
    return fingerprint


def _digest_node(node: Any, digest: Any, seen: dict) -> None:
    from dataservice.data.dataset import Dataset

    if id(node) in seen:  # a dataset used twice (zip(ds, ds)): its place, not its contents again
        digest.update(b"ref%d;" % seen[id(node)])
        return
    seen[id(node)] = len(seen)
    cls = type(node)
    digest.update(f"node {cls.__module__}.{cls.__qualname__}(".encode())
    identity = getattr(node, "_checkpoint_identity", None)  # a node whose settings include run-time details
    getstate = identity if callable(identity) else getattr(node, "__getstate__", None)
    attributes = getstate() if callable(getstate) else vars(node)
    if not isinstance(attributes, dict):
        attributes = vars(node)
    for name in sorted(attributes):
        digest.update(name.encode() + b"=")
        _digest_value(attributes[name], digest, seen, Dataset)
    digest.update(b");")


def _digest_value(value: Any, digest: Any, seen: dict, dataset_type: type) -> None:
    if isinstance(value, dataset_type):
        _digest_node(value, digest, seen)
    elif isinstance(value, (list, tuple)) and any(isinstance(v, dataset_type) for v in value):
        digest.update(b"[")
        for v in value:
            _digest_value(v, digest, seen, dataset_type)
            digest.update(b",")
        digest.update(b"]")
    elif isinstance(value, dict) and any(isinstance(v, dataset_type) for v in value.values()):
        digest.update(b"{")
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode() + b":")
            _digest_value(value[key], digest, seen, dataset_type)
            digest.update(b",")
        digest.update(b"}")
    elif isinstance(value, np.ndarray) and value.dtype.kind not in "OV":
        digest.update(f"array {value.dtype.str} {value.shape} ".encode())
        digest.update(hashlib.sha256(np.ascontiguousarray(value).view(np.uint8).data).digest())
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
        digest.update(b"arrays[")
        for v in value:
            _digest_value(v, digest, seen, dataset_type)
        digest.update(b"]")
    elif value is None or isinstance(value, (bool, int, float, str, bytes)):
        digest.update(f"{type(value).__name__} {value!r};".encode())
    elif isinstance(value, types.FunctionType):
        _digest_function(value, digest, seen, dataset_type)
    elif callable(value) and not isinstance(value, type):
        _digest_callable(value, digest, seen, dataset_type)
    else:
        digest.update(_object_digest(value).encode() + b";")


def _digest_callable(fn: Any, digest: Any, seen: dict, dataset_type: type) -> None:
    """A callable that is not a plain function: a ``functools.partial`` by its function and arguments, a bound
    method by its function and its object's type, anything else (an object with ``__call__``) by its type. Not
    by its pickle: a callable's pickle carries what it refers to as the pipeline runs (its module's globals,
    when it travels by value; its object's attributes), so the same pipeline would not match itself."""
    if isinstance(fn, functools.partial):
        digest.update(b"partial(")
        _digest_setting(fn.func, digest, seen, dataset_type)
        _digest_setting(tuple(fn.args), digest, seen, dataset_type)
        for name in sorted(fn.keywords or {}):
            digest.update(name.encode() + b"=")
            _digest_setting(fn.keywords[name], digest, seen, dataset_type)
        digest.update(b");")
    elif isinstance(fn, types.MethodType):
        digest.update(f"method of {type(fn.__self__).__module__}.{type(fn.__self__).__qualname__}(".encode())
        _digest_setting(fn.__func__, digest, seen, dataset_type)
        digest.update(b");")
    else:
        # A builtin or a numpy ufunc has a name of its own (np.sqrt is not np.exp); an object with __call__ its type.
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
        owner = type(fn)
        what = f"{getattr(fn, '__module__', None) or owner.__module__}.{name}" if isinstance(name, str) \
            else f"{owner.__module__}.{owner.__qualname__}"
        digest.update(f"callable {what};".encode())


_PLAIN_VALUES = (bool, int, float, str, bytes, type(None), np.ndarray, np.generic)


def _digest_function(fn: types.FunctionType, digest: Any, seen: dict, dataset_type: type) -> None:
    """A function by what it does: its code (bytecode, constants, names; not its file or line numbers, so
    an edit elsewhere in the file keeps the pipeline's identity), the settings it is given — its defaults and
    its closure — where they are plain values (numbers, strings, arrays), other functions or datasets, and the
    helper functions beside it that it calls. Any other object there counts by its type only, and a global by
    its name only: a tokenizer's cache, a counter or a table loaded on first use changes as the pipeline runs,
    and a pipeline rebuilt after a restart must match."""
    if id(fn) in seen:
        digest.update(b"fnref%d;" % seen[id(fn)])
        return
    seen[id(fn)] = len(seen)
    digest.update(b"function(")  # not its name: the same code in a renamed builder is the same pipeline
    _digest_code(fn.__code__, digest)
    for value in (fn.__defaults__ or ()):
        _digest_setting(value, digest, seen, dataset_type)
    for name in sorted(fn.__kwdefaults__ or {}):
        digest.update(name.encode() + b"=")
        _digest_setting(fn.__kwdefaults__[name], digest, seen, dataset_type)
    for cell in (fn.__closure__ or ()):
        try:
            _digest_setting(cell.cell_contents, digest, seen, dataset_type)
        except ValueError:  # an empty cell
            digest.update(b"empty;")
    for name in _global_names(fn.__code__):
        value = fn.__globals__.get(name, _MISSING)
        # A global counts by its name (in co_names, digested with the code), not its value: a module's globals
        # change as it runs (a counter, a table loaded on first use), and a restored pipeline must match. Only
        # a helper function beside it counts by what it does.
        if isinstance(value, types.FunctionType) and value.__module__ == fn.__module__:
            _digest_function(value, digest, seen, dataset_type)
    digest.update(b");")


def _digest_setting(value: Any, digest: Any, seen: dict, dataset_type: type) -> None:
    """What a function reads: plain values, tuples of them, functions and datasets by content; any other
    object by its type (see ``_digest_function``)."""
    if isinstance(value, (_PLAIN_VALUES, types.FunctionType, dataset_type)):
        _digest_value(value, digest, seen, dataset_type)
    elif type(value) is tuple or type(value) is frozenset:
        digest.update(b"(")
        for item in (value if type(value) is tuple else sorted(value, key=repr)):
            _digest_setting(item, digest, seen, dataset_type)
        digest.update(b")")
    else:
        digest.update(f"object {type(value).__module__}.{type(value).__qualname__};".encode())


def _digest_code(code: types.CodeType, digest: Any) -> None:
    digest.update(code.co_code)
    digest.update(repr((code.co_argcount, code.co_kwonlyargcount, code.co_flags, code.co_names,
                        code.co_varnames, code.co_freevars)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _digest_code(const, digest)
        else:
            digest.update(repr(const).encode() + b",")


def _global_names(code: types.CodeType) -> list:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_global_names(const))
    return sorted(names)


def _object_digest(value: Any) -> str:
    """A function, an Options, a structure: its pickle, in canonical form (the same object built again in
    another process gives the same digest); the type's name for what cannot be pickled (a lock)."""
    import cloudpickle

    from dataservice.data.snapshots import canonical_pickle_digest

    try:
        data = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return f"unpicklable {type(value).__module__}.{type(value).__qualname__}"
    return canonical_pickle_digest(data)


def close_input(it: Iterator) -> None:
    """Closes an input iterator that can be closed (a generator, a node's iterator)."""
    close = getattr(it, "close", None)
    if close is not None:
        close()


class _ChunkCursor:
    __slots__ = ("chunk", "offset", "items", "base")

    def __init__(self, chunk: int, offset: int):
        self.chunk = chunk      # the chunk ``items`` iterates (or the next one to open)
        self.offset = offset    # where to start in it, when it is opened
        self.items = None       # the open chunk's iterator: a list iterator, or a 1-d array's flatiter
        self.base = 0           # where in the chunk a flatiter's view starts


def _chunk_elements(cursor: _ChunkCursor, make_chunk: Any, count: int) -> Iterator:
    while cursor.chunk < count:
        chunk, offset = make_chunk(cursor.chunk), cursor.offset
        if isinstance(chunk, np.ndarray) and chunk.ndim == 1:
            # A 1-d array's scalars straight from numpy (no list of them): its flatiter says how far it got.
            items = chunk[offset:].flat
            cursor.base = offset
        else:
            items = iter(chunk)
            if offset:
                items.__setstate__(offset)  # a list iterator seeks: restoring reads nothing before
        cursor.offset = 0
        cursor.items = items
        yield from items  # in C: no Python step per element
        cursor.items = None
        cursor.chunk += 1


class ChunkIterator(NodeIterator):
    """The elements of an indexed source, read a chunk (a list, or a 1-d array of scalars) at a time; its
    position is the chunk and the offset in it, read from the chunk's list iterator (``__reduce__``) or the
    array's ``flatiter.index``, so counting costs nothing per element. ``make_chunk(k)`` returns the
    elements of chunk ``k`` of ``count``.

    Example::

        >>> it = ChunkIterator(lambda k: list(range(10 * k, 10 * k + 10)), 3, "numbers")
        >>> [next(it) for _ in range(12)][-1], it.save()
        (11, {'chunk': 1, 'offset': 2})
    """

    __slots__ = ("__next__", "_cursor", "_make_chunk", "_count", "_where")

    def __init__(self, make_chunk: Any, count: int, where: str):
        self._cursor = _ChunkCursor(0, 0)
        self._make_chunk = make_chunk
        self._count = count
        self._where = where
        # The generator refers to the cursor, not to this object: no cycle.
        self.__next__ = _chunk_elements(self._cursor, make_chunk, count).__next__

    def save(self) -> dict:
        cursor = self._cursor
        items = cursor.items
        if items is None:
            return {"chunk": cursor.chunk, "offset": cursor.offset}
        if type(items) is np.flatiter:
            if items.index >= items.base.size:  # exhausted: the chunk is done
                return {"chunk": cursor.chunk + 1, "offset": 0}
            return {"chunk": cursor.chunk, "offset": cursor.base + items.index}
        reduced = items.__reduce__()
        if len(reduced) < 3:  # exhausted: the chunk is done
            return {"chunk": cursor.chunk + 1, "offset": 0}
        return {"chunk": cursor.chunk, "offset": reduced[2]}

    def restore(self, state: Any) -> None:
        chunk = field(state, "chunk", int, self._where)
        offset = field(state, "offset", int, self._where)
        if chunk > self._count or (chunk == self._count and offset):
            raise ValueError(f"the iterator state does not fit {self._where}: it is at chunk {chunk} (offset "
                             f"{offset}) of {self._count}")
        self._cursor.chunk, self._cursor.offset = chunk, offset


class Follows(NodeIterator):
    """The iterator of a node whose position is its input's: one that pulls its input lazily, an element at
    a time, and holds nothing between two of its own elements (map, filter, batch: a batch's elements are
    all read when it is yielded). ``elements`` is the node's own generator over ``input_iterator``; its
    ``__next__`` is bound directly, so following costs no Python step per element.

    Example::

        >>> source = iter(Dataset.range(10))   # any NodeIterator
        >>> doubled = Follows((2 * x for x in source), source, node._input)
    """

    __slots__ = ("__next__", "_elements", "_input", "_input_node")

    def __init__(self, elements: Iterator, input_iterator: Iterator, input_node: Any):
        self._elements = elements
        self._input = input_iterator
        self._input_node = input_node
        self.__next__ = elements.__next__

    def save(self) -> Any:
        return save_input(self._input, self._input_node)

    def restore(self, state: Any) -> None:
        restore_input(self._input, self._input_node, state)

    def close(self) -> None:
        close_input(self._elements)
        close_input(self._input)

