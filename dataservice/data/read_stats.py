"""What a pipeline's consumer saw of the service: ``ReaderStats``, added up over an iterator's readers.

The distributed read (``dataservice.client``) records into the ``ReaderStatsRecorder`` of the pipeline's
``IteratorContext``; ``iter(dataset).stats()`` reads it. Here, in ``data/``, so that a pipeline's iterator
carries its reads' stats without the pipeline library knowing the client.

Example::

    >>> it = iter(dataset.apply(distribute("parallel_epochs", target)).prefetch(2))
    >>> for batch in it: ...
    >>> it.stats().stall_fraction
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Optional

__all__ = ["ReaderStats", "ReaderStatsRecorder"]


@dataclasses.dataclass(frozen=True)
class ReaderStats:
    """What a reader's consumer saw (``iterator.stats()``; each reader also reports it to the dispatcher).

    ``elements``: elements the consumer took. ``bytes``: the bytes of the frames those elements came in, as
    received from the workers (the arrays' data plus a few bytes of framing per element; a frame counts
    when the consumer takes its first element). ``stall_s``: the time the consumer waited for data inside
    ``next()``, a wait in progress included (and the first ``next()``'s wait for the dispatcher and the
    first answer). ``elapsed_s``: time since the first ``next()`` (frozen once the read ended).
    ``stall_fraction``: ``stall_s / elapsed_s`` (0 before the first ``next()``) — near 1, the input
    pipeline is the bottleneck; near 0, the consumer is.

    Example::

        >>> it = iter(dataset)          # dataset = ... .apply(distribute(...))
        >>> for x in it: train_step(x)
        >>> it.stats()
        ReaderStats(elements=1000, bytes=8192160, stall_s=0.42, elapsed_s=12.5, stall_fraction=0.0336)
    """

    elements: int = 0
    bytes: int = 0
    stall_s: float = 0.0
    elapsed_s: float = 0.0
    stall_fraction: float = 0.0

    @staticmethod
    def of(elements: int, nbytes: int, stall_s: float, elapsed_s: float) -> "ReaderStats":
        """The stats with ``stall_fraction`` computed (and ``stall_s`` never above ``elapsed_s``)."""
        elapsed_s = max(0.0, elapsed_s)
        stall_s = min(max(0.0, stall_s), elapsed_s)
        return ReaderStats(elements, nbytes, stall_s, elapsed_s, stall_s / elapsed_s if elapsed_s > 0 else 0.0)


class ReaderStatsRecorder:
    """Adds up the readers of one iterator: each iteration of the distributed dataset (each epoch of a
    ``repeat()`` after ``distribute``) is a reader of its own. ``elapsed_s`` runs from the first reader's
    first ``next()`` to now while a reader reads, and stops at the end of the last one between reads.

    Example::

        >>> recorder = ReaderStatsRecorder()
        >>> recorder.add(reader); ...; recorder.finished(reader)
        >>> recorder.stats().elements
        1000
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: list = []
        self._elements = 0
        self._bytes = 0
        self._stall_s = 0.0
        self._first: Optional[float] = None
        self._last_end: Optional[float] = None

    def add(self, reader: Any) -> None:
        with self._lock:
            self._live.append(reader)
            if self._first is None:
                self._first = reader.started_at

    def finished(self, reader: Any, _monotonic: Callable[[], float] = time.monotonic) -> None:
        """Folds an ended reader into the totals (it may then be freed).

        The clock is bound as a default: a reader finalized at interpreter exit runs this after module
        teardown has set the ``time`` global to None."""
        with self._lock:
            if reader not in self._live:
                return
            self._live.remove(reader)
            stats = reader.stats()
            self._elements += stats.elements
            self._bytes += stats.bytes
            self._stall_s += stats.stall_s
            self._last_end = _monotonic()

    def stats(self) -> ReaderStats:
        with self._lock:
            live = [r.stats() for r in self._live]
            if self._first is None:
                return ReaderStats()
            end = time.monotonic() if live or self._last_end is None else self._last_end
            return ReaderStats.of(self._elements + sum(s.elements for s in live),
                                  self._bytes + sum(s.bytes for s in live),
                                  self._stall_s + sum(s.stall_s for s in live), end - self._first)
