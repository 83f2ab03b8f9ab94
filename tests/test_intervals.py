"""OffsetSet: the sets of delivered offsets, against a plain Python set of the same offsets."""

from __future__ import annotations

import random

import pytest

from dataservice.service.intervals import OffsetSet

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc


def offsets(s: OffsetSet) -> set[int]:
    return {x for start, end in s.ranges for x in range(start, end)}


def random_ranges(rng: random.Random) -> list[tuple[int, int]]:
    # Empty and inverted ranges included: they add nothing.
    return [(a, a + rng.randint(-2, 8)) for a in (rng.randint(0, 80) for _ in range(rng.randint(0, 15)))]


@pytest.mark.parametrize("seed", range(20))
def test_building_adding_and_merging_agree_with_a_set(seed):
    rng = random.Random(seed)
    for _ in range(100):
        ranges = random_ranges(rng)
        expected = {x for a, b in ranges for x in range(a, b)}
        built = OffsetSet(ranges)
        added = OffsetSet()
        for a, b in ranges:
            added.add(a, b)
        merged = OffsetSet(ranges[::2])
        merged.update(OffsetSet(ranges[1::2]))
        for s in (built, added, merged):
            assert offsets(s) == expected
            assert s == built  # one canonical form: sorted, disjoint, touching ranges joined
            starts_ends = s.flat()
            assert all(starts_ends[i] < starts_ends[i + 1] for i in range(len(starts_ends) - 1))
        assert OffsetSet.from_flat(built.flat()) == built
        probe = rng.randint(0, 90)
        assert (probe in built) == (probe in expected)
        lo, hi = sorted((rng.randint(0, 90), rng.randint(0, 90)))
        gaps = {x for a, b in built.missing(lo, hi) for x in range(a, b)}
        assert gaps == set(range(lo, hi)) - expected
        assert len(built) == len(expected)


def test_ranges_in_any_order_give_the_same_set():
    forward = [(2 * i, 2 * i + 1) for i in range(1000)]
    assert OffsetSet(forward) == OffsetSet(reversed(forward)) == OffsetSet(random.Random(1).sample(forward, 1000))
    assert OffsetSet([(0, 5), (5, 9), (3, 4)]).ranges == [(0, 9)]
    assert OffsetSet([(0, 5), (5, 9)]).covers(9) and not OffsetSet([(0, 5), (6, 9)]).covers(9)
