"""File readers that parse in blocks, and read several files at once.

A reader parses a whole buffer of a file at a time and hands back a *block*
(a list) of elements; the pipeline flattens the blocks with
``itertools.chain``, so handing out one element costs no Python frame. That
is what lets a reader deliver millions of small records per second.

With ``num_parallel_reads`` set, that many files are read at once on
background threads and their elements come out interleaved one at a time,
cycling over the open files in order, as ``tf.data`` does (``interleave``
with ``cycle_length=num_parallel_reads, block_length=1``, deterministic).
Each file is still one split.

An iterator's position (``checkpoint``) is the file it reads and the byte
offset of its next record in that file's (uncompressed) stream. A block knows
the offsets of its first record and of the end of its last; the offset of a
record inside it is worked out only when the position is asked for, from the
block's list iterator's index, so reading costs nothing more. Restoring opens
the file at that offset: an uncompressed file is seeked, nothing before the
offset is read; a compressed one is decompressed from its start and the
bytes before the offset dropped (deflate cannot be entered mid-stream), but
not parsed.

Example::

    >>> class Lines(BlockFileSource):
    ...     _op_name = "Lines"
    ...     def _blocks(self, path, start):
    ...         with open(path, "rb") as f:
    ...             f.seek(start)
    ...             data = f.read()
    ...         yield SizedBlock(data.splitlines(), start, start + len(data), 1)
    >>> list(Lines(["a.txt", "b.txt"], num_parallel_reads=2))
"""

from __future__ import annotations

import collections
import itertools
import os
from typing import Any, Iterator, Optional

from dataservice.data.background import Pump
from dataservice.data.checkpoint import NodeIterator, field
from dataservice.data.options import AUTOTUNE, default_parallelism
from dataservice.data.sources import FileListSource

__all__ = ["BlockFileSource", "Block", "SizedBlock", "check_num_parallel_reads"]

# Blocks a background reader may run ahead of the consumer, per file.
_BLOCKS_AHEAD = 4


def check_num_parallel_reads(num_parallel_reads: Any) -> Optional[int]:
    """None (read files one after the other), AUTOTUNE, or an int >= 1."""
    if num_parallel_reads is None:
        return None
    if not isinstance(num_parallel_reads, int) or isinstance(num_parallel_reads, bool):
        raise TypeError(f"num_parallel_reads must be an int, AUTOTUNE or None, got {num_parallel_reads!r}")
    if num_parallel_reads != AUTOTUNE and num_parallel_reads < 1:
        raise ValueError(f"num_parallel_reads must be >= 1 or AUTOTUNE ({AUTOTUNE}), got {num_parallel_reads}")
    return num_parallel_reads


class Block:
    """The elements parsed from one buffer of a file, with the stream offsets of the first (``start``) and
    of the byte after the last (``end``). ``offset(k)`` is the offset of element ``k`` (``end`` for
    ``k == len(elements)``); subclasses say how to find it between the two.

    Example::

        >>> Block([b"a"], 10, 15).offset(1)
        15
    """

    __slots__ = ("elements", "start", "end")

    def __init__(self, elements: list, start: int, end: int):
        self.elements = elements
        self.start = start
        self.end = end

    def offset(self, k: int) -> int:
        if k <= 0:
            return self.start
        if k >= len(self.elements):
            return self.end
        return self._inside(k)

    def _inside(self, k: int) -> int:  # pragma: no cover - every block type with several elements has one
        raise NotImplementedError


class SizedBlock(Block):
    """Elements stored as themselves plus ``overhead`` bytes each (a TFRecord's 16 bytes of framing, a
    line's newline). The offset of element ``k`` sums the sizes before it, from where the last asked
    offset left off: a position taken every few elements costs a few additions, not a pass over the block.

    Example::

        >>> SizedBlock([b"ab", b"c", b"de"], 0, 8, 1).offset(2)
        5
    """

    __slots__ = ("_overhead", "_at", "_sum")

    def __init__(self, elements: list, start: int, end: int, overhead: int):
        super().__init__(elements, start, end)
        self._overhead = overhead
        self._at = 0   # the element the offset was last asked for ...
        self._sum = 0  # ... and the bytes of the elements before it

    def _inside(self, k: int) -> int:
        if k < self._at:
            self._at = self._sum = 0
        self._sum += sum(map(len, self.elements[self._at:k]))
        self._at = k
        return self.start + self._sum + k * self._overhead


