"""``deterministic=True``: a distributed_epoch read's elements in split group order, whichever worker made them.

Workers take split groups dynamically, for balance, and each sends a group's elements in offset order. The
reader receives groups interleaved; ``GroupOrder`` holds back what is ahead of the *head* (the lowest group
not yet delivered in full) and releases it when its turn comes, so the consumer sees group 0's elements,
then group 1's, and so on: the order of the pipeline run locally group after group, the same with one worker
or ten, with a worker killed and its group redone elsewhere, or with the dispatcher restarted.

It is pure bookkeeping (no threads, no I/O): the reader's fetchers call ``add`` under their lock, and put
what it returns on the consumer's queue in order. How far ahead the reader fetches is the reader's
business (``reader.IterationReader``: the head's task is always read, the others within the budget).

Example::

    >>> order = GroupOrder()
    >>> order.add(["b0", "b1"], 16, [(1, 0, 2, 2)])      # group 1 first: held back
    []
    >>> [chunk[0] for chunk in order.add(["a0"], 8, [(0, 0, 1, 1)])]   # group 0 ends: both released
    [['a0'], ['b0', 'b1']]
"""

from __future__ import annotations

import collections
from typing import Optional

from dataservice.client.read_position import ReadPosition, Segment

__all__ = ["GroupOrder"]

#: What ``add`` returns: ``(elements, nbytes, segments)``, the reader's queue item.
Chunk = tuple


class GroupOrder:
    """See the module docstring. ``start``: a restored read's position (groups done are skipped, a group
    taken in part starts after its taken prefix); ``num_groups``: the groups of the epoch (-1 without end)."""

    def __init__(self, start: Optional[ReadPosition] = None, num_groups: int = -1):
        self._start = start if start is not None else ReadPosition()
        self.num_groups = num_groups
        #: The group whose elements are delivered now, and the offset its next element has.
        self.head = self._start.first_open_group()
        self.offset = self._prefix(self.head)
        #: group -> deque of [elements, nbytes, first_offset, total] received ahead of their turn
        self._ahead: dict[int, collections.deque] = {}
        #: Elements held back (not deliverable yet): what the reader's budget counts.
        self.held = 0
        #: Bytes of what was dropped, handed back with the next chunk.
        self._loose_bytes = 0

    def _prefix(self, group: int) -> int:
        taken = self._start.partial.get(group)
        if taken is None:
            return 0
        ranges = taken.ranges
        return ranges[0][1] if ranges and ranges[0][0] == 0 else 0

    @property
    def ended(self) -> bool:
        """Every group of a finite epoch was delivered."""
        return 0 <= self.num_groups <= self.head

    def pending_groups(self) -> list[int]:
        """Groups received in part or whole but not delivered (at the end of a read: what never came)."""
        return sorted(self._ahead)

    def add(self, elements: list, nbytes: int, segments: list[Segment]) -> list[Chunk]:
        """A fetcher received ``elements`` (``nbytes`` on the wire) numbered by ``segments``; returns the
        chunks the consumer may have now, in order. An end-only segment (count 0) carries a group's total."""
        i = 0
        n = max(1, len(elements))
        for group, first, count, total in segments:
            piece = elements[i:i + count]
            # Shares that add up to nbytes exactly: the reader's byte budget gets back what it lent.
            share = nbytes * (i + count) // n - nbytes * i // n
            i += count
            if group < self.head or group in self._start.done:
                self._loose_bytes += share  # delivered already (a group redone elsewhere ends twice)
                continue
            self._ahead.setdefault(group, collections.deque()).append([piece, share, first, total])
            self.held += count
        return self._release()

    def _release(self) -> list[Chunk]:
        out: list[Chunk] = []
        while True:
            queue = self._ahead.get(self.head)
            if not queue:
                return out
            piece, nbytes, first, total = queue[0]
            if first != self.offset:
                # Not the next offset: an element of the head is missing (it comes from the task that took the
                # group over after a worker loss, which produces exactly what no reader got). Wait for it.
                if first > self.offset:
                    return out
                # Offsets before ours were delivered already: drop them (a duplicate never reaches the consumer).
                drop = min(len(piece), self.offset - first)
                piece, first = piece[drop:], first + drop
                self.held -= drop
                if not piece and total < 0:
                    queue.popleft()
                    self._loose_bytes += nbytes
                    continue
            queue.popleft()
            self.held -= len(piece)
            self.offset += len(piece)
            ended = total >= 0 and self.offset >= total
            nbytes, self._loose_bytes = nbytes + self._loose_bytes, 0
            out.append((piece, nbytes, [(self.head, first, len(piece), total if ended else -1)]))
            if ended:
                del self._ahead[self.head]
                self.head = self._start.first_open_group(self.head + 1)
                self.offset = self._prefix(self.head)
            elif not queue:
                del self._ahead[self.head]


