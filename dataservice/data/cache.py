"""``Dataset.cache``: in memory, or in a file that persists across runs.

The first complete pass fills the cache; later passes (later epochs, or later
runs for a file cache) read it and skip the input entirely. A pass that stops
early leaves no cache behind, so a cache is never partial. The file cache is
written to ``<filename>.data`` through a temporary file renamed on completion,
so a crash mid-pass leaves nothing that a later run would trust (a temporary
file that an iterator state refers to is kept: see below).

Example::

    >>> ds = Dataset.range(5).map(expensive).cache("/tmp/features")
    >>> list(ds)  # runs expensive() and writes /tmp/features.data
    >>> list(ds)  # reads the file; a new process does too

Iterator state (``it.state_dict()``): positions, never the cached elements.

- In memory, a pass reading the input (the first, which fills the cache) saves the input's position and
  its position at the pass's start: ``{"from": "input", "start": ..., "input": ...}``. A restore reads on
  from the input, without filling (the elements before the cut are not in the new process's memory); the
  next pass then fills the cache from the saved start, so it yields what the first pass yielded even for
  a random input. This costs one more pass over the input after such a restore, where tf.data writes the
  partial cache into its checkpoint instead: the state stays a few positions, whatever the cache holds.
- In memory, a later pass (reading the complete cache) saves its index and a position of the input near
  it: ``{"from": "memory", "index": i, "start": ..., "mark": ..., "skip": n}``. The filling pass records
  the input's state every ``MARK_EVERY`` elements (less often when that state is costly to save:
  ``background.Pace`` keeps it under 2% of the reading), kept beside the cache. Restored where the cache
  is in memory, it reads the memory at the index; in a new process, whose memory is empty, it restores
  the input at the mark before the index and reads the ``skip`` elements between them again (a bounded
  replay, not the pass's head), then reads on from the input; the next pass fills the cache from the
  first pass's start.
- In a file, a later pass saves its byte offset in ``<filename>.data`` (and the file's size, to refuse a
  changed file); a restore seeks there.
- In a file, a pass writing the cache saves the input's position and how many bytes of its temporary file
  hold the elements before the cut; taking the state flushes the file and keeps it when the iterator is
  closed unfinished (the state refers to it). A restore copies those bytes into a temporary file of its
  own and writes on, so the cache file is completed by the restored pass. If the cache file was completed
  meanwhile, or the temporary file is gone, the restored pass reads on from the input without writing.
"""

from __future__ import annotations

import itertools
import os
import pickle
import shutil
import threading
from bisect import bisect_right
from itertools import islice
from time import perf_counter
from typing import Any, Iterator, Optional

from dataservice.data.checkpoint import (
    Pace,
    NodeIterator,
    close_input,
    field,
    restore_input,
    save_input,
    skip_elements,
)
from dataservice.data.dataset import Dataset, IteratorContext
from dataservice.data.transformations import _UnaryDataset
from dataservice.data.transformations.common import check_rewindable, elements_of, not_replayed, replays
from dataservice.errors import NotCheckpointableError

__all__ = ["CacheDataset", "MARK_EVERY"]

_writer_ids = itertools.count()

#: The filling pass of a memory cache records its input's position every this many elements (less often
#: when the input's state is costly to save: ``background.Pace``): a later pass restored in a new process
#: reads again the elements between the last mark and its index.
MARK_EVERY = 64

_STATE = (dict, list, int, str, float, bool, type(None))