class StrideBlock(Block):
    """Elements of ``stride`` bytes each (fixed-length records)."""

    __slots__ = ("_stride",)

    def __init__(self, elements: list, start: int, end: int, stride: int):
        super().__init__(elements, start, end)
        self._stride = stride

    def _inside(self, k: int) -> int:
        return self.start + k * self._stride


class _Cursor:
    """Where a reader of one file stands: the file, and either the offset to open it at (``items`` None)
    or the block it is in and that block's list iterator, whose index says how many elements were taken."""

    __slots__ = ("file", "offset", "block", "items")

    def __init__(self, file: int, offset: int):
        self.file = file
        self.offset = offset
        self.block: Optional[Block] = None
        self.items: Any = None

    def position(self) -> int:
        items = self.items
        if items is None:
            return self.offset
        reduced = items.__reduce__()
        # (iter, (list,), index); (iter, ((),)) once exhausted
        return self.block.offset(reduced[2] if len(reduced) > 2 else len(self.block.elements))

    def enter(self, block: Block) -> Any:
        self.block = block
        self.items = items = iter(block.elements)
        return items


def _sequential(source: "BlockFileSource", cursor: _Cursor, provider: Optional[Iterator[int]] = None) -> Iterator:
    """The list iterators of the blocks of every file from the cursor's on; ``chain`` flattens them. With a
    ``provider`` (distributed_epoch on a worker), of the files it hands out, ``cursor.file`` counting those
    passed; splits come one at a time from it: taking several ahead would starve other workers."""
    files = source._filenames
    if provider is None:
        indices = iter(range(cursor.file, len(files)))
    else:
        for _ in range(cursor.file):  # a restored position: the files read before it
            if next(provider, None) is None:
                raise ValueError(f"the iterator state does not fit {source._describe()}: it passed {cursor.file} "
                                 f"of the files handed out, and fewer were")
        indices = (index % len(files) for index in provider)
    for index in indices:
        start, cursor.offset = cursor.offset, 0
        for block in source._blocks(files[index], start):
            yield cursor.enter(block)
        cursor.block = cursor.items = None
        cursor.file += 1


class _SequentialReader(NodeIterator):
    """The files read one after the other, or (``provider``) those a split provider hands out. State:
    ``{"file": index (of files handed out: how many were passed), "offset": byte offset of the next record
    in it}``."""

    __slots__ = ("__next__", "_source", "_cursor", "_blocks", "_provided")

    def __init__(self, source: "BlockFileSource", provider: Optional[Iterator[int]] = None):
        self._source = source
        self._cursor = _Cursor(0, 0)
        self._provided = provider is not None
        # The generator refers to the cursor, not to this object: dropping the iterator closes the file.
        self._blocks = _sequential(source, self._cursor, provider)
        self.__next__ = itertools.chain.from_iterable(self._blocks).__next__

    def save(self) -> dict:
        return {"file": self._cursor.file, "offset": self._cursor.position()}

    def restore(self, state: Any) -> None:
        where = self._source._describe()
        if self._provided:  # which file the count names, only the provider knows
            file, offset = field(state, "file", int, where), field(state, "offset", int, where)
        else:
            file, offset = self._source._checked_position(state, where)
        self._cursor.file, self._cursor.offset = file, offset

    def close(self) -> None:
        self._blocks.close()


class _Slot:
    """An open file of the parallel reads: its cursor, and its elements from a background reader."""

    __slots__ = ("cursor", "drain", "elements")

    def __init__(self, cursor: _Cursor, pump: Pump):
        self.cursor = cursor
        self.drain = _drain(pump, cursor)
        self.elements = itertools.chain.from_iterable(self.drain)


