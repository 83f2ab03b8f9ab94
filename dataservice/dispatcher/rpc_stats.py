"""How long the dispatcher takes to answer each RPC, over its recent calls.

The gRPC adapter records every call; ``GetStatus`` reports percentiles per method
(``dataservice status``), so an operator sees a dispatcher slowing down before
workers start to look lost. Memory is bounded: a ring of the most recent
``RECENT_CALLS`` durations per method.

Example::

    >>> stats = RpcStats()
    >>> stats.record("GetSplit", 0.0004)
    >>> stats.summary()[0].method, stats.summary()[0].calls
    ('GetSplit', 1)
"""

from __future__ import annotations

import collections
import dataclasses
import threading

#: The RPCs that long-poll (wait in the dispatcher for news): their latency is mostly waiting by design, not
#: slowness (``dataservice status`` marks them). Here, in a module of few imports, so that the CLI reads it cheaply.
LONG_POLL_METHODS = frozenset({"WorkerHeartbeat", "GetSplit"})

__all__ = ["RpcStats", "MethodLatency", "RECENT_CALLS"]

#: Durations kept per method: percentiles describe the recent past, not the dispatcher's whole life.
RECENT_CALLS = 1024


@dataclasses.dataclass(frozen=True)
class MethodLatency:
    method: str
    calls: int
    p50_ms: float
    p99_ms: float
    max_ms: float


class RpcStats:
    """Thread-safe; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent: dict[str, collections.deque] = {}
        self._calls: collections.Counter = collections.Counter()

    def record(self, method: str, seconds: float) -> None:
        with self._lock:
            ring = self._recent.get(method)
            if ring is None:
                ring = self._recent[method] = collections.deque(maxlen=RECENT_CALLS)
            ring.append(seconds)
            self._calls[method] += 1

    def summary(self) -> list[MethodLatency]:
        """Per method, sorted by name: calls so far and percentiles of the recent ones."""
        with self._lock:
            rings = {method: sorted(ring) for method, ring in self._recent.items()}
            calls = dict(self._calls)
        out = []
        for method, values in sorted(rings.items()):
            def at(q: float) -> float:
                return values[min(len(values) - 1, int(q * len(values)))] * 1000
            out.append(MethodLatency(method, calls[method], at(0.5), at(0.99), values[-1] * 1000))
        return out
