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
