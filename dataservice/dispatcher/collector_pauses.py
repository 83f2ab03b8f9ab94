"""Python's garbage collector in a dispatcher process: full collections rarely, young ones as usual.

A dispatcher holds its whole state in Python objects (180,000 at 2,000 workers and 1,000 readers), and
every call allocates more: gRPC's asyncio server alone leaves a reference cycle of five objects per call
(freed by the young collections). With CPython's default thresholds (700, 10, 10), enough allocations
survived into the oldest generation that a full collection ran every 3.5-10 s, and each walked the whole
state with the event loop stopped: 165-190 ms at 2,000 workers and 1,000 readers, 140-310 ms with 10,000
readers. Every heartbeat and GetSplit in flight waited for it: the worst of the fleet's late polls.

``reduce_full_collections`` keeps the young generations' thresholds (what dies young, such as gRPC's
cycles, is still freed within milliseconds) and asks for a full collection only after
``FULL_COLLECTION_EVERY`` collections of the middle generation instead of 10: at those fleets, one every
several minutes instead of every few seconds. Cyclic garbage that lives long enough to reach the oldest
generation waits longer to be freed; the dispatcher makes little of it (its state is freed by reference
counting).

Example::

    >>> reduce_full_collections()      # by ``dataservice dispatcher``, once, at start
    >>> gc.get_threshold()
    (700, 10, 1000)
"""

from __future__ import annotations

import gc

__all__ = ["reduce_full_collections", "FULL_COLLECTION_EVERY"]

#: Middle-generation collections between two full ones (CPython's default is 10).
FULL_COLLECTION_EVERY = 1000


def reduce_full_collections() -> None:
    """Sets this process's collector as the module docstring says. For a process that is a dispatcher:
    it changes the whole process's collector."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
