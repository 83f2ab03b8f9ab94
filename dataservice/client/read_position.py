"""Where the consumer of a distributed_epoch read stands: what ``state_dict()`` saves of a read from the service.

The service numbers every element by (split group, offset in the group's output). The consumer's position is
what it *took*, not what the reader received or buffered: the groups every element of which it took, and of
the other groups the offsets it took. Received but untaken elements are not in it, so a restored read
produces them again, and nothing is lost with the reader's buffers or a prefetch.

With ``deterministic=True`` the consumer takes groups in index order, so the position is one range of done
groups and one offset into the next: a few dozen bytes whatever the dataset's size. In the dynamic order it
holds a range set per group taken in part; it stays small while groups complete roughly in order, and
grows with the groups in progress at once (about the workers' count times the groups each reads ahead).

The state (JSON)::

    {"done": [0, 41], "partial": [[41, [0, 17]]], "seeks": []}    # groups 0-40 taken, group 41's offsets 0-16

Its keys are the same at every position (groups are in lists, not keys), so a checkpointer that fills in
the keys a fresh iterator's state has (``torch.distributed.checkpoint``'s ``load``) keeps all of it.

A restore turns it into the job's ``ResumePoint``: the dispatcher never hands out the done groups, and the
worker producing a partial group leaves out its taken offsets.

Example::

    >>> position = ReadPosition()
    >>> position.took([(0, 0, 3, 3), (1, 0, 2, -1)])   # group 0 whole (3 elements), group 1 offsets 0-1
    >>> position.to_state()
    {'done': [0, 1], 'partial': [[1, [0, 2]]], 'seeks': []}
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from dataservice.data.checkpoint import field
from dataservice.proto import state_pb2
from dataservice.service.intervals import OffsetSet

__all__ = ["ReadPosition", "Segment"]

#: ``(group, first_offset, count, total)``: ``count`` consecutive elements of ``group`` from ``first_offset``;
#: ``total`` >= 0 when the group ended after them with that many elements, else -1.
Segment = tuple

_WHERE = "a read from the service (distribute, from_dataset_id)"


class ReadPosition:
    """What a consumer took of one distributed_epoch iteration (see the module docstring). Not thread-safe:
    the consumer's thread owns it."""

    __slots__ = ("done", "partial", "totals", "seeks")

    def __init__(self, done: Optional[OffsetSet] = None, partial: Optional[dict] = None,
                 seeks: Optional[dict] = None):
        #: Groups every element of which was taken, as ranges of group indices.
        self.done = done if done is not None else OffsetSet()
        #: Group -> offsets taken, for groups not done.
        self.partial: dict[int, OffsetSet] = partial if partial is not None else {}
        #: Group -> its element count, for groups in ``partial`` whose end was seen.
        self.totals: dict[int, int] = {}
        #: Group -> (offset, its iterator's state before that element, JSON) for groups in ``partial`` whose
        #: every offset before it was taken: where a restored read's worker seeks to (``ResumePoint.seeks``).
        self.seeks: dict[int, tuple[int, str]] = seeks if seeks is not None else {}

    def took(self, segments: Iterable[Segment]) -> None:
        """The consumer took these elements (and passed these group ends)."""
        for group, first, count, total in segments:
            if count:
                taken = self.partial.get(group)
                if taken is None:
                    taken = self.partial[group] = OffsetSet()
                taken.add(first, first + count)
            if total >= 0:
                self.totals[group] = total
            self._settle(group)

    def _settle(self, group: int) -> None:
        total = self.totals.get(group)
        if total is None:
            return
        taken = self.partial.get(group)
        if total == 0 or (taken is not None and taken.covers(total)):
            self.partial.pop(group, None)
            del self.totals[group]
            self.done.add(group, group + 1)

    def copy_with(self, segments: Iterable[Segment]) -> "ReadPosition":
        """This position plus ``segments`` (what the consumer took of an answer it is inside of)."""
        copy = ReadPosition(self.done.copy(), {g: taken.copy() for g, taken in self.partial.items()},
                            dict(self.seeks))
        copy.totals = dict(self.totals)
        copy.took(segments)
        return copy

    def prefix(self, group: int) -> int:
        """How many of ``group``'s first elements were all taken (0 for a group not taken from)."""
        taken = self.partial.get(group)
        ranges = taken.ranges if taken is not None else []
        return ranges[0][1] if ranges and ranges[0][0] == 0 else 0

    def to_state(self) -> dict:
        return {"done": self.done.flat(),
                "partial": [[group, taken.flat()] for group, taken in sorted(self.partial.items())],
                "seeks": [[g, offset, text] for g, (offset, text) in sorted(self.seeks.items()) if g in self.partial]}

    @classmethod
    def from_state(cls, state: Any) -> "ReadPosition":
        """The position ``to_state`` saved; ValueError naming what is malformed."""
        done = _ranges(field(state, "done", list, _WHERE), "done")
        partial = {}
        for entry in field(state, "partial", list, _WHERE):
            if not (isinstance(entry, list) and len(entry) == 2 and _is_index(entry[0])):
                raise ValueError(f"malformed iterator state for {_WHERE}: 'partial' holds [group, ranges] pairs, "
                                 f"got {str(entry)[:80]}")
            group = entry[0]
            if group in done or group in partial:
                raise ValueError(f"malformed iterator state for {_WHERE}: group {group} is "
                                 f"{'both done and in part' if group in done else 'in part twice'}")
            partial[group] = _ranges(entry[1], f"partial (group {group})")
        position = cls(done, partial)
        for seek in field(state, "seeks", list, _WHERE, default=[]):
            if not (isinstance(seek, list) and len(seek) == 3 and _is_index(seek[0]) and seek[0] in partial
                    and _is_index(seek[1]) and isinstance(seek[2], str)):
                raise ValueError(f"malformed iterator state for {_WHERE}: 'seeks' holds [group taken in part, "
                                 f"offset, state] triples, got {str(seek)[:80]}")
            if not 0 < seek[1] <= position.prefix(seek[0]):
                raise ValueError(f"malformed iterator state for {_WHERE}: the seek of group {seek[0]} is at offset "
                                 f"{seek[1]}, past what was taken of it")
            position.seeks[seek[0]] = (seek[1], seek[2])
        return position

    def to_resume(self) -> state_pb2.ResumePoint:
        """The job's start for a read restored here."""
        return state_pb2.ResumePoint(
            done_groups=self.done.flat(),
            partial=[state_pb2.SplitProgress(stream_id=0, split_index=group, ranges=taken.flat())
                     for group, taken in sorted(self.partial.items()) if len(taken)],
            seeks=[state_pb2.GroupSeek(group=group, offset=offset, state=text.encode())
                   for group, (offset, text) in sorted(self.seeks.items()) if group in self.partial])

    def first_open_group(self, start: int = 0) -> int:
        """The lowest group from ``start`` on that is not done."""
        group = start
        for begin, end in self.done.ranges:
            if begin <= group < end:
                group = end
        return group


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ranges(flat: Any, name: str) -> OffsetSet:
    if not isinstance(flat, list) or len(flat) % 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in flat):
        raise ValueError(f"malformed iterator state for {_WHERE}: {name!r} must be a list of [start, end) pairs "
                         f"of non-negative ints, got {str(flat)[:80]}")
    pairs = list(zip(flat[0::2], flat[1::2]))
    if any(start >= end for start, end in pairs):
        raise ValueError(f"malformed iterator state for {_WHERE}: {name!r} holds an empty or reversed range")
    return OffsetSet(pairs)
