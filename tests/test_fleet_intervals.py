"""Heartbeat intervals stretch with the fleet, never past the failure-detection budget."""

from __future__ import annotations

from dataservice.dispatcher import fleet_intervals
from dataservice.dispatcher.core import heartbeat_wait_s
from dataservice.proto import dispatcher_pb2
from dataservice.service.config import DispatcherConfig


def test_a_small_fleet_keeps_the_defaults():
    assert fleet_intervals.client_heartbeat_s(readers=10, client_timeout_ms=60_000) == 1.0
    assert fleet_intervals.worker_poll_s(asked_s=1.0, workers=10, worker_timeout_ms=10_000) == 1.0
    # A short client timeout shortens the interval, as before.
    assert fleet_intervals.client_heartbeat_s(readers=10, client_timeout_ms=400) == 0.1


def test_a_large_fleet_stretches_them_within_the_timeouts():
    readers = 10 * fleet_intervals.CLIENT_HEARTBEATS_PER_S
    assert fleet_intervals.client_heartbeat_s(readers, client_timeout_ms=60_000) == 10.0
    assert fleet_intervals.client_heartbeat_s(100 * readers, client_timeout_ms=60_000) == 15.0  # a quarter
    workers = 2 * fleet_intervals.WORKER_POLLS_PER_S
    assert fleet_intervals.worker_poll_s(1.0, workers, worker_timeout_ms=10_000) == 2.0
    assert fleet_intervals.worker_poll_s(1.0, 100 * workers, worker_timeout_ms=10_000) == 5.0  # a half


def test_a_heartbeat_that_asks_not_to_wait_is_answered_at_once():
    config = DispatcherConfig()
    assert heartbeat_wait_s(dispatcher_pb2.WorkerHeartbeatRequest(wait_ms=0), config, workers=10_000) == 0.0
    assert heartbeat_wait_s(dispatcher_pb2.WorkerHeartbeatRequest(wait_ms=500), config, workers=1) == 0.5
    # However long it asks, well before the worker could look lost.
    assert heartbeat_wait_s(dispatcher_pb2.WorkerHeartbeatRequest(wait_ms=600_000), config) == \
        config.worker_timeout_ms / 2000


def test_a_poll_is_spread_longer_at_random_never_shorter_nor_past_the_budget():
    spread = fleet_intervals.POLL_SPREAD
    assert fleet_intervals.worker_poll_s(1.0, 10, worker_timeout_ms=10_000, spread=0.0) == 1.0
    assert fleet_intervals.worker_poll_s(1.0, 10, worker_timeout_ms=10_000, spread=1.0) == 1.0 + spread
    workers = 4 * fleet_intervals.WORKER_POLLS_PER_S
    assert fleet_intervals.worker_poll_s(1.0, workers, worker_timeout_ms=10_000, spread=0.5) == 4.0 * (1 + spread / 2)
    assert fleet_intervals.worker_poll_s(1.0, workers, worker_timeout_ms=8_000, spread=0.0) == 4.0  # half of 8 s
    # At that cap the spread goes below it: polls all held to the cap would end together.
    assert fleet_intervals.worker_poll_s(1.0, workers, worker_timeout_ms=8_000, spread=1.0) == 4.0 * (1 - spread / 2)
    assert fleet_intervals.worker_poll_s(3.9, workers, worker_timeout_ms=8_000, spread=1.0) == 3.9  # what it asked
    assert fleet_intervals.worker_poll_s(9.0, workers, worker_timeout_ms=8_000, spread=1.0) == 4.0  # however long
    assert heartbeat_wait_s(dispatcher_pb2.WorkerHeartbeatRequest(wait_ms=1000), DispatcherConfig(), 1, 1.0) == \
        1.0 + spread


def test_the_poll_after_news_is_spread_from_what_was_asked_to_the_longest_wait():
    # 2,000 workers answered together by a new job: their next polls spread over 1-5 s, not 3.75-5 s, so
    # that they do not end in one wave round after round.
    waits = [fleet_intervals.worker_poll_s(1.0, 2_000, 10_000, spread=s / 10, after_news=True) for s in range(11)]
    assert waits[0] == 1.0 and waits[-1] == 5.0 and waits == sorted(waits)
    usual = [fleet_intervals.worker_poll_s(1.0, 2_000, 10_000, spread=s / 10) for s in range(11)]
    assert min(usual) == 3.75 and max(usual) == 5.0
    # A small fleet's range is the usual one: asked, up to POLL_SPREAD longer.
    assert fleet_intervals.worker_poll_s(1.0, 10, 10_000, spread=1.0, after_news=True) == 1.5
    assert fleet_intervals.worker_poll_s(1.0, 10, 10_000, spread=0.0, after_news=True) == 1.0
    # Never past the failure-detection budget, never shorter than asked.
    assert fleet_intervals.worker_poll_s(4.0, 10, 6_000, spread=1.0, after_news=True) == 3.0


def test_a_workers_next_poll_follows_its_news_once_and_only_soon_after():
    polls = fleet_intervals.PollsAfterNews()
    polls.answered("w1:1", news=True, now=100.0, workers=2)
    polls.answered("w2:1", news=False, now=100.0, workers=2)
    assert polls.follows_news("w1:1", now=100.5)
    assert not polls.follows_news("w1:1", now=100.6)  # read once
    assert not polls.follows_news("w2:1", now=100.5)  # its answer had no news
    polls.answered("w1:1", news=True, now=200.0, workers=2)
    assert not polls.follows_news("w1:1", now=200.0 + fleet_intervals.AFTER_NEWS_S + 1)  # long after
    for i in range(2_000):  # workers that never poll again do not pile up
        polls.answered(f"gone{i}:1", news=True, now=300.0, workers=2)
    assert len(polls._news_at) <= 2 * 2 + 1_000 + 1
