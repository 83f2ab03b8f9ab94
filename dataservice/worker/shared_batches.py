"""Batches built in shared memory that a reader on the same host maps instead of copying.

A reader on the worker's host copies large arrays straight out of the worker's memory
(``dataservice.service.cross_memory``): one copy per byte, in the reader. With shared batches there is
none. A worker's task threads stack each large batch (``Dataset.batch``, at least
``batch_memory.MIN_BYTES``) straight into a *segment*: a ``memfd`` mapped in the worker. When the batch
goes to a reader that asked for ``shared_memory``, the answer names the segment (its id, descriptor,
inode and the buffer's offset) rather than the buffer's address; the reader opens
``/proc/<worker pid>/fd/<fd>`` (allowed exactly where ``process_vm_readv`` is), checks the inode, maps
it once, and its arrays are views of the segment: the worker's stack was the only write of those bytes.

**Who may write a segment.** A segment is *lent* to a connection when an answer names it. It is free
again, for the next batch, only when both hold:

- the reader returned it: its arrays are gone (``GetElementsRequest.returned_segments``), or the answer
  never reached it (``previous_unread``, a failed send);
- nothing in the worker refers to it (the answer kept for the reader's next request, an element in a
  task's buffer, a ``cache()`` after ``batch()``): the pool's view of the segment has no other
  reference (``sys.getrefcount``, as ``client.buffer_pool`` does).

A connection that closes with segments lent (the reader gone, or reconnecting) *orphans* them: they
are never written again, the pool lets them go, and the memory is freed once neither process maps it.
A reader that still holds arrays of one keeps valid data. So a segment is reused only when no process
can see it change.

**Bounds.** The segments of a worker process, free and lent, hold at most ``max_bytes``
(``WorkerConfig.shared_batch_bytes``); a batch that does not fit is stacked in ordinary memory and
copied as before. Free segments are reused by size (a page-rounded exact fit), and the least recently
used free ones are let go to make room.

Example::

    >>> pool = SharedBatches(256 << 20)
    >>> out = pool.allocate((32, 3, 224, 224), np.dtype(np.float32))   # a batch's memory
    >>> pool.find(out.ctypes.data, out.nbytes).id
    1
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import threading
from typing import Hashable, Iterable, Optional

import numpy as np

__all__ = ["Segment", "SharedBatches", "available"]

_PAGE = mmap.PAGESIZE


def available() -> bool:
    """Whether this platform has anonymous shared files (``os.memfd_create``, Linux)."""
    return hasattr(os, "memfd_create")


class Segment:
    """One memfd mapped in this process; ``base`` views all of it (every batch array is a view of ``base``)."""

    __slots__ = ("id", "fd", "inode", "size", "base", "address", "lent", "used_at")

    def __init__(self, segment_id: int, size: int):
        self.id = segment_id
        self.fd = os.memfd_create(f"dataservice-batch-{segment_id}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.inode = os.fstat(self.fd).st_ino
            mapped = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        self.base = np.frombuffer(mapped, np.uint8)
        self.address = self.base.ctypes.data
        #: Connection -> buffers of it lent there and not returned yet.
        self.lent: dict = {}
        self.used_at = 0

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# getrefcount's own argument, and the Segment's attribute: nothing else refers to an unused base.
_UNUSED_REFCOUNT = 2


class SharedBatches:
    """The shared segments of this worker process. Thread-safe: task threads allocate, serving threads lend."""

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"SharedBatches: max_bytes must be positive, got {max_bytes!r}")
        self.max_bytes = int(max_bytes)
        self._segments: dict[int, Segment] = {}
        self._bytes = 0
        self._next_id = 1
        self._clock = 0
        self._lock = threading.Lock()
        #: Counts for tests and diagnostics.
        self.created = 0
        self.reused = 0
        self.declined = 0
        self.orphaned = 0

    @property
    def bytes(self) -> int:
        """Bytes of the segments the pool holds (free and lent; not the orphaned ones)."""
        return self._bytes

    def _free(self, segment: Segment) -> bool:
        return not segment.lent and sys.getrefcount(segment.base) <= _UNUSED_REFCOUNT

    def allocate(self, shape: tuple, dtype: np.dtype) -> Optional[np.ndarray]:
        """An uninitialized array of ``shape`` and ``dtype`` in a segment of its own, or None when it does
        not fit under ``max_bytes`` (the caller then allocates as usual)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        size = -(-max(nbytes, 1) // _PAGE) * _PAGE
        with self._lock:
            self._clock += 1
            found = None
            for segment in self._segments.values():
                if segment.size == size and self._free(segment):
                    found = segment
                    break
            if found is not None:
                self.reused += 1
            else:
                if size > self.max_bytes or not self._make_room(size):
                    self.declined += 1
                    return None
                try:
                    found = Segment(self._next_id, size)
                except OSError:
                    self.declined += 1  # no memory for another shared file (the cgroup's limit, say): as usual
                    return None
                self._next_id += 1
                self._segments[found.id] = found
                self._bytes += size
                self.created += 1
            found.used_at = self._clock
            return found.base[:nbytes].view(dtype).reshape(shape)

    def _make_room(self, size: int) -> bool:
        """Lets free segments go, least recently used first, until ``size`` more bytes fit (under _lock)."""
        if self._bytes + size <= self.max_bytes:
            return True
        for segment in sorted(self._segments.values(), key=lambda s: s.used_at):
            if self._free(segment):
                self._forget(segment)
                if self._bytes + size <= self.max_bytes:
                    return True
        return False

    def _forget(self, segment: Segment) -> None:
        """Drops the pool's hold (under _lock): never handed out again; its memory goes with the last view."""
        del self._segments[segment.id]
        self._bytes -= segment.size
        segment.close_fd()

    def find(self, address: int, nbytes: int) -> Optional[Segment]:
        """The pool's segment holding ``nbytes`` bytes from ``address`` (a buffer about to be sent), or None."""
        with self._lock:
            for segment in self._segments.values():
                if segment.address <= address and address + nbytes <= segment.address + segment.size:
                    return segment
        return None

    def lend(self, segment: Segment, connection: Hashable) -> int:
        """Marks one buffer of ``segment`` lent to ``connection``; its descriptor, or -1 if the pool let it go
        meanwhile (then it is not lent)."""
        with self._lock:
            if self._segments.get(segment.id) is not segment or segment.fd < 0:
                return -1
            segment.lent[connection] = segment.lent.get(connection, 0) + 1
            return segment.fd

    def give_back(self, ids: Iterable[int], connection: Hashable) -> None:
        """``connection``'s reader no longer uses one buffer of each segment in ``ids`` (returned, or never
        received). Ids not lent to it are ignored: a reader can free only what it was lent."""
        with self._lock:
            for segment_id in ids:
                segment = self._segments.get(segment_id)
                if segment is None:
                    continue
                count = segment.lent.get(connection, 0)
                if count > 1:
                    segment.lent[connection] = count - 1
                elif count == 1:
                    del segment.lent[connection]

    def drop_connection(self, connection: Hashable) -> None:
        """``connection`` closed: whatever it still held is orphaned, never written again (its reader may
        still read it)."""
        with self._lock:
            for segment in [s for s in self._segments.values() if connection in s.lent]:
                self.orphaned += 1
                self._forget(segment)

    def close(self) -> None:
        """Lets every segment go (the worker stopping); arrays still viewing one stay valid."""
        with self._lock:
            for segment in list(self._segments.values()):
                self._forget(segment)


_pool: Optional[SharedBatches] = None
_pool_lock = threading.Lock()

# glibc's mallopt parameters, and the thresholds its own dynamic rule ends at (DEFAULT_MMAP_THRESHOLD_MAX).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES = 32 << 20


def _keep_heap_for_images() -> None:
    """Sets glibc's thresholds where its dynamic rule would have put them.

    glibc raises its mmap threshold to the largest block freed (up to 32 MiB), and its trim threshold to
    twice that. A worker that freed a 19 MB batch therefore served every 600 KB image array from its heap,
    with no page fault. Batches in shared segments never pass through malloc: the thresholds stayed at
    128 KB, and each image's arrays were mapped and unmapped again, about 2,500 page faults per batch of
    32 (measured: the worker's system time went from 0.04 to 0.13 CPU-s per 1,000 images). Other C
    libraries (musl) have no such rule, and no ``mallopt``: nothing to do there."""
    if platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD_BYTES)


def process_pool(max_bytes: int) -> Optional[SharedBatches]:
    """This process's pool (made on first use with ``max_bytes``; None where shared files are unavailable or
    ``max_bytes`` is 0). Every worker in a process shares it: a batch may be built by one in-process worker's
    task and answered by another's data server only in tests, and then both see the same segments."""
    global _pool
    if max_bytes <= 0 or not available():
        return None
    with _pool_lock:
        if _pool is None:
            _pool = SharedBatches(max_bytes)
            _keep_heap_for_images()
        return _pool
