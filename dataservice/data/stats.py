"""Pipeline statistics: ``StatsAggregator``, ``StatsOptions`` and what records into them.

After ``tf.data.experimental``'s: ``latency_stats(tag)`` records how long each ``next()`` on its
input took, ``bytes_produced_stats(tag)`` the size of each element; with
``StatsOptions.latency_all_edges`` every transformation of the pipeline is timed, without editing
it. What is recorded goes to the ``StatsAggregator`` set in the pipeline's options (nothing is
recorded without one), which returns plain data: ``get_summary()`` gives, per name, the count,
sum, mean, min, max and percentiles (p50, p90, p99) of a fixed-size histogram, plus counters
(elements, bytes) named with ``StatsOptions.counter_prefix``.

Cost: with no aggregator a stats transformation hands out its input's iterator unchanged and
``latency_all_edges`` inserts nothing, so a pipeline without stats runs exactly the code it runs
without this module. With an aggregator, each recorded element costs two clock reads (latency)
or a size walk (bytes) and a histogram update; no lock is taken per element: each iterator
records into a histogram of its own (a Python generator never runs on two threads at once) that
is merged into the aggregator under its lock when the iterator ends. Memory is bounded: a
histogram is a fixed array of ``NUM_BUCKETS`` counts, whatever the number of elements.

Example::

    >>> from dataservice.data import Dataset, Options
    >>> from dataservice.data.experimental import StatsAggregator, latency_stats
    >>> aggregator = StatsAggregator()
    >>> options = Options()
    >>> options.experimental_stats.aggregator = aggregator
    >>> ds = Dataset.range(100).map(lambda x: x * 2).apply(latency_stats("map")).with_options(options)
    >>> _ = list(ds)
    >>> aggregator.get_summary().latency["map"].count
    100
"""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
import time
from typing import Any, Iterator, Optional

import numpy as np

from dataservice.data.checkpoint import Follows
from dataservice.data.options import _OptionsGroup

__all__ = ["StatsAggregator", "StatsOptions", "StatsSummary", "HistogramSummary", "Histogram", "element_bytes",
           "NUM_BUCKETS", "DEFAULT_COUNTER_PREFIX", "LATENCY_ALL_EDGES_TAG"]

# --- the histogram ------------------------------------------------------------------------------
# Log-linear buckets over non-negative integers (nanoseconds, bytes): one bucket per value below
# 2**(SUB_BITS+1), then 2**SUB_BITS buckets per power of two. A value is at most half a bucket from
# the bucket's middle: a relative error of at most 1/64 (1.6%) for any percentile.
_SUB_BITS = 5
_EXACT_BITS = _SUB_BITS + 1
#: Values below this have a bucket each (percentiles over them are exact).
EXACT_BELOW = 1 << _EXACT_BITS
_MAX_VALUE = (1 << 63) - 1
#: Buckets of every histogram: enough for any value below 2**63.
NUM_BUCKETS = ((63 - _EXACT_BITS) << _SUB_BITS) + EXACT_BELOW
_NO_MIN = 1 << 64  # above any recorded value: "no minimum yet"

#: Counter names start with this when ``StatsOptions.counter_prefix`` is unset (TF's "/tensorflow").
DEFAULT_COUNTER_PREFIX = "/dataservice"
#: ``latency_all_edges`` names a transformation's latency ``record_latency::<Class>/_<n>``, as TF does;
#: ``n`` numbers the pipeline's nodes from its sources (0) to its output.
LATENCY_ALL_EDGES_TAG = "record_latency"
_DELIMITER = "::"

_LATENCY, _BYTES = "latency", "bytes"


def _bucket(value: int) -> int:
    bits = value.bit_length()
    if bits <= _EXACT_BITS:
        return value
    shift = bits - _EXACT_BITS
    return (shift << _SUB_BITS) + (value >> shift)


def _bucket_bounds(index: int) -> tuple[int, int]:
    """The least and greatest value of bucket ``index`` (inclusive)."""
    if index < EXACT_BELOW:
        return index, index
    shift = (index >> _SUB_BITS) - 1
    top = index - (shift << _SUB_BITS)
    return top << shift, ((top + 1) << shift) - 1


