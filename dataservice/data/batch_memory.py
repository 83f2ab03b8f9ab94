"""Where a thread's large batches are built: by default fresh numpy memory, in a worker shared memory.

``Dataset.batch`` stacks its elements with ``structure.stack``. A worker's task thread runs its pipeline
under ``batches_into(allocate)``: a batch of at least ``MIN_BYTES`` is then stacked straight into
memory ``allocate`` gives (``dataservice.worker.shared_batches``: a segment a reader on the same host maps
without a copy). Everywhere else (a client's local pipeline, a helper thread of the pipeline) nothing
changes. ``allocate`` may decline (None): the batch is then stacked into fresh memory as usual.

Example::

    >>> with batches_into(lambda shape, dtype: np.empty(shape, dtype)):
    ...     out = allocate((32, 3, 224, 224), np.dtype(np.float32))
    >>> out.shape
    (32, 3, 224, 224)
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Optional

import numpy as np

__all__ = ["MIN_BYTES", "allocate", "batches_into"]

#: Smaller batches are stacked as usual: a shared segment pays for itself on large arrays only.
MIN_BYTES = 1 << 20

Allocator = Callable[[tuple, np.dtype], Optional[np.ndarray]]

_local = threading.local()


@contextlib.contextmanager
def batches_into(allocator: Optional[Allocator]) -> Iterator[None]:
    """Within the block, this thread's large batches come from ``allocator(shape, dtype)`` (None: as usual)."""
    previous = getattr(_local, "allocator", None)
    _local.allocator = allocator
    try:
        yield
    finally:
        _local.allocator = previous


def allocate(shape: tuple, dtype: np.dtype) -> Optional[np.ndarray]:
    """An uninitialized C-contiguous array for a batch of ``shape`` and ``dtype`` from this thread's allocator,
    or None (none set, a batch under ``MIN_BYTES``, or the allocator declined)."""
    allocator = getattr(_local, "allocator", None)
    if allocator is None or dtype.hasobject:
        return None
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= d
    if nbytes < MIN_BYTES:
        return None
    return allocator(shape, dtype)
