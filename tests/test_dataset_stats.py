"""Pipeline statistics: StatsAggregator, StatsOptions, latency_stats, bytes_produced_stats, latency_all_edges.

No assertion on how long anything took: counts, bytes and names are exact, percentiles are checked on
known values through the histogram, latencies only for consistency (ordered percentiles, sum = mean * count).
"""

from __future__ import annotations

import gc
import json
import math
import pickle
import threading

import cloudpickle
import numpy as np
import pytest

from dataservice.data import Dataset, Options, dataset_fingerprint, deserialize_dataset, serialize_dataset
from dataservice.data import experimental, stats
from dataservice.data.experimental import StatsAggregator, StatsOptions, bytes_produced_stats, latency_stats
from dataservice.data.stats import EXACT_BELOW, NUM_BUCKETS, Histogram, element_bytes

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

WAIT = 60  # seconds: a bound on thread joins that a working pipeline meets at once


def stats_options(aggregator=None, all_edges=None, prefix=None, counter_prefix=None) -> Options:
    options = Options()
    options.experimental_stats.aggregator = aggregator
    options.experimental_stats.latency_all_edges = all_edges
    options.experimental_stats.prefix = prefix
    options.experimental_stats.counter_prefix = counter_prefix
    return options


def nearest_rank(values, q):
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


# --- the histogram ---------------------------------------------------------------------------------
def test_histogram_exact_below_64():
    h = Histogram()
    values = [5, 1, 63, 0, 17, 17, 40, 2, 9, 33]
    for v in values:
        h.record(v)
    assert (h.count, h.sum, h.min, h.max) == (10, sum(values), 0, 63)
    for q in (0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0):
        assert h.percentile(q) == nearest_rank(values, q)
    assert h.percentile(0) == 0
    assert h.buckets() == [(0, 0, 1), (1, 1, 1), (2, 2, 1), (5, 5, 1), (9, 9, 1), (17, 17, 2), (33, 33, 1),
                           (40, 40, 1), (63, 63, 1)]


def test_histogram_percentiles_within_a_bucket_above_64():
    h = Histogram()
    values = [1000 + 37 * i for i in range(200)] + [10 ** 9, 123_456_789]
    for v in values:
        h.record(v)
    assert h.count == len(values) and h.sum == sum(values)
    for q in (0.5, 0.9, 0.99, 1.0):
        exact = nearest_rank(values, q)
        got = h.percentile(q)
        lo, hi = stats._bucket_bounds(stats._bucket(exact))
        assert lo <= got <= hi  # the middle of the true value's bucket (clamped to min/max)
        assert abs(got - exact) <= exact / 64
    assert h.percentile(1.0) == 10 ** 9  # clamped to the max, exact


def test_histogram_buckets_partition_the_integers():
    previous_hi = -1
    for i in range(NUM_BUCKETS):
        lo, hi = stats._bucket_bounds(i)
        assert lo == previous_hi + 1
        assert stats._bucket(lo) == i and stats._bucket(hi) == i
        previous_hi = hi
    assert previous_hi == 2 ** 63 - 1
    assert [stats._bucket_bounds(i) for i in range(EXACT_BELOW)] == [(i, i) for i in range(EXACT_BELOW)]


def test_histogram_merge_equals_recording_both():
    a, b, both = Histogram(), Histogram(), Histogram()
    for v in range(0, 5000, 7):
        a.record(v)
        both.record(v)
    for v in range(3, 90000, 101):
        b.record(v)
        both.record(v)
    a.merge(b)
    assert a.counts == both.counts and a.acc == both.acc
    a.merge(Histogram())  # an empty one changes nothing
    assert a.counts == both.counts and a.acc == both.acc


def test_histogram_empty_and_bad_values():
    h = Histogram()
    assert math.isnan(h.percentile(0.5)) and h.min is None and h.max is None and h.buckets() == []
    with pytest.raises(ValueError, match=">= 0"):
        h.record(-1)
    with pytest.raises(ValueError, match="quantile"):
        h.percentile(1.5)
    h.record(2 ** 70)  # counted as the largest value
    assert h.max == 2 ** 63 - 1 and h.counts[NUM_BUCKETS - 1] == 1