class Histogram:
    """Counts of non-negative integers in ``NUM_BUCKETS`` fixed buckets, with their exact count, sum,
    min and max. Percentiles are exact below ``EXACT_BELOW`` and within 1/64 of the true value above.

    Not thread-safe: one writer at a time (the aggregator gives each iterator its own).

    Example::

        >>> h = Histogram()
        >>> for v in range(1, 51):
        ...     h.record(v)
        >>> h.count, h.sum, h.percentile(0.5), h.percentile(0.99)
        (50, 1275, 25, 50)
    """

    __slots__ = ("counts", "acc")

    def __init__(self) -> None:
        self.counts = [0] * NUM_BUCKETS
        # [count, sum, min, max] in one list: the recorders update it in place, without attribute stores.
        self.acc = [0, 0, _NO_MIN, 0]

    def record(self, value: int) -> None:
        """Adds one value (an int >= 0; larger than 2**63 - 1 is counted as that)."""
        if value < 0:
            raise ValueError(f"a histogram records values >= 0, got {value}")
        value = min(int(value), _MAX_VALUE)
        self.counts[_bucket(value)] += 1
        acc = self.acc
        acc[0] += 1
        acc[1] += value
        if value < acc[2]:
            acc[2] = value
        if value > acc[3]:
            acc[3] = value

    @property
    def count(self) -> int:
        return self.acc[0]

    @property
    def sum(self) -> int:
        return self.acc[1]

    @property
    def min(self) -> Optional[int]:
        return self.acc[2] if self.acc[0] else None

    @property
    def max(self) -> Optional[int]:
        return self.acc[3] if self.acc[0] else None

    def merge(self, other: "Histogram") -> None:
        """Adds ``other``'s values to this one's (only the buckets between its min and max are read)."""
        count, total, low, high = other.acc
        if not count:
            return
        mine, theirs = self.counts, other.counts
        for i in range(_bucket(low), _bucket(high) + 1):
            if theirs[i]:
                mine[i] += theirs[i]
        acc = self.acc
        acc[0] += count
        acc[1] += total
        acc[2] = min(acc[2], low)
        acc[3] = max(acc[3], high)

    def copy(self) -> "Histogram":
        """A snapshot (consistent enough to read while another thread records: list copies are atomic)."""
        clone = Histogram.__new__(Histogram)
        clone.acc = list(self.acc)
        clone.counts = list(self.counts)
        return clone

    def percentile(self, q: float) -> float:
        """The value at quantile ``q`` (0 < q <= 1) by nearest rank: the ``ceil(q * count)``-th smallest,
        given as its bucket's middle, clamped to [min, max]; ``q == 0`` is the min, ``q == 1`` the max. NaN
        when empty."""
        if not 0 <= q <= 1:
            raise ValueError(f"a quantile is between 0 and 1, got {q}")
        total = sum(self.counts)  # not acc[0]: a snapshot taken mid-record agrees with its own buckets
        if not total:
            return math.nan
        low, high = self.acc[2], self.acc[3]
        if q == 0:
            return low
        if q == 1:
            return high
        rank = max(1, math.ceil(q * total))
        seen = 0
        for i in range(_bucket(low), _bucket(high) + 1):
            seen += self.counts[i]
            if seen >= rank:
                lo, hi = _bucket_bounds(i)
                if lo == hi:
                    return lo
                return min(max((lo + hi) / 2, low), high)
        return high  # pragma: no cover - counts and bounds disagree only mid-record

    def buckets(self) -> list[tuple[int, int, int]]:
        """The non-empty buckets: ``(least value, greatest value, count)``, in increasing order."""
        if not self.acc[0]:
            return []
        return [(*_bucket_bounds(i), self.counts[i])
                for i in range(_bucket(self.acc[2]), _bucket(self.acc[3]) + 1) if self.counts[i]]