def _drain(pump: Pump, cursor: _Cursor) -> Iterator:
    try:
        while True:
            block = pump.get()
            if block is Pump.END:
                return
            yield cursor.enter(block)
    finally:
        pump.close()


class _Interleaving:
    """The parallel reads' position, shared by their generator and their iterator: the slots' files and
    offsets (None: an empty slot), the slot to visit next, and the next file to open."""

    __slots__ = ("cycle", "slots", "next_slot", "next_file")

    def __init__(self, cycle: int):
        self.cycle = cycle
        self.slots: list = [None] * cycle  # a _Slot once reading, or a restored (file, offset)
        self.next_slot = 0
        self.next_file = 0


def _interleaved(source: "BlockFileSource", at: _Interleaving) -> Iterator:
    files = source._filenames
    cycle = at.cycle
    slots = at.slots
    started = at.next_file  # the next file whose reader to start
    # Readers for the next files start before their slot opens, so a slot that finishes a file finds the
    # next one already read ahead.
    ahead: collections.deque = collections.deque()

    def reader(file: int, offset: int) -> Pump:
        return Pump(source._blocks(files[file], offset), capacity=_BLOCKS_AHEAD,
                    name=f"dataservice-read-{files[file]}")

    def start_next() -> None:
        nonlocal started
        if started < len(files):
            ahead.append(reader(started, 0))
            started += 1

    for i, restored in enumerate(slots):
        if restored is not None:
            file, offset = restored
            slots[i] = _Slot(_Cursor(file, offset), reader(file, offset))
    for _ in range(cycle):
        start_next()
    try:
        i = at.next_slot
        open_slots = sum(slot is not None for slot in slots)
        while True:
            following = i + 1 if i + 1 < cycle else 0
            slot = slots[i]
            if slot is None and ahead:
                slot = slots[i] = _Slot(_Cursor(at.next_file, 0), ahead.popleft())
                at.next_file += 1
                open_slots += 1
                start_next()
            if slot is not None:
                for element in slot.elements:
                    at.next_slot = following  # the position after this element
                    yield element
                    break
                else:
                    slots[i] = None
                    slot.drain.close()
                    open_slots -= 1
            if not open_slots and not ahead:
                return
            i = following
    finally:
        for pump in ahead:
            pump.close()
        for slot in slots:
            if isinstance(slot, _Slot):
                slot.drain.close()