# --- bytes_produced_stats: exact sizes -------------------------------------------------------------
def test_element_bytes():
    assert element_bytes(np.zeros((2, 3), np.float32)) == 24
    assert element_bytes(np.int64(1)) == 8 and element_bytes(np.int16(1)) == 2 and element_bytes(np.bool_(True)) == 1
    assert element_bytes(b"abc") == 3 and element_bytes("héllo") == 6 and element_bytes(np.bytes_(b"ab")) == 2
    assert element_bytes(np.array([b"ab", "cé"], dtype=object)) == 5
    assert element_bytes((np.zeros(4, np.uint8), {"a": b"xy", "b": (np.float64(1), "z")})) == 4 + 2 + 8 + 1
    assert element_bytes([1, 2.5, True]) == 8 + 8 + 1
    assert element_bytes(None) == 0 and element_bytes(Dataset.range(3)) == 0


def test_bytes_produced_exact_and_percentiles_match_the_histogram():
    aggregator = StatsAggregator()
    ds = (Dataset.range(1, 101).map(lambda n: np.zeros(n, np.uint8)).apply(bytes_produced_stats("sizes"))
          .with_options(stats_options(aggregator)))
    assert [len(x) for x in ds] == list(range(1, 101))  # elements unchanged
    s = aggregator.get_summary().bytes_produced["sizes"]
    expected = Histogram()
    for v in range(1, 101):
        expected.record(v)
    assert (s.name, s.unit, s.count, s.sum, s.min, s.max, s.mean) == ("sizes", "bytes", 100, 5050, 1, 100, 50.5)
    assert (s.p50, s.p90, s.p99) == (expected.percentile(0.5), expected.percentile(0.9), expected.percentile(0.99))
    assert s.p50 == 50  # below 64: exact
    assert sum(n for _, _, n in s.buckets) == 100
    assert aggregator.get_summary().counters == {"/dataservice/sizes/bytes": 5050}
    assert aggregator.get_summary().latency == {}


def test_bytes_of_batches_and_strings():
    aggregator = StatsAggregator()
    ds = (Dataset.from_tensor_slices((np.arange(10, dtype=np.int32), np.array([b"a" * i for i in range(10)],
                                                                            dtype=object)))
          .batch(4).apply(bytes_produced_stats("b")).with_options(stats_options(aggregator)))
    list(ds)
    s = aggregator.get_summary().bytes_produced["b"]
    # batches of 4, 4, 2 int32 (16, 16, 8 bytes) and strings of lengths 0+1+2+3, 4+5+6+7, 8+9
    assert s.count == 3 and s.sum == (16 + 6) + (16 + 22) + (8 + 17) and (s.min, s.max) == (22, 38)


# --- latency_stats --------------------------------------------------------------------------------
def test_latency_counts_are_exact_and_percentiles_consistent():
    aggregator = StatsAggregator()
    ds = Dataset.range(1000).map(lambda x: x * 2).apply(latency_stats("map")).with_options(stats_options(aggregator))
    assert [int(x) for x in ds] == list(range(0, 2000, 2))
    s = aggregator.get_summary().latency["map"]
    assert s.unit == "us" and s.count == 1000
    assert 0 <= s.min <= s.p50 <= s.p90 <= s.p99 <= s.max
    assert math.isclose(s.mean * s.count, s.sum)
    assert sum(n for _, _, n in s.buckets) == 1000
    assert aggregator.get_summary().counters == {"/dataservice/map/elements": 1000}
    list(ds)  # a second epoch adds up
    assert aggregator.get_summary().latency["map"].count == 2000


def test_stats_transformations_keep_cardinality_and_spec():
    ds = Dataset.range(10).batch(3).apply(latency_stats("a")).apply(bytes_produced_stats("b"))
    assert ds.cardinality() == 4
    assert ds.element_spec == Dataset.range(10).batch(3).element_spec
    assert repr(ds) == "<bytes_produced_stats('b')>"