# --- what get_summary returns -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class HistogramSummary:
    """One recorded statistic: latencies in microseconds (``unit == "us"``) or element sizes in bytes.

    ``buckets``: the non-empty histogram buckets, ``(least value, greatest value, count)`` in ``unit``
    (what a Prometheus histogram is made from). Percentiles are nearest-rank, within 1/64 of the exact
    value (exact for latencies below 0.064 us and sizes below 64 bytes).
    """

    name: str
    unit: str
    count: int
    sum: float
    min: float
    max: float
    p50: float
    p90: float
    p99: float
    buckets: tuple[tuple[float, float, int], ...] = ()

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def to_dict(self) -> dict:
        """Plain data (JSON-ready), with ``mean``."""
        out = dataclasses.asdict(self)
        out["mean"] = self.mean
        out["buckets"] = [list(b) for b in self.buckets]
        return out


@dataclasses.dataclass(frozen=True)
class StatsSummary:
    """What a ``StatsAggregator`` has recorded, as plain data.

    ``latency``: per latency name (the ``latency_stats`` tag, ``prefix::tag`` with ``StatsOptions.prefix``;
    ``record_latency::<Class>/_<n>`` for ``latency_all_edges``), microseconds per element.
    ``bytes_produced``: per ``bytes_produced_stats`` name, bytes per element.
    ``counters``: monotonic totals, ``<counter_prefix>/<name>/elements`` for each latency name and
    ``<counter_prefix>/<name>/bytes`` for each bytes name (``counter_prefix`` defaults to ``/dataservice``).
    """

    latency: dict
    bytes_produced: dict
    counters: dict

    def to_dict(self) -> dict:
        return {"latency": {k: v.to_dict() for k, v in self.latency.items()},
                "bytes_produced": {k: v.to_dict() for k, v in self.bytes_produced.items()},
                "counters": dict(self.counters)}

    def table(self) -> str:
        """A text table: one row per statistic, then the counters.

        Example::

            >>> print(aggregator.get_summary().table())  # doctest: +SKIP
            latency (us)                count     mean      p50      p90      p99      max
            map                           100     0.93     0.86     1.05     2.61     9.12
        """
        lines = []
        for title, stats in (("latency (us)", self.latency), ("bytes produced", self.bytes_produced)):
            if not stats:
                continue
            width = max(len(title), *(len(name) for name in stats))
            lines.append(f"{title:<{width}}  {'count':>10}  {'mean':>10}  {'p50':>10}  {'p90':>10}  {'p99':>10}"
                         f"  {'max':>10}")
            for name in sorted(stats):
                s = stats[name]
                lines.append(f"{name:<{width}}  {s.count:>10}  " + "  ".join(
                    _number(v) for v in (s.mean, s.p50, s.p90, s.p99, s.max)))
        if self.counters:
            width = max(len("counter"), *(len(name) for name in self.counters))
            lines.append(f"{'counter':<{width}}  {'total':>14}")
            lines.extend(f"{name:<{width}}  {self.counters[name]:>14}" for name in sorted(self.counters))
        return "\n".join(lines) if lines else "(no statistics recorded)"

    def __str__(self) -> str:
        return self.table()