class CacheDataset(_UnaryDataset):
    _op_name = "Dataset.cache"

    def __init__(self, input_dataset: Dataset, filename: str = ""):
        super().__init__(input_dataset)
        if not isinstance(filename, (str, os.PathLike)):
            raise TypeError(f"filename must be a str path, got {filename!r}")
        self._filename = os.fspath(filename)
        self._memory: Optional[list] = None
        # Beside the memory cache, its marks: (index, the input's state before that element), one every
        # MARK_EVERY elements or so (None: its input cannot save its position). And the position the next
        # filling pass starts from, after a restored pass that read the input without filling.
        self._marks: Optional[list] = None
        self._refill: Any = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        # An in-memory cache belongs to one process; pickle the pipeline, not its data.
        state = self.__dict__.copy()
        state["_memory"] = None
        state["_marks"] = None
        state["_refill"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_marks", None)
        self.__dict__.setdefault("_refill", None)
        self._lock = threading.Lock()

    @property
    def data_path(self) -> str:
        return self._filename + ".data"

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        if ctx.split_provider is not None:
            # Under a split provider each pass reads different splits: nothing to reuse.
            return self._input._iterator(ctx)
        if not self._filename:
            return _MemoryCacheIterator(self, ctx)
        return _FileCacheIterator(self, ctx)

    # --- in memory ---------------------------------------------------------------------------
    def _memory_pass(self, cursor: "_MemoryPass") -> Iterator:
        """One pass of a memory cache: over the complete cache, or over the input (filling the cache,
        unless the pass was restored mid-way: the elements before the cut are not here)."""
        memory = cursor.memory
        if memory is not None:
            items = cursor.items = iter(memory)
            if cursor.index:
                items.__setstate__(cursor.index)
            yield from items
            return
        it, node = cursor.input, self._input
        if cursor.start is not None and not cursor.restored:  # the pass after a restored one: refill exactly
            restore_input(it, node, cursor.start)
        filled = cursor.filled
        if filled is None:
            yield from elements_of(it)
            with self._lock:
                if self._memory is None:
                    self._refill = cursor.start
            return
        append = filled.append
        marks = cursor.marks
        pace = Pace(MARK_EVERY)
        source = elements_of(it)
        while True:
            held = len(filled)
            if marks is not None:
                began = perf_counter()
                try:
                    marks.append((held, save_input(it, node)))
                except NotCheckpointableError:
                    marks = cursor.marks = None  # save() raises it, naming the input, if ever asked
                else:
                    pace.recorded(held, began, perf_counter())
            count = pace.next - held if marks is not None else MARK_EVERY
            # islice pulls lazily, an element per element taken: nothing is read ahead, and nothing is
            # counted in Python per element.
            for x in islice(source, count):
                append(x)
                yield x
            if len(filled) - held < count:
                break
        with self._lock:
            self._memory = filled
            self._marks = marks

    # --- in a file ---------------------------------------------------------------------------
    def _file_pass(self, cursor: "_FilePass") -> Iterator:
        """One pass of a file cache: reading the file, writing it, or (restored) reading the input on. One
        generator (its ``__next__`` is the iterator's), with no generator nested in it per element."""
        if cursor.mode == "input":
            yield from elements_of(cursor.input)
            return
        if cursor.mode == "read":
            with open(self.data_path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if cursor.size is not None and cursor.size != size:
                    raise ValueError(f"the iterator state does not fit {self._describe()}: it was taken reading "
                                     f"{self.data_path!r} of {cursor.size} bytes, which now has {size}; was the "
                                     "cache file written again?")
                cursor.size = size
                if cursor.offset:
                    f.seek(cursor.offset)
                cursor.file = f
                unpickler = pickle.Unpickler(f)
                try:
                    while True:
                        try:
                            yield unpickler.load()
                        except EOFError:
                            return
                finally:
                    cursor.offset = f.tell()
                    cursor.file = None
        tmp = self._temporary_file()
        complete = False
        resumed = cursor.resume
        try:
            if resumed is not None:  # a restored pass: the elements before the cut, as they were written
                shutil.copyfile(resumed[0], tmp)
                os.truncate(tmp, resumed[1])
            with open(tmp, "ab") as f:
                cursor.tmp, cursor.file, cursor.resume = tmp, f, None
                pickler = pickle.Pickler(f, protocol=pickle.HIGHEST_PROTOCOL)
                for x in elements_of(cursor.input):
                    pickler.dump(x)
                    pickler.clear_memo()
                    yield x
                cursor.file = None
            try:
                os.replace(tmp, self.data_path)
            except FileNotFoundError:
                # A pass restored from a state of this one completed the cache from this file, and removed
                # it: the cache holds these elements already.
                if not os.path.exists(self.data_path):
                    raise
            complete = True
            if resumed is not None:  # the restored state's file: its elements are in the cache now
                _unlink(resumed[0])
        finally:
            cursor.file = None
            if not complete and not cursor.kept:
                _unlink(tmp)

    def _temporary_file(self) -> str:
        directory = os.path.dirname(self.data_path) or "."
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"Dataset.cache: directory {directory!r} of {self._filename!r} does not exist")
        # One temporary file per writer: two passes running at once in the same
        # thread (zip(ds, ds)) must not write into the same file.
        return f"{self.data_path}.tmp-{os.getpid()}-{threading.get_ident()}-{next(_writer_ids)}"


def _index(mark: tuple) -> int:
    return mark[0]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _MemoryPass:
    """A memory cache's pass: over the cache (``memory``, its input's ``marks``; ``items`` the list's
    iterator once reading, or the ``index`` to start at), or over the input (``input``; the elements it
    cached, ``filled``, None when it does not fill; its marks, (index, the input's state before it), None
    when the input cannot save; the input's position at the pass's start, None while unknown)."""

    __slots__ = ("memory", "marks", "items", "index", "input", "filled", "start", "restored")

    def __init__(self) -> None:
        self.memory: Optional[list] = None
        self.marks: Optional[list] = []
        self.items: Optional[Iterator] = None
        self.index = 0
        self.input: Optional[Iterator] = None
        self.filled: Optional[list] = []
        self.start: Any = None
        self.restored = False


class _MemoryCacheIterator(NodeIterator):
    """``cache()``'s iterator (see the module's docstring for its state). Which pass it is (over the
    memory or the input) is known when it is made, and changed by ``restore``; its generator looks at the
    first element.

    Example::

        >>> ds = Dataset.range(100).cache()
        >>> _ = list(ds); it = iter(ds); _ = next(it)
        >>> it.state_dict()["position"]["from"], it.state_dict()["position"]["index"]
        ('memory', 1)
    """

    __slots__ = ("__next__", "_node", "_ctx", "_pass", "_elements", "_rewound")

    def __init__(self, node: CacheDataset, ctx: IteratorContext):
        self._node = node
        self._ctx = ctx
        cursor = self._pass = _MemoryPass()
        with node._lock:
            if node._memory is not None:
                cursor.memory, cursor.marks = node._memory, node._marks
            else:
                cursor.start, node._refill = node._refill, None
        self._rewound = ctx.rewound()
        if cursor.memory is None:
            cursor.input = node._input._iterator(self._rewound)
        # The generator refers to the cursor, not to this object: no cycle.
        self._elements = node._memory_pass(cursor)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        node, cursor = self._node, self._pass
        check_rewindable(self._rewound, node)
        if cursor.memory is not None and not replays(node._input, self._ctx):
            # Restored in a new process, a pass over the memory reads the input again from a recorded position.
            raise NotCheckpointableError(f"{node._describe()} cannot be checkpointed after its first pass: "
                                         f"{not_replayed(node._input)}")
        if cursor.memory is not None:
            if cursor.items is None:
                index = cursor.index
            else:
                reduced = cursor.items.__reduce__()
                index = reduced[2] if len(reduced) > 2 else len(cursor.memory)
            marks = cursor.marks
            if marks is None:
                raise NotCheckpointableError(
                    f"{node._describe()} cannot be checkpointed in a pass over its memory cache: its input "
                    f"({node._input._describe()}) cannot save its position, which a restore in a new process "
                    "needs to read on where the cache stood")
            at, mark = marks[bisect_right(marks, index, key=_index) - 1]
            return {"from": "memory", "index": index, "start": marks[0][1], "mark": mark, "skip": index - at}
        position = save_input(cursor.input, node._input)
        start = cursor.start
        if start is None:
            start = cursor.marks[0][1] if cursor.marks else position
        return {"from": "input", "start": start, "input": position}

    def restore(self, state: Any) -> None:
        node, cursor = self._node, self._pass
        where = node._describe()
        kind = field(state, "from", str, where)
        start = field(state, "start", _STATE, where)
        if kind not in ("memory", "input"):
            raise ValueError(f"malformed iterator state for {where}: 'from' must be 'memory' or 'input', got "
                             f"{kind!r}")
        if cursor.memory is None and cursor.start is not None and not cursor.restored:
            with node._lock:  # the refill this iterator took: left to the next pass
                node._refill = cursor.start
        if kind == "memory":
            index = field(state, "index", int, where)
            mark = field(state, "mark", _STATE, where)
            skip = field(state, "skip", int, where)
            with node._lock:
                memory, marks = node._memory, node._marks
            if memory is not None:  # the cache is here: read it on
                if index > len(memory):
                    raise ValueError(f"the iterator state does not fit {where}: it is at element {index} of a "
                                     f"cache of {len(memory)}")
                if cursor.input is not None:
                    close_input(cursor.input)
                    cursor.input = None
                cursor.memory, cursor.marks, cursor.index = memory, marks, index
                return
            self._read_input_on(start, mark)
            skip_elements(cursor.input, skip, where)
        else:
            self._read_input_on(start, field(state, "input", _STATE, where))

    def _read_input_on(self, start: Any, position: Any) -> None:
        """This pass reads the input on from ``position`` without filling the cache (its head is not here);
        the next one fills it from ``start``."""
        cursor = self._pass
        if cursor.input is None:
            cursor.input = self._node._input._iterator(self._ctx)
        cursor.memory = cursor.filled = cursor.marks = None
        cursor.start, cursor.restored = start, True
        restore_input(cursor.input, self._node._input, position)

    def close(self) -> None:
        close_input(self._elements)
        if self._pass.input is not None:
            close_input(self._pass.input)


# --- in a file ------------------------------------------------------------------------------------------

class _FilePass:
    """A file cache's pass: ``mode`` "read" (the file: ``file`` open while reading, the ``offset`` to start
    at, the file's ``size``), "write" (the ``input``, the temporary file ``tmp``, open as ``file`` while
    writing; ``kept`` once a state refers to it; ``resume``: a state's temporary file and its length to
    start from), or "input" (a restored pass reading the input on, writing nothing)."""

    __slots__ = ("mode", "input", "file", "offset", "size", "tmp", "kept", "resume")

    def __init__(self, mode: str):
        self.mode = mode
        self.input: Optional[Iterator] = None
        self.file: Any = None
        self.offset = 0
        self.size: Optional[int] = None
        self.tmp: Optional[str] = None
        self.kept = False
        self.resume: Optional[tuple[str, int]] = None


class _FileCacheIterator(NodeIterator):
    """``cache(filename)``'s iterator (see the module's docstring for its state).

    Example::

        >>> it = iter(Dataset.range(10).cache("/tmp/c"))   # /tmp/c.data written by an earlier pass
        >>> _ = next(it); it.state_dict()["position"]
        {'file': 'read', 'offset': 117, 'size': 1170}
    """

    __slots__ = ("__next__", "_node", "_ctx", "_pass", "_elements")

    def __init__(self, node: CacheDataset, ctx: IteratorContext):
        self._node = node
        self._ctx = ctx
        cursor = self._pass = _FilePass("read" if os.path.exists(node.data_path) else "write")
        if cursor.mode == "write":
            cursor.input = node._input._iterator(ctx)
        self._elements = node._file_pass(cursor)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        node, cursor = self._node, self._pass
        if cursor.mode == "read":
            offset = cursor.file.tell() if cursor.file is not None else cursor.offset
            size = cursor.size if cursor.size is not None else os.path.getsize(node.data_path)
            return {"file": "read", "offset": offset, "size": size}
        position = save_input(cursor.input, node._input)
        if cursor.mode == "input":
            return {"file": "input", "input": position}
        if cursor.resume is not None:  # restored, not started: the state it was restored from
            return {"file": "write", "partial": os.path.basename(cursor.resume[0]), "length": cursor.resume[1],
                    "input": position}
        if cursor.file is None:
            if cursor.tmp is None:  # nothing written yet
                return {"file": "write", "partial": None, "length": 0, "input": position}
            return {"file": "input", "input": position}  # the pass is over (the file complete, or failed)
        cursor.file.flush()
        cursor.kept = True
        return {"file": "write", "partial": os.path.basename(cursor.tmp), "length": cursor.file.tell(),
                "input": position}

    def restore(self, state: Any) -> None:
        node, cursor = self._node, self._pass
        where = node._describe()
        kind = field(state, "file", str, where)
        if kind == "read":
            offset = field(state, "offset", int, where)
            size = field(state, "size", int, where)
            if offset > size:
                raise ValueError(f"malformed iterator state for {where}: offset {offset} is past the file's "
                                 f"{size} bytes")
            if not os.path.exists(node.data_path):
                raise ValueError(f"the iterator state does not fit {where}: it was taken reading the cache file "
                                 f"{node.data_path!r}, which is gone")
            if os.path.getsize(node.data_path) != size:
                raise ValueError(f"the iterator state does not fit {where}: it was taken reading the cache file "
                                 f"{node.data_path!r} of {size} bytes, which now has "
                                 f"{os.path.getsize(node.data_path)}; was it written again?")
            if cursor.input is not None:
                close_input(cursor.input)
                cursor.input = None
            cursor.mode, cursor.offset, cursor.size = "read", offset, size
            return
        if kind not in ("write", "input"):
            raise ValueError(f"malformed iterator state for {where}: 'file' must be 'read', 'write' or 'input', "
                             f"got {kind!r}")
        position = field(state, "input", _STATE, where)
        partial = field(state, "partial", (str, type(None)), where, default=None)
        length = field(state, "length", int, where, default=0)
        prefix = os.path.basename(node.data_path) + ".tmp-"
        if partial is not None and (os.sep in partial or not partial.startswith(prefix)):
            raise ValueError(f"malformed iterator state for {where}: {partial!r} is not a temporary file of "
                             "this cache")
        if cursor.input is None:  # it would have read the file: the state is of a pass that wrote it
            cursor.input = node._input._iterator(self._ctx)
        restore_input(cursor.input, node._input, position)
        source = None if partial is None else os.path.join(os.path.dirname(node.data_path), partial)
        if kind == "write" and not os.path.exists(node.data_path) and (
                length == 0 or (os.path.exists(source) and os.path.getsize(source) >= length)):
            cursor.mode = "write"
            cursor.resume = (source, length) if length else None
        else:
            # The cache file was completed meanwhile (or the elements before the cut are gone): this pass
            # reads on from the input, and writes nothing.
            cursor.mode = "input"

    def close(self) -> None:
        close_input(self._elements)
        if self._pass.input is not None:
            close_input(self._pass.input)