def test_one_aggregator_for_several_pipelines_adds_up_per_name():
    aggregator = StatsAggregator()
    options = stats_options(aggregator)
    list(Dataset.range(7).apply(latency_stats("t")).with_options(options))
    list(Dataset.range(5).map(lambda x: x + 1).apply(latency_stats("t")).with_options(options))
    list(Dataset.range(3).apply(latency_stats("u")).with_options(options))
    summary = aggregator.get_summary()
    assert {k: v.count for k, v in summary.latency.items()} == {"t": 12, "u": 3}
    assert summary.counters == {"/dataservice/t/elements": 12, "/dataservice/u/elements": 3}


def test_summary_includes_iterators_still_running_and_abandoned_ones():
    aggregator = StatsAggregator()
    ds = Dataset.range(100).apply(latency_stats("t")).with_options(stats_options(aggregator))
    it = iter(ds)
    for _ in range(5):
        next(it)
    assert aggregator.get_summary().latency["t"].count == 5
    del it
    gc.collect()
    assert aggregator.get_summary().latency["t"].count == 5
    assert not aggregator._live  # the abandoned iterator's histogram was merged and let go


def test_bad_tags():
    with pytest.raises(TypeError, match="tag must be a str"):
        latency_stats(3)
    with pytest.raises(ValueError, match="tag must not be empty"):
        bytes_produced_stats("")


# --- off means no work ------------------------------------------------------------------------------
def _iterator_code(ds):
    it = iter(ds)._it
    return getattr(it, "_elements", it).gi_code  # a checkpoint.Follows runs its node's generator


def test_without_aggregator_stats_add_no_iterator():
    plain = Dataset.range(10).map(lambda x: x)
    with_stats = plain.apply(latency_stats("t")).apply(bytes_produced_stats("b"))
    # The stats nodes hand out the map's own iterator: not one step more per element.
    assert _iterator_code(with_stats) is _iterator_code(plain)
    # latency_all_edges without an aggregator inserts nothing either; an aggregator with nothing to record neither.
    assert _iterator_code(plain.with_options(stats_options(all_edges=True))) is _iterator_code(plain)
    assert _iterator_code(plain.with_options(stats_options(StatsAggregator()))) is _iterator_code(plain)
    # With an aggregator, the recorder is there.
    recorded = with_stats.with_options(stats_options(StatsAggregator()))
    assert _iterator_code(recorded) is not _iterator_code(plain)
    assert _iterator_code(recorded).co_name == "_bytes"


# --- latency_all_edges -----------------------------------------------------------------------------
def test_latency_all_edges_times_every_transformation():
    aggregator = StatsAggregator()
    ds = (Dataset.range(10).map(lambda x: x + 1).apply(latency_stats("t")).batch(3)
          .with_options(stats_options(aggregator, all_edges=True)))
    assert [b.tolist() for b in ds] == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]
    counts = {k: v.count for k, v in aggregator.get_summary().latency.items()}
    # Numbered from the source; with_options and the stats transformation itself are not timed.
    assert counts == {"record_latency::RangeDataset/_0": 10, "record_latency::MapDataset/_1": 10,
                      "record_latency::BatchDataset/_2": 4, "t": 10}


def test_latency_all_edges_over_zip_concatenate_and_prefetch():
    aggregator = StatsAggregator()
    a = Dataset.range(4)
    ds = (Dataset.zip((a, a.map(lambda x: -x))).concatenate(Dataset.from_tensors((np.int64(9), np.int64(9))))
          .prefetch(2).with_options(stats_options(aggregator, all_edges=True)))
    assert [(int(x), int(y)) for x, y in ds] == [(0, 0), (1, -1), (2, -2), (3, -3), (9, 9)]
    counts = {k: v.count for k, v in aggregator.get_summary().latency.items()}
    # a is one node read twice (zip's two inputs): one name, both readings counted
    assert counts == {"record_latency::RangeDataset/_0": 8, "record_latency::MapDataset/_1": 4,
                      "record_latency::ZipDataset/_2": 4, "record_latency::TensorsDataset/_3": 1,
                      "record_latency::ConcatenateDataset/_4": 5, "record_latency::PrefetchDataset/_5": 5}