def _number(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return f"{'-':>10}"
    return f"{value:>10.2f}" if isinstance(value, float) and not value.is_integer() else f"{int(value):>10}"


def _summarize(name: str, kind: str, histogram: Histogram) -> HistogramSummary:
    # Latencies are recorded in nanoseconds and reported in microseconds, as TF's.
    scale = 1000.0 if kind == _LATENCY else 1

    def scaled(v):
        if v is None:
            return math.nan
        return v / scale if scale != 1 else v

    return HistogramSummary(
        name=name, unit="us" if kind == _LATENCY else "bytes", count=histogram.count, sum=scaled(histogram.sum),
        min=scaled(histogram.min), max=scaled(histogram.max),
        p50=scaled(histogram.percentile(0.5)), p90=scaled(histogram.percentile(0.9)),
        p99=scaled(histogram.percentile(0.99)),
        buckets=tuple((scaled(lo), scaled(hi), n) for lo, hi, n in histogram.buckets()))


# --- the aggregator ------------------------------------------------------------------------------
class StatsAggregator:
    """Collects the statistics of the pipelines whose options name it; thread-safe, and may be shared
    by several pipelines and iterators (their records add up per name).

    A pickled aggregator (a pipeline shipped to a service worker) arrives empty: what it recorded
    stays in the process that recorded it, and the pipeline's bytes (its dataset id) do not depend on
    what was recorded.

    Example::

        >>> aggregator = StatsAggregator()
        >>> options = Options()
        >>> options.experimental_stats.aggregator = aggregator
        >>> options.experimental_stats.latency_all_edges = True
        >>> _ = list(Dataset.range(10).map(lambda x: x + 1).with_options(options))
        >>> sorted(aggregator.get_summary().latency)
        ['record_latency::MapDataset/_1', 'record_latency::RangeDataset/_0']
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (kind, name, counter prefix) -> what finished iterators recorded
        self._done: dict[tuple[str, str, str], Histogram] = {}
        # id(histogram) -> (key, histogram) of iterators still running
        self._live: dict[int, tuple[tuple[str, str, str], Histogram]] = {}

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def __repr__(self) -> str:
        with self._lock:
            names = len({key for key in self._done} | {key for key, _ in self._live.values()})
        return f"<StatsAggregator: {names} statistics>"

    def _open(self, key: tuple[str, str, str]) -> Histogram:
        histogram = Histogram()
        with self._lock:
            self._live[id(histogram)] = (key, histogram)
        return histogram

    def _close(self, key: tuple[str, str, str], histogram: Histogram) -> None:
        with self._lock:
            if self._live.pop(id(histogram), None) is None:
                return
            done = self._done.get(key)
            if done is None:
                self._done[key] = histogram
            else:
                done.merge(histogram)

    def get_summary(self) -> StatsSummary:
        """Everything recorded so far, including by iterators still running, as a ``StatsSummary``.

        Example::

            >>> s = aggregator.get_summary()
            >>> s.latency["map"].count, s.counters["/dataservice/map/elements"], s.latency["map"].unit
            (100, 100, 'us')
        """
        with self._lock:
            parts = [(key, h.copy()) for key, h in self._done.items()]
            parts += [(key, h.copy()) for key, h in self._live.values()]
        merged: dict[tuple[str, str], Histogram] = {}
        counters: dict[str, int] = {}
        for (kind, name, counter_prefix), histogram in parts:
            if not histogram.count:
                continue  # an iterator that has not produced yet: its name appears with its first element
            total = merged.get((kind, name))
            if total is None:
                merged[(kind, name)] = total = Histogram()
            total.merge(histogram)
            counter = f"{counter_prefix}/{name}/" + ("elements" if kind == _LATENCY else "bytes")
            counters[counter] = counters.get(counter, 0) + (histogram.count if kind == _LATENCY else histogram.sum)
        latency = {name: _summarize(name, kind, h) for (kind, name), h in sorted(merged.items()) if kind == _LATENCY}
        sizes = {name: _summarize(name, kind, h) for (kind, name), h in sorted(merged.items()) if kind == _BYTES}
        return StatsSummary(latency=latency, bytes_produced=sizes, counters=dict(sorted(counters.items())))


# --- options -----------------------------------------------------------------------------------
@dataclasses.dataclass(eq=True)
class StatsOptions(_OptionsGroup):
    """Statistics of a pipeline (``Options.experimental_stats``, after ``tf.data.experimental.StatsOptions``).

    ``aggregator``: the ``StatsAggregator`` that ``latency_stats``, ``bytes_produced_stats`` and
    ``latency_all_edges`` record into; None: nothing is recorded (and nothing costs).
    ``latency_all_edges``: time every transformation's ``next()`` (None means False).
    ``prefix``: prepended to every statistic's name, ``prefix::name`` (None: no prefix).
    ``counter_prefix``: the start of counter names, ``counter_prefix/name/...`` (None: ``/dataservice``).

    Example::

        >>> options = Options()
        >>> options.experimental_stats.aggregator = StatsAggregator()
        >>> options.experimental_stats.latency_all_edges = True
        >>> options.experimental_stats.prefix = "train"
    """

    aggregator: Optional[StatsAggregator] = None
    latency_all_edges: Optional[bool] = None
    prefix: Optional[str] = None
    counter_prefix: Optional[str] = None

    def _check(self, name: str, value: Any) -> None:
        if value is None:
            return
        if name == "aggregator" and not isinstance(value, StatsAggregator):
            raise TypeError(f"aggregator must be a StatsAggregator or None, got {type(value).__name__}")
        if name == "latency_all_edges" and not isinstance(value, bool):
            raise TypeError(f"latency_all_edges must be a bool or None, got {value!r} ({type(value).__name__})")
        if name in ("prefix", "counter_prefix") and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, got {value!r} ({type(value).__name__})")


def _names(stats: StatsOptions, tag: str) -> tuple[str, str]:
    """(the statistic's name, its counter prefix) under ``stats``."""
    name = f"{stats.prefix}{_DELIMITER}{tag}" if stats.prefix else tag
    return name, stats.counter_prefix if stats.counter_prefix else DEFAULT_COUNTER_PREFIX


# --- recording ---------------------------------------------------------------------------------
def record_latency(it: Iterator, aggregator: StatsAggregator, stats: StatsOptions, tag: str) -> Iterator:
    """``it``'s elements, recording how long each ``next(it)`` took under ``tag``."""
    name, counter_prefix = _names(stats, tag)
    return _latency(it, aggregator, (_LATENCY, name, counter_prefix))


def _latency(it: Iterator, aggregator: StatsAggregator, key: tuple[str, str, str]) -> Iterator:
    histogram = aggregator._open(key)  # on the first next(): an iterator never started records nothing
    counts, acc, clock = histogram.counts, histogram.acc, time.perf_counter_ns
    try:
        start = clock()
        for x in it:
            v = clock() - start
            # Histogram.record, inlined: this runs once per element.
            bits = v.bit_length()
            if bits > _EXACT_BITS:
                shift = bits - _EXACT_BITS
                counts[(shift << _SUB_BITS) + (v >> shift)] += 1
            else:
                counts[v] += 1
            acc[0] += 1
            acc[1] += v
            if v > acc[3]:
                acc[3] = v
            if v < acc[2]:
                acc[2] = v
            yield x
            start = clock()  # the consumer's time between our yields is not this edge's
    finally:
        aggregator._close(key, histogram)


def record_bytes(it: Iterator, aggregator: StatsAggregator, stats: StatsOptions, tag: str) -> Iterator:
    """``it``'s elements, recording each one's size (``element_bytes``) under ``tag``."""
    name, counter_prefix = _names(stats, tag)
    return _bytes(it, aggregator, (_BYTES, name, counter_prefix))


def _bytes(it: Iterator, aggregator: StatsAggregator, key: tuple[str, str, str]) -> Iterator:
    histogram = aggregator._open(key)
    counts, acc, sizers = histogram.counts, histogram.acc, _SIZERS
    try:
        for x in it:
            size = sizers.get(type(x))
            v = size(x) if size is not None else element_bytes(x)
            # Histogram.record, inlined, as in _latency.
            bits = v.bit_length()
            if bits > _EXACT_BITS:
                shift = bits - _EXACT_BITS
                counts[(shift << _SUB_BITS) + (v >> shift)] += 1
            else:
                counts[v] += 1
            acc[0] += 1
            acc[1] += v
            if v > acc[3]:
                acc[3] = v
            if v < acc[2]:
                acc[2] = v
            yield x
    finally:
        aggregator._close(key, histogram)


def element_bytes(element: Any) -> int:
    """The bytes an element holds, as TF's ``bytes_produced_stats`` counts them: the data of its arrays
    (``nbytes``; for arrays of strings and objects, the strings' bytes), ``bytes`` and UTF-8 ``str``
    lengths, 8 for a Python int or float, 1 for a bool, summed over tuples, lists and dicts. Other
    objects (a window's datasets, None) count 0.

    Example::

        >>> element_bytes((np.zeros((2, 3), np.float32), b"abc", {"s": "h\u00e9llo"}))
        33
    """
    kind = type(element)
    size = _SIZERS.get(kind)
    if size is None:
        size = _SIZERS[kind] = _sizer(kind)  # one entry per type met: bounded, and a dict hit after
    return size(element)


def _array_bytes(array: np.ndarray) -> int:
    if array.dtype.kind == "O":
        return sum(element_bytes(v) for v in array.flat)
    return array.nbytes


def _str_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _sequence_bytes(items: Any) -> int:
    return sum(element_bytes(v) for v in items)


def _dict_bytes(items: dict) -> int:
    return sum(element_bytes(v) for v in items.values())


def _sizer(kind: type):
    """How to size an element of type ``kind`` (see element_bytes)."""
    if issubclass(kind, np.ndarray):
        return _array_bytes
    if issubclass(kind, bytes):  # np.bytes_ too: its data, not its fixed-width itemsize
        return len
    if issubclass(kind, str):
        return _str_bytes
    if issubclass(kind, (tuple, list)):
        return _sequence_bytes
    if issubclass(kind, dict):
        return _dict_bytes
    if issubclass(kind, np.generic):
        return _NBYTES
    if issubclass(kind, bool):
        return _ONE
    if issubclass(kind, (int, float)):
        return _EIGHT
    return _ZERO


def _NBYTES(x: Any) -> int:
    return x.nbytes


def _ONE(_: Any) -> int:
    return 1


def _EIGHT(_: Any) -> int:
    return 8


def _ZERO(_: Any) -> int:
    return 0


_SIZERS: dict = {np.ndarray: _array_bytes, bytes: len, str: _str_bytes, tuple: _sequence_bytes,
                 list: _sequence_bytes, dict: _dict_bytes, np.int64: _NBYTES, np.float64: _NBYTES,
                 np.int32: _NBYTES, np.float32: _NBYTES}


# --- latency_all_edges: every node of the pipeline timed, the pipeline untouched ----------------
def instrumented_iterator(dataset: Any, ctx: Any) -> Iterator:
    """The root iterator of ``dataset`` with every transformation's latency recorded (``latency_all_edges``).

    The pipeline is not changed: a stand-in for each node (an instance of a subclass of the node's
    class) reads and writes the node's own attributes, except its inputs, which are the stand-ins of
    the inputs; its ``_iterator`` is the node's, timed. Datasets made inside user functions
    (``flat_map``, ``interleave``) are not timed, as in TF (only the pipeline's graph is rewritten).
    """
    stats = ctx.options.experimental_stats
    return _Instrumenter(stats.aggregator, stats).wrap(dataset)._iterator(ctx)


class _Edge:
    __slots__ = ("node", "overrides", "key", "aggregator")

    def __init__(self, node, overrides, key, aggregator):
        self.node, self.overrides, self.key, self.aggregator = node, overrides, key, aggregator


class _Instrumenter:
    def __init__(self, aggregator: StatsAggregator, stats: StatsOptions):
        self._aggregator = aggregator
        self._stats = stats
        self._memo: dict[int, Any] = {}
        self._position = 0

    def wrap(self, node: Any) -> Any:
        from dataservice.data.dataset import Dataset

        node = _original(node)
        found = self._memo.get(id(node))
        if found is not None:
            return found
        inputs = {id(d): d for d in node._inputs()}
        overrides = {}
        for attr, value in vars(node).items():
            if isinstance(value, Dataset):
                overrides[attr] = self.wrap(value)
            elif isinstance(value, (tuple, list, dict)) and inputs and _holds_input(value, inputs):
                overrides[attr] = self._wrap_nested(value)
        key = None
        if not _passes_through(node):
            # Numbered after its inputs: sources first, the output last, as TF numbers the nodes it adds.
            name, counter_prefix = _names(self._stats, f"{LATENCY_ALL_EDGES_TAG}{_DELIMITER}"
                                                       f"{type(node).__name__}/_{self._position}")
            self._position += 1
            key = (_LATENCY, name, counter_prefix)
        stand_in = _stand_in_class(type(node)).__new__(_stand_in_class(type(node)))
        object.__setattr__(stand_in, "_stats_edge", _Edge(node, overrides, key, self._aggregator))
        self._memo[id(node)] = stand_in
        return stand_in

    def _wrap_nested(self, value: Any) -> Any:
        from dataservice.data.dataset import Dataset

        if isinstance(value, Dataset):
            return self.wrap(value)
        if isinstance(value, dict):
            return type(value)((k, self._wrap_nested(v)) for k, v in value.items())
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(self._wrap_nested(v) for v in value))
        if isinstance(value, (tuple, list)):
            return type(value)(self._wrap_nested(v) for v in value)
        return value


def _holds_input(value: Any, inputs: dict) -> bool:
    # Only small containers are searched (zip's structure): a node's list of elements (a cache) is not.
    if isinstance(value, dict):
        value = list(value.values())
    if len(value) > 1024:
        return False
    return any(id(v) in inputs or (isinstance(v, (tuple, list, dict)) and _holds_input(v, inputs)) for v in value)


def _passes_through(node: Any) -> bool:
    """Nodes not timed: ``with_options`` (no work of its own) and the stats transformations."""
    from dataservice.data.transformations import _OptionsDataset

    return isinstance(node, _OptionsDataset) or getattr(node, "_is_stats_node", False)


def _original(node: Any) -> Any:
    edge = _edge_of(node)
    return node if edge is None else edge.node


def _edge_of(node: Any) -> Optional[_Edge]:
    try:
        return object.__getattribute__(node, "_stats_edge")
    except AttributeError:
        return None


_STAND_IN_CLASSES: dict[type, type] = {}
_STAND_IN_LOCK = threading.Lock()


def _stand_in_class(cls: type) -> type:
    """A subclass of ``cls`` whose instances stand in for one node of ``cls`` (see instrumented_iterator)."""
    with _STAND_IN_LOCK:
        found = _STAND_IN_CLASSES.get(cls)
        if found is not None:
            return found

        def __getattribute__(self, name):
            if name == "__class__":
                return cls  # what pickle checks a reduction against: the stand-in pickles as its node
            edge = object.__getattribute__(self, "_stats_edge")
            overrides = edge.overrides
            if name in overrides:
                return overrides[name]
            attributes = edge.node.__dict__
            if name in attributes:
                return attributes[name]
            return object.__getattribute__(self, name)

        def __setattr__(self, name, value):
            # Iteration state (a cache's contents, an epoch counter) belongs to the node.
            setattr(object.__getattribute__(self, "_stats_edge").node, name, value)

        def _iterator(self, ctx):
            edge = object.__getattribute__(self, "_stats_edge")
            it = cls._iterator(self, ctx)
            if edge.key is None:
                return it
            # The timing holds nothing between elements: the position is the node's own iterator's, which
            # then saves and restores as it would untimed (the state is the same with or without timing).
            from dataservice.data.transformations.common import later

            return Follows(_latency(later(it), edge.aggregator, edge.key), it, self)

        def __reduce_ex__(self, protocol):
            # Pickled (a fingerprint, a snapshot's path) as the node it stands for, to the same bytes.
            return object.__getattribute__(self, "_stats_edge").node.__reduce_ex__(protocol)

        stand_in = type(cls.__name__, (cls,), {
            "__slots__": ("_stats_edge",), "__getattribute__": __getattribute__, "__setattr__": __setattr__,
            "_iterator": _iterator, "__reduce_ex__": __reduce_ex__, "__module__": cls.__module__,
            "__qualname__": cls.__qualname__})
        _STAND_IN_CLASSES[cls] = stand_in
        return stand_in


def without_aggregator(options: Any) -> Any:
    """``options`` recording nothing: for runs that are not the pipeline's own (``element_spec`` reading a
    first element), which must not count in its statistics. ``options`` itself is unchanged.

    Example::

        >>> without_aggregator(options).experimental_stats.aggregator is None
        True
    """
    if options.experimental_stats.aggregator is None:
        return options
    out = options.merge(type(options)())  # a writable copy, whatever ``options`` is
    quiet = copy.copy(out.experimental_stats)
    object.__setattr__(quiet, "aggregator", None)  # past the read-only check: this copy is ours
    object.__setattr__(out, "experimental_stats", quiet)
    return out


