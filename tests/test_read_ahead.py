"""The reader's adaptive read-ahead (dataservice/client/read_ahead.py), without a network: it starts
small, doubles while the consumer keeps up, follows consumption rate x round trip, and never passes
max_outstanding_requests. Shared jobs end to end: tests/test_shared_jobs.py."""

from __future__ import annotations

import pytest

from dataservice.client.read_ahead import INITIAL_READ_AHEAD, MIN_RATE_INTERVAL_S, SAFETY_FACTOR, ReadAhead


def test_starts_small_and_within_the_bound():
    assert ReadAhead(1024).limit == INITIAL_READ_AHEAD
    assert ReadAhead(3).limit == 3  # never more than max_outstanding_requests
    assert ReadAhead(1).limit == 1


def test_does_not_grow_before_a_first_answer():
    # The first request may wait for the task's pipeline to start: waiting then says nothing.
    ahead = ReadAhead(1024)
    for k in range(10):
        assert ahead.waited(now=k * 0.01) == INITIAL_READ_AHEAD


def test_a_consumer_that_keeps_up_reaches_large_requests_in_a_few_round_trips():
    ahead = ReadAhead(1024)
    rtt, now, taken = 0.001, 0.0, 0
    round_trips = 0
    while ahead.limit < 1024:
        # Each round trip brings what was asked for; the consumer takes it all and waits for more.
        now += rtt
        ahead.answered(rtt, carried_elements=True, taken=taken, now=now)
        taken += ahead.limit
        ahead.waited(now)
        round_trips += 1
        assert round_trips <= 8, ahead.limit
    assert ahead.waited(now + 1.0) == 1024  # the bound holds however long it keeps up


def test_grows_at_most_once_per_round_trip():
    ahead = ReadAhead(1024)
    ahead.answered(0.010, carried_elements=True, taken=0, now=0.0)
    assert ahead.waited(now=0.001) == 2 * INITIAL_READ_AHEAD
    # Waits within the same round trip: the answer to the larger request has not come yet.
    assert ahead.waited(now=0.005) == 2 * INITIAL_READ_AHEAD
    assert ahead.waited(now=0.0105) == 2 * INITIAL_READ_AHEAD
    assert ahead.waited(now=0.0111) == 4 * INITIAL_READ_AHEAD


def test_falls_to_what_a_slow_consumer_needs_and_no_lower_than_the_start():
    ahead = ReadAhead(1024)
    ahead.limit = 1024  # say it was fast before
    rtt, now, taken = 0.010, 0.0, 0
    ahead.answered(rtt, carried_elements=True, taken=taken, now=now)
    seen = [ahead.limit]
    for _ in range(20):
        # 1,000 elements/s and never kept waiting: rate x round trip x safety = 20 elements.
        now += 0.020
        taken += 20
        seen.append(ahead.answered(rtt, carried_elements=True, taken=taken, now=now))
    assert seen[1] == 512  # at most halving per measurement
    assert ahead.limit == round(1000 * rtt * SAFETY_FACTOR) == 20
    # A consumer that all but stops: the read-ahead stays at the start, not zero.
    for _ in range(20):
        now += 1.0
        taken += 1
        ahead.answered(rtt, carried_elements=True, taken=taken, now=now)
    assert ahead.limit == INITIAL_READ_AHEAD


def test_does_not_fall_while_the_consumer_waits():
    ahead = ReadAhead(1024)
    ahead.limit = 256
    ahead.answered(0.001, carried_elements=True, taken=0, now=0.0)
    ahead.waited(now=0.0)
    # The measured rate is low only because the consumer had nothing to take.
    assert ahead.answered(0.001, carried_elements=True, taken=1, now=0.010) >= 256


def test_rises_with_the_round_trip():
    ahead = ReadAhead(1024)
    now, taken = 0.0, 0
    ahead.answered(0.001, carried_elements=True, taken=taken, now=now)
    for _ in range(40):
        # 10,000 elements/s, round trips of 10 ms: 10,000 x 0.010 x 2 = 200 elements.
        now += 0.010
        taken += 100
        ahead.answered(0.010, carried_elements=True, taken=taken, now=now)
    assert ahead.round_trip_s == pytest.approx(0.010)
    assert ahead.limit == pytest.approx(10_000 * 0.010 * SAFETY_FACTOR, rel=0.01)


def test_an_empty_long_poll_is_not_a_round_trip():
    ahead = ReadAhead(1024)
    ahead.answered(0.002, carried_elements=True, taken=0, now=0.0)
    ahead.answered(0.500, carried_elements=False, taken=0, now=0.5)  # a worker with nothing ready
    assert ahead.round_trip_s == 0.002


def test_a_bursty_consumer_keeps_its_burst_rate():
    # A client-side batch(100) every 100 ms: bursts of 100 elements in 5 ms. The read-ahead must
    # cover a burst's round trip, not the average rate.
    ahead = ReadAhead(1024)
    rtt = 0.005
    ahead.answered(rtt, carried_elements=True, taken=0, now=0.0)
    now, taken = 0.0, 0
    for _ in range(3):
        now += MIN_RATE_INTERVAL_S
        taken += 100  # the burst
        ahead.answered(rtt, carried_elements=True, taken=taken, now=now)
        now += 0.095  # the step between batches
        ahead.answered(rtt, carried_elements=True, taken=taken, now=now)
    assert ahead.rate == pytest.approx(100 / MIN_RATE_INTERVAL_S)
    assert ahead.limit >= 100 / MIN_RATE_INTERVAL_S * rtt


@pytest.mark.parametrize("kwargs, message", [
    (dict(most=0), "most elements to read ahead must be a positive integer, got 0"),
    (dict(most=1.5), "got 1.5"),
    (dict(most=8, initial=0), "initial read-ahead must be a positive integer, got 0"),
    (dict(most=8, safety=0.5), "safety factor must be at least 1, got 0.5"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        ReadAhead(**kwargs)