def test_latency_all_edges_leaves_the_pipeline_and_its_state_alone():
    aggregator = StatsAggregator()
    source = Dataset.range(20)
    mapped = source.map(lambda x: x * 3)
    cached = mapped.cache()
    ds = cached.shuffle(20, seed=7).with_options(stats_options(aggregator, all_edges=True))
    before = serialize_dataset(ds)
    reference = cached.shuffle(20, seed=7)
    for _ in range(3):  # reshuffled each epoch, as without statistics: the epoch counter is the node's
        assert [int(x) for x in ds] == [int(x) for x in reference]
    assert serialize_dataset(ds) == before
    assert ds._input._input is cached and cached._input is mapped and type(cached).__name__ == "CacheDataset"
    counts = {k: v.count for k, v in aggregator.get_summary().latency.items()}
    # The cache filled on the first epoch is the node's own: later epochs read it, never the map.
    assert counts["record_latency::RangeDataset/_0"] == 20 and counts["record_latency::MapDataset/_1"] == 20
    assert counts["record_latency::CacheDataset/_2"] == 60 and counts["record_latency::ShuffleDataset/_3"] == 60
    assert cached._memory is not None


def test_latency_all_edges_pickles_nodes_as_themselves(tmp_path):
    from dataservice.data import snapshot

    upstream = Dataset.range(100).map(lambda x: x + 1)
    assert sum(int(x) for x in upstream.apply(snapshot(str(tmp_path)))) == 5050
    written = sorted(p.name for p in tmp_path.iterdir())
    aggregator = StatsAggregator()
    # The snapshot names its directory by a fingerprint of its (timed) input: the same one, so it is reused.
    timed = upstream.apply(snapshot(str(tmp_path))).with_options(stats_options(aggregator, all_edges=True))
    assert sum(int(x) for x in timed) == 5050
    assert sorted(p.name for p in tmp_path.iterdir()) == written
    assert {k: v.count for k, v in aggregator.get_summary().latency.items()} == {
        "record_latency::SnapshotDataset/_2": 100}  # read from the snapshot: range and map did not run


