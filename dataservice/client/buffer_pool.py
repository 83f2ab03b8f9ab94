"""Receive buffers for large arrays, reused once their consumer has dropped them.

A large array arrives in a buffer of its own (see ``dataservice.service.wire``)
and becomes the decoded array the consumer gets. Allocating that buffer afresh
for every element costs as much as receiving it: the allocator hands back
memory it returned to the kernel, and the kernel zeroes and maps it again page
by page (about 130 page faults per MiB were measured here). The pool keeps the
buffers it handed out and gives one out again once nothing but the pool refers
to it — CPython's reference count says so exactly: a consumer still holding
the array, a view of it, or anything exported from it (a memoryview, a torch
tensor from ``torch.from_numpy``) holds a reference, and its buffer is not
reused.

What it keeps is bounded by ``max_bytes`` (buffers in use and free together);
beyond that a buffer is simply not tracked, and its memory goes back to the
allocator when its consumer drops it.

Example::

    >>> pool = BufferPool(max_bytes=64 << 20)
    >>> a = pool.take(1 << 20)        # a new np.uint8 buffer
    >>> del a                         # the consumer dropped it...
    >>> b = pool.take(1 << 20)        # ...so it is given out again, with no allocation
"""

from __future__ import annotations

import collections
import sys
import threading

import numpy as np

__all__ = ["BufferPool"]

#: References to a tracked buffer nobody else holds while ``take`` looks at it: the pool's deque,
#: the loop variable, and ``getrefcount``'s argument.
_UNUSED_REFCOUNT = 3


class BufferPool:
    """Thread-safe; see the module docstring."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._buffers: collections.deque = collections.deque()
        self._tracked_bytes = 0
        self._lock = threading.Lock()
        #: Buffers given out again rather than allocated (for tests and benchmarks).
        self.reused = 0

    @property
    def tracked_bytes(self) -> int:
        return self._tracked_bytes

    def take(self, nbytes: int) -> np.ndarray:
        """A writable ``np.uint8`` array of exactly ``nbytes`` bytes, not zeroed."""
        with self._lock:
            best = None
            best_index = -1
            i = -1
            for buffer in self._buffers:  # not enumerate(): its cached tuple would hold a reference
                i += 1
                # A free buffer at most twice as large: a larger one would pin memory a smaller
                # request has no use for.
                if nbytes <= buffer.nbytes <= 2 * nbytes and sys.getrefcount(buffer) <= _UNUSED_REFCOUNT:
                    if best is None or buffer.nbytes < best.nbytes:
                        best, best_index = buffer, i
                        if buffer.nbytes == nbytes:
                            break
            if best is not None:
                self.reused += 1
                # To the back: the front holds the buffers given out longest ago, the likeliest to be free.
                del self._buffers[best_index]
                self._buffers.append(best)
                return best if best.nbytes == nbytes else best[:nbytes]
            buffer = np.empty(nbytes, np.uint8)
            self._evict(nbytes)
            if self._tracked_bytes + nbytes <= self.max_bytes:
                self._buffers.append(buffer)
                self._tracked_bytes += nbytes
            return buffer

    def _evict(self, nbytes: int) -> None:
        """Drops free buffers (oldest first) until ``nbytes`` more fit under ``max_bytes``."""
        if self._tracked_bytes + nbytes <= self.max_bytes:
            return
        keep: collections.deque = collections.deque()
        while self._buffers:
            buffer = self._buffers.popleft()
            if self._tracked_bytes + nbytes > self.max_bytes and sys.getrefcount(buffer) <= _UNUSED_REFCOUNT - 1:
                self._tracked_bytes -= buffer.nbytes
                continue
            keep.append(buffer)
        self._buffers = keep