class ReaderShare:
    """Elastic readers (``distribute(..., num_readers=N, reader_index=i)``): of the deterministic sequence
    ``S`` a ``GroupOrder`` delivers (every reader receives all of it), reader ``i`` keeps ``S[i], S[i+N], ...``.

    Only whole rounds are kept, as ``DistributedSampler(drop_last=True)``: reader ``i``'s element of round
    ``r`` (``S[rN + i]``) is released once ``S[rN + N - 1]`` exists, and at the end of the sequence an
    element of an incomplete round is dropped, so that every reader gets ``len(S) // N`` elements. It also
    remembers where the groups start in ``S``, to name the position of a step in groups and offsets.

    Example::

        >>> share = ReaderShare(num_readers=2, reader_index=0)
        >>> [chunk[0] for chunk in share.feed([(["s0", "s1", "s2"], 0, [(0, 0, 3, -1)])])]
        [['s0']]
        >>> share.dropped      # s1 is reader 1's; s2 is held until s3 completes its round
        1
    """

    def __init__(self, num_readers: int, reader_index: int):
        self.num_readers = num_readers
        self.reader_index = reader_index
        #: Elements of S seen (the index of the next one).
        self.index = 0
        #: Elements of other readers (and of an incomplete last round) dropped so far: their credits go back.
        self.dropped = 0
        self._held: Optional[tuple] = None  # (element, segment) of ours whose round is not complete yet
        self._bytes = 0  # bytes of what was dropped or held, handed on with the next chunk
        #: Where the groups start in S: [index in S, group, its first offset there], oldest first.
        self._starts: collections.deque = collections.deque()
        self._group: Optional[int] = None

    def feed(self, chunks: list[Chunk]) -> list[Chunk]:
        """The chunks of this reader's elements among ``chunks`` (in order), as the consumer may have them."""
        n, mine = self.num_readers, self.reader_index
        out: list[Chunk] = []
        for elements, nbytes, segments in chunks:
            self._bytes += nbytes
            kept: list = []
            kept_segments: list = []
            i = 0
            for group, first, count, total in segments:
                if group != self._group and count:
                    self._starts.append((self.index, group, first))
                    self._group = group
                for k in range(count):
                    index = self.index
                    self.index += 1
                    held = self._held
                    if held is not None and index >= (held[2] // n + 1) * n - 1:
                        kept.append(held[0])
                        kept_segments.append(held[1])
                        self._held = None
                    if index % n == mine:
                        segment = (group, first + k, 1, -1)
                        if index % n == n - 1:  # the last of its round: complete now
                            kept.append(elements[i + k])
                            kept_segments.append(segment)
                        else:
                            self._held = (elements[i + k], segment, index)
                    else:
                        self.dropped += 1
                i += count
            if kept:
                out.append((kept, self._bytes, kept_segments))
                self._bytes = 0
        return out

    def end(self) -> None:
        """The sequence ended: an element held for an incomplete round is dropped."""
        if self._held is not None:
            self._held = None
            self.dropped += 1

    def group_at(self, index: int) -> Optional[tuple[int, int]]:
        """``(group, offset)`` of element ``index`` of S (the last group started at or before it; None before
        the first), forgetting the starts before it: positions only move forward."""
        starts = self._starts
        while len(starts) > 1 and starts[1][0] <= index:
            starts.popleft()
        if not starts or starts[0][0] > index:
            return None
        start, group, first = starts[0]
        return group, first + index - start
