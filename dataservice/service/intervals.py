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

__all__ = ["OffsetSet"]


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
        """From ``[start0, end0, start1, end1, ...]`` (the protobuf form)."""
        values = list(flat)
        return cls(zip(values[0::2], values[1::2]))

    def flat(self) -> list[int]:
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
        if len(other._starts) == 1:
            self.add(other._starts[0], other._ends[0])  # the common case: no sort
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
