"""Sets of element offsets as sorted, disjoint half-open ranges.

The delivery protocol numbers every element by (stream, split, offset); clients
report which offsets they hold, and a reassigned split skips them. Offsets come
in long runs, so a set is almost always one or two ranges — but a heartbeat may
carry many, in any order: building a set from many ranges, or merging two sets,
sorts once and merges in one pass (O(n log n), linear for sorted or reversed
input), never one insertion per range.

Example::

    >>> s = OffsetSet()
    >>> s.add(0, 10); s.add(20, 25); s.add(10, 20)
    >>> s.ranges, 15 in s, s.covers(25)
    ([(0, 25)], True, True)
"""

from __future__ import annotations

import bisect
from typing import Iterable, Iterator

import numpy as np

__all__ = ["OffsetSet"]

#: From this many ranges on, sets are built and merged with numpy.
_VECTOR_RANGES = 1024
#: At most this many ranges are added to a set one at a time (bisection) rather than merged in one pass.
_FEW_RANGES = 16


def _union(pairs: "np.ndarray") -> tuple[list[int], list[int]]:
    """The union of ``[start, end)`` rows, as sorted disjoint starts and ends (touching ranges merged)."""
    pairs = pairs[pairs[:, 1] > pairs[:, 0]]
    if not len(pairs):
        return [], []
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    starts, ends = pairs[:, 0], np.maximum.accumulate(pairs[:, 1])
    # A range opens a new run where it starts after every range before it has ended.
    opens = np.concatenate(([True], starts[1:] > ends[:-1]))
    first = np.flatnonzero(opens)
    last = np.concatenate((first[1:] - 1, [len(pairs) - 1]))
    return starts[first].tolist(), ends[last].tolist()


class OffsetSet:
    __slots__ = ("_starts", "_ends")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()):
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._merge(ranges)

    def _merge(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Replaces the set with its union with ``ranges``: one sort, one pass."""
        pairs = sorted([r for r in ranges if r[1] > r[0]] + list(zip(self._starts, self._ends)))
        starts: list[int] = []
        ends: list[int] = []
        for start, end in pairs:
            if ends and start <= ends[-1]:
                if end > ends[-1]:
                    ends[-1] = end
            else:
                starts.append(start)
                ends.append(end)
        self._starts, self._ends = starts, ends

    @classmethod
    def from_flat(cls, flat: Iterable[int]) -> "OffsetSet":
        """From ``[start0, end0, start1, end1, ...]`` (the protobuf form). Many ranges are merged with numpy:
        a heartbeat of 800,000 ranges takes milliseconds, not the half second of a loop over them."""
        values = list(flat)
        if len(values) >= 2 * _VECTOR_RANGES:
            result = cls()
            result._starts, result._ends = _union(np.asarray(values, dtype=np.int64).reshape(-1, 2))
            return result
        return cls(zip(values[0::2], values[1::2]))

    def flat(self) -> list[int]:
        if len(self._starts) >= _VECTOR_RANGES:
            return np.column_stack((self._starts, self._ends)).ravel().tolist()
        out: list[int] = []
        for start, end in zip(self._starts, self._ends):
            out += (start, end)
        return out

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends))

    def add(self, start: int, end: int) -> None:
        """Adds ``[start, end)``, merging with touching ranges."""
        if end <= start:
            return
        i = bisect.bisect_left(self._ends, start)  # first range that ends at or after start
        j = bisect.bisect_right(self._starts, end)  # ranges before j start at or before end
        if i < j:
            start = min(start, self._starts[i])
            end = max(end, self._ends[j - 1])
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def update(self, other: "OffsetSet") -> None:
        """Adds every range of ``other``."""
        if len(other._starts) <= _FEW_RANGES:
            # The common case, a heartbeat's few ranges: each placed by bisection, not a sort of the whole set
            # (which a set made ragged by thousands of readers' interleaved offsets would cost every time).
            for start, end in zip(other._starts, other._ends):
                self.add(start, end)
        elif not self._starts:
            self._starts, self._ends = other._starts[:], other._ends[:]
        elif other._starts and other._starts[0] > self._ends[-1]:
            self._starts.extend(other._starts)  # entirely after (offsets reported in order): appended
            self._ends.extend(other._ends)
        elif len(self._starts) + len(other._starts) >= _VECTOR_RANGES:
            pairs = np.concatenate((np.column_stack((self._starts, self._ends)),
                                    np.column_stack((other._starts, other._ends)))).astype(np.int64)
            self._starts, self._ends = _union(pairs)
        elif other._starts:
            self._merge(zip(other._starts, other._ends))

    def intersection(self, other: "OffsetSet") -> "OffsetSet":
        """The offsets in both sets (one pass over both).

        Example::

            >>> OffsetSet([(0, 10)]).intersection(OffsetSet([(5, 20)])).ranges
            [(5, 10)]
        """
        out: list[tuple[int, int]] = []
        i = j = 0
        while i < len(self._starts) and j < len(other._starts):
            start = max(self._starts[i], other._starts[j])
            end = min(self._ends[i], other._ends[j])
            if start < end:
                out.append((start, end))
            if self._ends[i] < other._ends[j]:
                i += 1
            else:
                j += 1
        result = OffsetSet()
        result._starts = [s for s, _ in out]
        result._ends = [e for _, e in out]
        return result

    def difference(self, other: "OffsetSet") -> "OffsetSet":
        """The offsets in this set and not in ``other`` (one pass over both).

        Example::

            >>> OffsetSet([(0, 10)]).difference(OffsetSet([(2, 4), (8, 20)])).ranges
            [(0, 2), (4, 8)]
        """
        out_starts: list[int] = []
        out_ends: list[int] = []
        j = 0
        other_starts, other_ends = other._starts, other._ends
        for start, end in zip(self._starts, self._ends):
            while j < len(other_starts) and other_ends[j] <= start:
                j += 1
            k = j
            pos = start
            while k < len(other_starts) and other_starts[k] < end:
                if other_starts[k] > pos:
                    out_starts.append(pos)
                    out_ends.append(other_starts[k])
                pos = max(pos, other_ends[k])
                k += 1
            if pos < end:
                out_starts.append(pos)
                out_ends.append(end)
        result = OffsetSet()
        result._starts, result._ends = out_starts, out_ends
        return result

    def copy(self) -> "OffsetSet":
        """A copy (two list copies: cheap enough to take under a lock)."""
        result = OffsetSet()
        result._starts, result._ends = self._starts[:], self._ends[:]
        return result

    def __contains__(self, offset: int) -> bool:
        i = bisect.bisect_right(self._starts, offset) - 1
        return i >= 0 and offset < self._ends[i]

    def missing(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The sub-ranges of ``[start, end)`` not in the set."""
        pos = start
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        while pos < end and i < len(self._starts):
            s, e = self._starts[i], self._ends[i]
            if e <= pos:
                i += 1
                continue
            if s >= end:
                break
            if s > pos:
                yield pos, s
            pos = max(pos, e)
            i += 1
        if pos < end:
            yield pos, end

    def covers(self, total: int) -> bool:
        """Whether the set holds every offset in ``[0, total)``."""
        return total == 0 or (len(self._starts) >= 1 and self._starts[0] == 0 and self._ends[0] >= total)

    def __len__(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetSet) and self.ranges == other.ranges

    def __repr__(self) -> str:
        return f"OffsetSet({self.ranges})"