def test_latency_all_edges_errors_pass_unchanged():
    aggregator = StatsAggregator()
    ds = Dataset.range(10).map(lambda x: 1 // (int(x) - 5)).with_options(stats_options(aggregator, all_edges=True))
    with pytest.raises(ZeroDivisionError, match=r"by zero \[raised in Dataset.map\(.*<lambda>\)\]"):
        list(ds)
    counts = {k: v.count for k, v in aggregator.get_summary().latency.items()}
    assert counts == {"record_latency::RangeDataset/_0": 6, "record_latency::MapDataset/_1": 5}


def test_latency_all_edges_over_distributed_epoch_splits():
    aggregator = StatsAggregator()
    ds = Dataset.range(1000).map(lambda x: x + 1).with_options(stats_options(aggregator, all_edges=True))
    n = ds.num_splits()
    got = [int(x) for x in ds.iterate_splits(range(0, n, 2))]
    assert got == [int(x) for x in Dataset.range(1000).map(lambda x: x + 1).iterate_splits(range(0, n, 2))]
    assert aggregator.get_summary().latency["record_latency::MapDataset/_1"].count == len(got)


# --- names: prefix and counter_prefix -------------------------------------------------------------------
def test_prefix_and_counter_prefix():
    aggregator = StatsAggregator()
    ds = (Dataset.range(6).apply(latency_stats("t")).apply(bytes_produced_stats("t"))
          .with_options(stats_options(aggregator, all_edges=True, prefix="train", counter_prefix="/jobs/a")))
    list(ds)
    summary = aggregator.get_summary()
    assert sorted(summary.latency) == ["train::record_latency::RangeDataset/_0", "train::t"]
    assert sorted(summary.bytes_produced) == ["train::t"]
    assert summary.counters == {"/jobs/a/train::record_latency::RangeDataset/_0/elements": 6,
                                "/jobs/a/train::t/bytes": 48, "/jobs/a/train::t/elements": 6}


def test_stats_options_set_in_different_places_merge():
    aggregator = StatsAggregator()
    inner = Options()
    inner.experimental_stats.prefix = "p"
    ds = (Dataset.range(3).with_options(inner).apply(latency_stats("t"))
          .with_options(stats_options(aggregator, counter_prefix="c")))
    merged = ds.options().experimental_stats
    assert (merged.aggregator, merged.prefix, merged.counter_prefix, merged.latency_all_edges) == \
        (aggregator, "p", "c", None)
    list(ds)
    assert aggregator.get_summary().counters == {"c/p::t/elements": 3}


def test_stats_options_checks_and_equality():
    options = StatsOptions()
    with pytest.raises(TypeError, match="aggregator must be a StatsAggregator"):
        options.aggregator = object()
    with pytest.raises(TypeError, match="latency_all_edges must be a bool"):
        options.latency_all_edges = 1
    with pytest.raises(TypeError, match="prefix must be a str"):
        options.prefix = 3
    with pytest.raises(AttributeError, match="no option 'sample_rate'"):
        options.sample_rate = 1
    with pytest.raises(TypeError):
        Options().experimental_stats = object()
    aggregator = StatsAggregator()
    assert stats_options(aggregator, prefix="x") == stats_options(aggregator, prefix="x")
    assert stats_options(aggregator) != stats_options(StatsAggregator())
    assert Options() == Options() and Options().experimental_stats == StatsOptions()


# --- threads ---------------------------------------------------------------------------------------
def test_parallel_map_and_parallel_interleave_counts_exact():
    aggregator = StatsAggregator()
    ds = (Dataset.range(2000).map(lambda x: x * 2, num_parallel_calls=4).apply(latency_stats("map"))
          .with_options(stats_options(aggregator, all_edges=True)))
    assert sorted(int(x) for x in ds) == list(range(0, 4000, 2))
    # Inner datasets of a parallel interleave run on threads of their own, all recording "inner".
    inner = (Dataset.range(16).interleave(lambda i: Dataset.range(250).apply(latency_stats("inner"))
                                          .apply(bytes_produced_stats("inner")),
                                          cycle_length=8, num_parallel_calls=8)
             .with_options(stats_options(aggregator)))
    assert len(list(inner)) == 4000
    summary = aggregator.get_summary()
    assert summary.latency["map"].count == 2000
    assert summary.latency["record_latency::MapDataset/_1"].count == 2000
    assert summary.latency["inner"].count == 4000
    assert summary.bytes_produced["inner"].sum == 4000 * 8
    # five names; the 16 inner iterators were merged as they ended, not kept
    assert not aggregator._live and len(aggregator._done) == 5


def test_threads_iterating_one_pipeline_while_another_reads_summaries():
    aggregator = StatsAggregator()
    ds = (Dataset.range(3000).map(lambda x: x + 1).apply(latency_stats("t"))
          .with_options(stats_options(aggregator, all_edges=True)))
    stop = threading.Event()
    failures = []
    seen = []

    def iterate():
        try:
            seen.append(sum(1 for _ in ds))
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(exc)

    def summarize():
        try:
            while not stop.is_set():
                s = aggregator.get_summary()
                for h in s.latency.values():
                    assert h.count <= 8 * 3000
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(exc)

    reader = threading.Thread(target=summarize)
    reader.start()
    threads = [threading.Thread(target=iterate) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    stop.set()
    reader.join(WAIT)
    assert not failures and seen == [3000] * 8
    counts = {k: v.count for k, v in aggregator.get_summary().latency.items()}
    assert counts == {"t": 24000, "record_latency::RangeDataset/_0": 24000, "record_latency::MapDataset/_1": 24000}


# --- pickling -------------------------------------------------------------------------------------
def test_pipeline_with_stats_pickles_with_a_fresh_aggregator():
    aggregator = StatsAggregator()
    ds = (Dataset.range(50).map(lambda x: x + 1).apply(latency_stats("t")).apply(bytes_produced_stats("b"))
          .with_options(stats_options(aggregator, all_edges=True, prefix="p", counter_prefix="c")))
    fingerprint = dataset_fingerprint(serialize_dataset(ds))
    list(ds)
    # What was recorded is not part of the pipeline: same bytes, same dataset id.
    assert dataset_fingerprint(serialize_dataset(ds)) == fingerprint
    for copy in (pickle.loads(cloudpickle.dumps(ds)), deserialize_dataset(serialize_dataset(ds))):
        theirs = copy.options().experimental_stats
        assert theirs.aggregator is not aggregator and theirs.aggregator.get_summary().latency == {}
        assert (theirs.prefix, theirs.counter_prefix, theirs.latency_all_edges) == ("p", "c", True)
        assert [int(x) for x in copy] == list(range(1, 51))
        assert theirs.aggregator.get_summary().latency["p::t"].count == 50
    assert aggregator.get_summary().latency["p::t"].count == 50  # the original's untouched by the copies


def test_aggregator_pickles_empty_and_keeps_identity_within_a_pipeline():
    aggregator = StatsAggregator()
    list(Dataset.range(3).apply(latency_stats("t")).with_options(stats_options(aggregator)))
    assert pickle.loads(pickle.dumps(aggregator)).get_summary().counters == {}
    a = Dataset.range(2).with_options(stats_options(aggregator))
    b = Dataset.range(2).with_options(stats_options(aggregator))
    pair = pickle.loads(cloudpickle.dumps((a, b)))
    assert pair[0].options().experimental_stats.aggregator is pair[1].options().experimental_stats.aggregator


# --- the summary as data and as text ----------------------------------------------------------------
def test_summary_to_dict_and_table():
    aggregator = StatsAggregator()
    assert aggregator.get_summary().table() == "(no statistics recorded)"
    list(Dataset.range(1, 11).map(lambda n: np.zeros(n, np.uint8)).apply(latency_stats("lat"))
         .apply(bytes_produced_stats("size")).with_options(stats_options(aggregator)))
    summary = aggregator.get_summary()
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["bytes_produced"]["size"]["count"] == 10 and data["bytes_produced"]["size"]["sum"] == 55
    assert data["bytes_produced"]["size"]["mean"] == 5.5 and data["counters"]["/dataservice/size/bytes"] == 55
    assert data["latency"]["lat"]["unit"] == "us"
    lines = str(summary).splitlines()
    assert lines[0].split() == ["latency", "(us)", "count", "mean", "p50", "p90", "p99", "max"]
    assert lines[1].split()[:2] == ["lat", "10"]
    assert lines[2].split()[:2] == ["bytes", "produced"]
    assert lines[3].split() == ["size", "10", "5.50", "5", "9", "10", "10"]
    assert lines[4].split() == ["counter", "total"]
    assert lines[5].split() == ["/dataservice/lat/elements", "10"] and lines[6].split() == ["/dataservice/size/bytes",
                                                                                            "55"]


def test_experimental_namespace_exports_the_stats_names():
    assert {"StatsAggregator", "StatsOptions", "bytes_produced_stats", "latency_stats"} <= set(experimental.__all__)
    assert isinstance(Options().experimental_stats, experimental.StatsOptions)


def test_without_aggregator_leaves_the_options_alone():
    aggregator = StatsAggregator()
    options = stats_options(aggregator, all_edges=True, prefix="p")
    quiet = stats.without_aggregator(options)
    assert quiet.experimental_stats.aggregator is None and quiet.experimental_stats.prefix == "p"
    assert options.experimental_stats.aggregator is aggregator  # unchanged
    frozen = Dataset.range(3).with_options(options).options()  # read-only options work too
    assert stats.without_aggregator(frozen).experimental_stats.aggregator is None
    assert frozen.experimental_stats.aggregator is aggregator
    plain = Options()
    assert stats.without_aggregator(plain) is plain
