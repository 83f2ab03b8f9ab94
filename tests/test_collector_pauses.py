"""The dispatcher process asks for full garbage collections rarely (``dispatcher/collector_pauses.py``); its
young collections are CPython's defaults, so what dies young (gRPC's cycles) is still freed at once. Each full
collection it still makes is timed (``FullCollections``), and shown on ``/metrics`` and ``/status.json``."""

from __future__ import annotations

import gc

from dataservice.dispatcher.collector_pauses import (FULL_COLLECTION_EVERY, PAUSE_BOUNDS_S, FullCollections,
                                                     reduce_full_collections)


def test_full_collections_are_asked_for_rarely_and_young_ones_as_before():
    before = gc.get_threshold()
    try:
        reduce_full_collections()
        assert gc.get_threshold() == (before[0], before[1], FULL_COLLECTION_EVERY)
        assert FULL_COLLECTION_EVERY >= 100 * before[2] // 10  # at least 10x rarer than the default's 10
        # Cycles that die young are still collected by the young generations.
        class Node:
            pass

        gc.collect()
        for _ in range(5_000):
            a, b = Node(), Node()
            a.other, b.other = b, a
        del a, b
        gc.collect(1)  # a young collection, not a full one, frees nearly all: those that died young
        left = sum(1 for o in gc.get_objects() if type(o) is Node)  # isinstance would wake lazy modules
        assert left <= 20, f"{left} of 10,000 cycles were left for a full collection"
    finally:
        gc.set_threshold(*before)


def test_full_collections_are_timed_and_young_ones_are_not():
    watch = FullCollections()
    watch.install()
    watch.install()  # idempotent: one callback
    try:
        gc.collect(0)
        gc.collect(1)
        assert watch.snapshot().pauses.count == 0
        garbage = []
        for _ in range(2_000):
            a, b = [], []
            a.append(b)
            b.append(a)
            garbage.append(a)
        del a, b, garbage
        gc.collect()  # a full collection: generation 2
        gc.collect(2)
        full = watch.snapshot()
        assert full.pauses.count == 2
        assert full.pauses.sum_s > 0 and [at for at, _, _ in full.recent] == sorted(at for at, _, _ in full.recent)
        assert full.recent[0][2] >= 4_000  # the first one collected the 2,000 cycles of two lists
        assert full.pauses.buckets[-1] == (float("inf"), 2)
        assert [bound for bound, _ in full.pauses.buckets[:-1]] == list(PAUSE_BOUNDS_S)
        assert all(earlier <= later for (_, earlier), (_, later) in zip(full.pauses.buckets, full.pauses.buckets[1:]))
    finally:
        watch.uninstall()
    gc.collect()
    assert watch.snapshot().pauses.count == 2  # uninstalled: no longer timed
