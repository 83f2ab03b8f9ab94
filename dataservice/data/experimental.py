"""``dataservice.data.experimental``: the names of ``tf.data.experimental`` this library offers.

Statistics (see ``dataservice.data.stats``): ``StatsAggregator``, ``StatsOptions``, and the
``latency_stats`` / ``bytes_produced_stats`` transformations, used with ``Dataset.apply``;
``group_by_window`` (as ``Dataset.group_by_window``, for ``apply``); ``Optional`` (what
``iterator.get_next_as_optional()`` returns; ``tf.experimental.Optional``).

Example::

    >>> from dataservice.data import Dataset, Options
    >>> from dataservice.data import experimental
    >>> aggregator = experimental.StatsAggregator()
    >>> options = Options()
    >>> options.experimental_stats.aggregator = aggregator
    >>> ds = (Dataset.range(1000).map(lambda x: x * 2).apply(experimental.latency_stats("map"))
    ...       .batch(10).apply(experimental.bytes_produced_stats("batch")).with_options(options))
    >>> _ = list(ds)
    >>> summary = aggregator.get_summary()
    >>> summary.latency["map"].count, summary.bytes_produced["batch"].sum
    (1000, 8000)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from dataservice.data.checkpoint import Follows
from dataservice.data.dataset import Dataset, IteratorContext
from dataservice.data.iterators import Optional
from dataservice.data.stats import StatsAggregator, StatsOptions, record_bytes, record_latency
from dataservice.data.transformations import _UnaryDataset
from dataservice.data.transformations.common import later
from dataservice.data.transformations.windowing import group_by_window

__all__ = ["Optional", "StatsAggregator", "StatsOptions", "bytes_produced_stats", "group_by_window",
           "latency_stats"]


def _check_tag(tag: Any) -> str:
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str, got {type(tag).__name__}")
    if not tag:
        raise ValueError("tag must not be empty: it names the statistic")
    return tag


class _StatsDataset(_UnaryDataset):
    """Its input's elements unchanged; recording into the pipeline's aggregator, if it has one."""

    _is_stats_node = True  # latency_all_edges does not time these: they are measurements themselves
    _record: Callable = None

    def __init__(self, input_dataset: Dataset, tag: str):
        super().__init__(input_dataset)
        self._tag = _check_tag(tag)

    def _describe(self) -> str:
        return f"{self._op_name}({self._tag!r})"

    def _iterator(self, ctx: IteratorContext) -> Iterator:
        it = self._input._iterator(ctx)
        stats = ctx.options.experimental_stats
        if stats.aggregator is None:
            return it  # no aggregator: no work at all per element
        # It records and passes elements on: its position is its input's.
        return Follows(type(self)._record(later(it), stats.aggregator, stats, self._tag), it, self._input)


class LatencyStatsDataset(_StatsDataset):
    _op_name = "latency_stats"
    _record = staticmethod(record_latency)


class BytesProducedStatsDataset(_StatsDataset):
    _op_name = "bytes_produced_stats"
    _record = staticmethod(record_bytes)


def latency_stats(tag: str) -> Callable[[Dataset], Dataset]:
    """A transformation (for ``Dataset.apply``) recording, per element, how long its input took to
    produce it (microseconds, everything upstream included) under the name ``tag`` in the pipeline's
    ``StatsAggregator`` (``Options.experimental_stats.aggregator``); elements pass unchanged.

    Example::

        >>> ds = Dataset.range(10).map(f).apply(latency_stats("after_map")).with_options(options)
    """
    _check_tag(tag)

    def apply(dataset: Dataset) -> Dataset:
        return LatencyStatsDataset(dataset, tag)

    return apply


def bytes_produced_stats(tag: str) -> Callable[[Dataset], Dataset]:
    """A transformation (for ``Dataset.apply``) recording the size in bytes of each element (see
    ``stats.element_bytes``) under the name ``tag`` in the pipeline's ``StatsAggregator``; elements
    pass unchanged.

    Example::

        >>> ds = Dataset.range(10).batch(5).apply(bytes_produced_stats("batch")).with_options(options)
    """
    _check_tag(tag)

    def apply(dataset: Dataset) -> Dataset:
        return BytesProducedStatsDataset(dataset, tag)

    return apply