class _InterleavedReader(NodeIterator):
    """``num_parallel_reads`` files at once, one element of each in turn. State: ``{"slots": [[file,
    offset] or null, ...], "next_slot": the slot whose element comes next, "next_file": the next file to
    open}``; the files read ahead are not in it (their readers start again on restore). Restoring seeks
    each open file as ``_SequentialReader`` does. Under AUTOTUNE the number of slots is the saved one,
    whatever this machine's core count: the order of the elements depends on it."""

    __slots__ = ("__next__", "_source", "_at", "_elements", "_autotuned")

    def __init__(self, source: "BlockFileSource", cycle: int, autotuned: bool):
        self._source = source
        self._autotuned = autotuned
        self._at = _Interleaving(cycle)
        self._elements = _interleaved(source, self._at)
        self.__next__ = self._elements.__next__

    def save(self) -> dict:
        at = self._at
        slots = []
        for slot in at.slots:
            if slot is None:
                slots.append(None)
            elif isinstance(slot, _Slot):
                slots.append([slot.cursor.file, slot.cursor.position()])
            else:  # restored, not read yet
                slots.append(list(slot))
        return {"slots": slots, "next_slot": at.next_slot, "next_file": at.next_file}

    def restore(self, state: Any) -> None:
        source = self._source
        where = source._describe()
        slots = field(state, "slots", list, where)
        next_slot = field(state, "next_slot", int, where)
        next_file = field(state, "next_file", int, where)
        cycle = self._at.cycle
        if len(slots) != cycle:
            if not self._autotuned or not slots:
                raise ValueError(f"malformed iterator state for {where}: 'slots' holds {len(slots)} files, but it "
                                 f"reads {cycle} at once (num_parallel_reads)")
            cycle = len(slots)
        if next_slot >= cycle:
            raise ValueError(f"malformed iterator state for {where}: 'next_slot' must be < {cycle}, got {next_slot}")
        if next_file > len(source._filenames):
            raise ValueError(f"malformed iterator state for {where}: 'next_file' must be <= "
                             f"{len(source._filenames)} (the number of files), got {next_file}")
        restored = []
        for i, slot in enumerate(slots):
            if slot is None:
                restored.append(None)
                continue
            if not (isinstance(slot, list) and len(slot) == 2):
                raise ValueError(f"malformed iterator state for {where}: 'slots'[{i}] must be [file, offset] or "
                                 f"null, got {slot!r:.80}")
            file, offset = source._checked_position({"file": slot[0], "offset": slot[1]}, where)
            if file >= next_file:
                raise ValueError(f"malformed iterator state for {where}: 'slots'[{i}] reads file {file}, not one "
                                 f"opened before 'next_file' {next_file}")
            restored.append((file, offset))
        # The generator has not started: it reads these when it does.
        at = self._at
        at.cycle, at.slots, at.next_slot, at.next_file = cycle, restored, next_slot, next_file

    def close(self) -> None:
        self._elements.close()


class BlockFileSource(FileListSource):
    """A FileListSource whose subclasses implement ``_blocks(path, start)``: the file's elements from
    stream offset ``start`` (0, or an offset a ``Block`` gave) as ``Block``s. ``_check_offset`` may refuse
    an offset that cannot be a record's."""

    def __init__(self, filenames: Any, num_parallel_reads: Optional[int] = None):
        super().__init__(filenames)
        self._num_parallel_reads = check_num_parallel_reads(num_parallel_reads)

    def _blocks(self, path: str, start: int) -> Iterator[Block]:
        raise NotImplementedError

    def _read_blocks(self, path: str) -> Iterator[list]:
        return (block.elements for block in self._blocks(path, 0))

    def _read_file(self, path: str) -> Iterator:
        return itertools.chain.from_iterable(self._read_blocks(path))

    def _read_all(self) -> Iterator:
        if self._num_parallel_reads is None:
            return _SequentialReader(self)
        autotuned = self._num_parallel_reads == AUTOTUNE
        cycle = default_parallelism() if autotuned else self._num_parallel_reads
        return _InterleavedReader(self, cycle, autotuned)

    def _read_provided(self, provider: Iterator[int]) -> Iterator:
        return _SequentialReader(self, provider)

    def _check_offset(self, path: str, offset: int, where: str) -> None:
        """Refuses (ValueError naming 'offset') an offset no record of ``path`` can start at."""

    def _compressed(self) -> bool:
        return bool(getattr(self, "_compression_type", ""))

    def _checked_position(self, state: Any, where: str) -> tuple[int, int]:
        """A saved ``{"file", "offset"}``, checked against the files: ValueError naming the field."""
        file = field(state, "file", int, where)
        offset = field(state, "offset", int, where)
        n = len(self._filenames)
        if file > n or (file == n and offset):
            raise ValueError(f"malformed iterator state for {where}: 'file' must be < {n} (the number of files), "
                             f"got {file} (offset {offset})")
        if offset:
            path = self._filenames[file]
            if not self._compressed():  # a compressed stream's length is known only once decompressed
                try:
                    size = os.path.getsize(path)
                except OSError:
                    size = None  # opening it will say what is wrong, naming it
                if size is not None and offset > size:
                    raise ValueError(f"malformed iterator state for {where}: 'offset' {offset} is beyond the end "
                                     f"of {path} ({size} bytes)")
            self._check_offset(path, offset, where)
        return file, offset
