"""An epoch's edges (issue 28): what the worker and the reader wait for between two epochs.

A worker polls again at once after a lone piece of news (an epoch's tasks deleted, the next one's tasks), and
pauses only inside a burst of news; a reader reports a split end at once unless it sent a heartbeat within
``1 / MAX_HEARTBEATS_PER_S``. Both pauses are pure functions of two times, tested here without a network; the
cluster test reads epochs back to back, the path both serve, each exactly once.

Example::

    >>> news_pause_s(now=100.0, last_news_at=50.0)
    0.0
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dataservice import Dataset, distribute
from dataservice.client.reader import MAX_HEARTBEATS_PER_S, SLOW_HEARTBEATS_PER_S, report_pause_s
from dataservice.worker.server import NEWS_COALESCE_S, news_pause_s
from tests.cluster import TestCluster, run_with_deadline


def test_a_lone_piece_of_news_is_followed_by_a_poll_at_once():
    assert news_pause_s(now=10.0, last_news_at=-math.inf) == 0.0  # the worker's first news
    assert news_pause_s(now=10.0, last_news_at=10.0 - 2 * NEWS_COALESCE_S) == 0.0  # an epoch's end, after its start


def test_news_inside_a_burst_waits_for_the_rest_of_it():
    assert news_pause_s(now=10.0, last_news_at=10.0 - NEWS_COALESCE_S / 4) == NEWS_COALESCE_S


def test_a_sustained_burst_pauses_after_every_answer_but_the_first():
    """As the worker's loop uses it: ``last_news_at`` is taken after the pause, so an answer that comes at
    once after a pause (news was waiting) is still inside the burst."""
    rpc_s = 0.001
    now, last, pauses = 0.0, -math.inf, []
    for _ in range(6):
        pause = news_pause_s(now, last)
        pauses.append(pause)
        last = now + pause
        now = last + rpc_s  # the next answer: news was waiting
    assert pauses == [0.0] + [NEWS_COALESCE_S] * 5


def test_a_split_end_after_a_quiet_while_is_reported_at_once():
    assert report_pause_s(sent_at=5.0, now=6.0) == 0.0


def test_split_ends_in_quick_succession_are_reported_at_the_capped_rate():
    pace = 1 / MAX_HEARTBEATS_PER_S
    assert math.isclose(report_pause_s(sent_at=5.0, now=5.0 + pace / 4), pace * 3 / 4)
    assert report_pause_s(sent_at=5.0, now=5.0 + pace) == 0.0


def test_once_every_split_is_leased_each_split_end_is_reported_at_once():
    # Any of them may be the epoch's last, which the epoch's end waits for (the workers' and the reader's).
    pace = 1 / MAX_HEARTBEATS_PER_S
    assert report_pause_s(sent_at=5.0, now=5.0 + pace / 4, all_splits_leased=True) == 0.0


def test_the_dispatcher_says_when_every_split_of_an_iteration_is_leased():
    from dataservice.data.serialization import serialize_dataset
    from dataservice.dispatcher.core import DispatcherCore
    from dataservice.proto import dispatcher_pb2 as pb
    from dataservice.proto import state_pb2
    from dataservice.service.config import DispatcherConfig

    core = DispatcherCore(DispatcherConfig())
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="10.0.0.1:5051", worker_uid="w"))

    def read(dataset: Dataset, num_splits: int):
        dataset_id = core.register_dataset(pb.RegisterDatasetRequest(
            dataset_def=serialize_dataset(dataset), num_splits=num_splits)).dataset_id
        job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(
            dataset_id=dataset_id, processing_mode=state_pb2.DISTRIBUTED_EPOCH)).job_id
        iteration = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, repetition=0))
        task_id = next(t.task_id for t in core.state.tasks.values() if t.iteration_id == iteration.iteration_id)

        def leased() -> bool:
            return core.client_heartbeat(pb.ClientHeartbeatRequest(
                client_id=iteration.client_id, read_key=iteration.read_key)).all_splits_leased

        def lease() -> None:
            answer = core.get_split(pb.GetSplitRequest(iteration_id=iteration.iteration_id, task_id=task_id),
                                    may_wait=False)
            assert not answer.end_of_splits and not answer.wait

        return leased, lease

    leased, lease = read(Dataset.range(3 * 256), 3)
    assert not leased()  # none leased yet
    lease()
    lease()
    assert not leased()  # one left
    lease()
    assert leased()

    leased, lease = read(Dataset.range(256).repeat(), -1)  # endless: there is always another split
    for _ in range(3):
        lease()
    assert not leased()


def test_while_many_splits_are_left_split_ends_are_reported_at_the_slow_pace():
    assert report_pause_s(sent_at=5.0, now=5.0, many_splits_left=True) == pytest.approx(1 / SLOW_HEARTBEATS_PER_S)
    assert report_pause_s(sent_at=5.0, now=5.0) == pytest.approx(1 / MAX_HEARTBEATS_PER_S)
    assert report_pause_s(sent_at=5.0, now=5.0, all_splits_leased=True, many_splits_left=True) == 0.0


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_dispatcher_says_many_splits_are_left_while_leasing_them_takes_over_half_a_second(deterministic):
    from dataservice.dispatcher.core import REPORT_SLOWLY_LEFT_S, DispatcherCore
    from dataservice.proto import dispatcher_pb2 as pb
    from dataservice.proto import state_pb2
    from dataservice.service.config import DispatcherConfig
    from tests.journals import FakeClock

    clock = FakeClock()
    core = DispatcherCore(DispatcherConfig(), clock=clock)
    for w in ("10.0.0.1:5051", "10.0.0.2:5051"):
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=w, worker_uid=w))
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=40)).dataset_id
    job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(
        dataset_id=dataset_id, processing_mode=state_pb2.DISTRIBUTED_EPOCH, deterministic=deterministic)).job_id
    iteration = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id))
    tasks = core.state.iterations[iteration.iteration_id].tasks

    def many_left() -> bool:
        return core.client_heartbeat(pb.ClientHeartbeatRequest(
            client_id=iteration.client_id, read_key=iteration.read_key)).many_splits_left

    def lease(task_id: int, request_id: int) -> int:
        answer = core.get_split(pb.GetSplitRequest(iteration_id=iteration.iteration_id, task_id=task_id,
                                                   request_id=request_id, max_splits=1), may_wait=False)
        return answer.split_index

    for t in tasks:
        lease(t, 1)
    assert not many_left()  # no pace known yet: the usual pace
    clock.advance(0.1)  # 100 ms per split: 38 left over 2 tasks is 1.9 s
    for t in tasks:
        lease(t, 2)
    assert many_left() == (not deterministic)  # a deterministic read's order waits on split ends
    request = 3
    while 40 - core.state.iterations[iteration.iteration_id].next_split > 8:  # 8 left over 2 tasks: 0.4 s
        clock.advance(0.1)
        for t in tasks:
            lease(t, request)
        request += 1
    assert 8 / 2 * 0.1 < REPORT_SLOWLY_LEFT_S
    assert not many_left()  # the end nears: at the usual pace again, every split end at once after that


def test_epochs_read_back_to_back_deliver_every_element_once():
    """Ten epochs, each a new iteration: each starts on the workers that just ended the one before."""
    with TestCluster(num_workers=2) as cluster:
        ds = Dataset.from_tensor_slices(np.arange(100)).map(lambda x: x * 2).batch(8) \
            .apply(distribute("distributed_epoch", cluster.target))

        def epochs():
            return [sorted(int(v) for batch in ds for v in np.asarray(batch).ravel()) for _ in range(10)]

        for epoch in run_with_deadline(epochs, 120.0):
            assert epoch == list(range(0, 200, 2))
