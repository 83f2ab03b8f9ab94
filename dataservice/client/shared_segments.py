"""The reader's side of shared batches: a worker's segments, mapped once, lent back when their arrays go.

A worker on this host builds large batches in shared segments (``dataservice.worker.shared_batches``).
An answer names, for each such buffer, the segment (id, the worker's descriptor for it, its inode) and
the buffer's offset. ``MappedSegments.view`` opens ``/proc/<pid>/fd/<fd>`` once per segment, checks the
inode (a descriptor number the worker reused for another file is refused), maps it read-write (a
training loop may change its batch in place: the worker never touches a segment it lent) and gives a
fresh view per buffer. The decoded arrays are views of that view; once none is left, the buffer is
*returnable*: the next request on the connection gives its segment back, and the worker may build
another batch in it.

A new connection starts afresh (``reset``): the worker let go of every segment the old one held, so
those are never written again, and arrays still viewing them stay valid.

Example::

    >>> segments = MappedSegments()
    >>> buffer = segments.view(worker_pid, segment_id=3, fd=12, inode=4242, offset=0, nbytes=19267584)
    >>> segments.returnable()          # buffer still referenced
    []
    >>> del buffer; segments.returnable()
    [3]
"""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np

__all__ = ["MappedSegments"]

# getrefcount's own argument and our list's entry: nothing else views the buffer.
_UNUSED_REFCOUNT = 2


class MappedSegments:
    """One connection's mapped segments and the buffers lent through it. Used by one fetcher thread."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple[int, mmap.mmap]] = {}  # segment id -> (inode, mapping)
        self._lent: list[tuple[int, np.ndarray]] = []  # (segment id, buffer) per buffer given out

    def view(self, pid: int, segment_id: int, fd: int, inode: int, offset: int, nbytes: int) -> np.ndarray:
        """A writable ``uint8`` view of ``nbytes`` bytes at ``offset`` of the segment. Raises ``OSError`` when
        it cannot be opened or is not the file named (the worker's descriptor reused: then a copy is due)."""
        known = self._maps.get(segment_id)
        if known is None or known[0] != inode:
            known = (inode, self._map(pid, fd, inode))
            self._maps[segment_id] = known
        mapping = known[1]
        if offset + nbytes > len(mapping):
            raise OSError(f"shared segment {segment_id} holds {len(mapping)} bytes, not {offset + nbytes}")
        buffer = np.frombuffer(mapping, np.uint8, nbytes, offset)
        self._lent.append((segment_id, buffer))
        return buffer

    @staticmethod
    def _map(pid: int, fd: int, inode: int) -> mmap.mmap:
        opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            info = os.fstat(opened)
            if info.st_ino != inode:
                raise OSError(f"/proc/{pid}/fd/{fd} is no longer the worker's shared segment (inode {info.st_ino}, "
                              f"expected {inode})")
            return mmap.mmap(opened, info.st_size)
        finally:
            os.close(opened)

    def returnable(self) -> list[int]:
        """The segment ids (one per buffer) whose buffers no array views any more; forgotten here."""
        done, kept = [], []
        for segment_id, buffer in self._lent:
            # The loop's own name for the buffer is a third reference.
            (done if sys.getrefcount(buffer) <= _UNUSED_REFCOUNT + 1 else kept).append((segment_id, buffer))
        if not done:
            return []
        self._lent = kept
        return [segment_id for segment_id, _ in done]

    def drop_unreturned(self, count: int) -> None:
        """The last ``count`` buffers given out never reached the caller (the answer failed): forgotten
        without being returned (the worker takes them back itself: ``previous_unread``)."""
        if count:
            del self._lent[-count:]

    def reset(self) -> None:
        """A new connection: the worker forgot what the old one was lent."""
        self._maps.clear()
        self._lent.clear()

    @property
    def lent(self) -> int:
        """Buffers given out and not returned yet."""
        return len(self._lent)
