"""Client-side stats (``iterator.stats()``), their reports to the dispatcher, and the scaling signal.

Real in-process clusters: the pipelines block on an Event the test holds (a map that waits), so "the
consumer had to wait" is a fact the test arranges, not a timing guess. The workers are in this process,
so the gate is looked up in this module when the worker runs the map: the function itself is shipped by
value (the test's own code), and only the module's name travels with it.
"""

from __future__ import annotations

import json
import re
import sys
import threading

import numpy as np
import pytest

from tests.cluster import TestCluster, run_with_deadline, wait_until

from dataservice import Dataset, distribute, errors
from dataservice.cli import main as cli_main
from dataservice.client.distribute import DistributedIterator
from dataservice.client.reader import ReaderStats
from dataservice.dispatcher.client_stats import ClientStats, LoadReports, WorkerRecommendation
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.dispatcher.request_checks import check_request
from dataservice.dispatcher.scaling import ScalingPolicy, ScalingState, recommend
from dataservice.proto import dispatcher_pb2, state_pb2
from dataservice.service.config import DispatcherConfig
from dataservice.service.wire import encode_elements

_MODULE = __name__
#: Gates the pipelines wait on, by name (an Event cannot be pickled; its name can).
GATES: dict[str, threading.Event] = {}


def _gated(x):
    """Waits for the gate named "open" (at most a minute), then passes ``x`` on."""
    sys.modules[_MODULE].GATES["open"].wait(60)
    return x


@pytest.fixture
def gate():
    event = GATES["open"] = threading.Event()
    yield event
    event.set()  # never leave a worker's producer waiting
    GATES.pop("open", None)


def _read_in_background(iterator) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.extend(iterator), daemon=True)
    thread.start()
    return thread, out


def _status_json(target: str, capsys) -> dict:
    capsys.readouterr()
    assert cli_main(["status", "--dispatcher", target, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# --- iterator.stats() ---------------------------------------------------------------------------

def test_stats_count_elements_and_bytes_exactly(cluster):
    # One element per response (max_outstanding_requests=1), so each frame's size is known: the frame
    # encode_elements makes of that element alone.
    elements = [np.arange(i % 7 + 1, dtype=np.float32) * i for i in range(40)]
    dataset = Dataset.from_tensor_slices(np.arange(40)).map(lambda i: np.arange(i % 7 + 1, dtype=np.float32) * i)
    it = iter(dataset.apply(distribute("parallel_epochs", cluster.target, max_outstanding_requests=1)))
    assert isinstance(it, DistributedIterator)
    assert it.stats() == ReaderStats()  # nothing read yet
    received = run_with_deadline(lambda: list(it), 60)
    assert len(received) == 2 * len(elements)  # two workers, each the whole dataset
    stats = it.stats()
    assert stats.elements == len(received)
    assert stats.bytes == sum(encode_elements([e]).nbytes for e in received)
    assert stats.bytes > sum(e.nbytes for e in received)  # the data, and a few bytes of framing each
    assert 0 < stats.stall_s <= stats.elapsed_s
    assert stats.stall_fraction == pytest.approx(stats.stall_s / stats.elapsed_s)
    frozen = it.stats()  # the read ended: nothing moves any more
    assert it.stats() == frozen


def test_stats_add_up_over_zipped_readers_of_one_iterator(cluster):
    left = Dataset.range(30).apply(distribute("distributed_epoch", cluster.target))
    right = Dataset.range(30).apply(distribute("distributed_epoch", cluster.target))
    # A zip's root is not the distributed dataset: no stats() on its iterator, but one recorder for both.
    from dataservice.client.distribute import reader_stats

    it = iter(Dataset.zip((left, right)))
    assert len(run_with_deadline(lambda: list(it), 60)) == 30
    assert reader_stats(it._ctx).elements == 60


def test_stall_grows_while_the_pipeline_is_blocked(cluster, gate):
    dataset = Dataset.range(20).map(_gated).apply(distribute("parallel_epochs", cluster.target))
    it = iter(dataset)
    thread, out = _read_in_background(it)
    # The consumer waits inside next() for as long as the gate is shut: the wait in progress counts.
    first = wait_until(lambda: (lambda s: s if s.stall_s > 0.2 else None)(it.stats()), 30, "a stall while blocked")
    assert first.elements == 0 and out == []
    later = wait_until(lambda: (lambda s: s if s.stall_s > first.stall_s else None)(it.stats()), 30,
                       "the stall to keep growing while blocked")
    assert later.stall_fraction > 0.5  # it did nothing but wait
    gate.set()
    thread.join(60)
    assert not thread.is_alive()
    final = it.stats()
    assert sorted(int(x) for x in out) == sorted(list(range(20)) * 2)
    assert final.elements == 40
    assert final.stall_s >= later.stall_s


# --- reported to the dispatcher ------------------------------------------------------------------

def test_stats_reach_the_dispatcher_and_dataservice_status(cluster, gate, capsys):
    core = cluster.dispatcher.core
    dataset = Dataset.range(10).map(_gated).apply(distribute("parallel_epochs", cluster.target, job_name="stalls"))
    it = iter(dataset)
    thread, out = _read_in_background(it)
    report = wait_until(lambda: [c for c in core.client_stats() if c.stall_s > 0.3], 30,
                        "a client report with a stall")[0]
    assert isinstance(report, ClientStats)
    assert report.job_name == "stalls" and report.elements == 0 and report.stall_fraction > 0.5
    job_id = core.state.clients[report.client_id].iteration_id
    assert report.iteration_id == job_id
    status = _status_json(cluster.target, capsys)
    shown = [c for c in status["clients"] if c["client_id"] == report.client_id]
    assert shown and shown[0]["job_name"] == "stalls" and shown[0]["stall_fraction"] > 0.5
    assert status["recommended_workers"]["current"] == 2
    assert sorted(status["worker_busy_fraction"]) == sorted(w.address for w in cluster.workers)
    capsys.readouterr()
    assert cli_main(["status", "--dispatcher", cluster.target]) == 0
    text = capsys.readouterr().out
    assert "clients reading: 1" in text and "stalls (" in text and "recommended workers:" in text
    gate.set()
    thread.join(60)
    assert sorted(int(x) for x in out) == sorted(list(range(10)) * 2)
    # The read ended and the client was released: its report went with it (soft state).
    wait_until(lambda: not core.client_stats(), 30, "the released client's report to go")


def test_reports_are_soft_state_not_journaled(tmp_path, gate):
    with TestCluster(num_workers=1, work_dir=str(tmp_path / "work"), fault_tolerant_mode=True) as cluster:
        dataset = Dataset.range(5).map(_gated).apply(distribute("parallel_epochs", cluster.target,
                                                                job_name="soft"))
        it = iter(dataset)
        thread, out = _read_in_background(it)
        client_id = wait_until(lambda: cluster.dispatcher.core.client_stats(), 30, "a client report")[0].client_id
        cluster.stop_dispatcher()
        # What a restarted dispatcher starts from: the journal holds the client, not its stats.
        store = JournaledStore(str(tmp_path / "work"))
        store.open()
        try:
            replayed = DispatcherCore(cluster._dispatcher_config, store=store)
            assert client_id in replayed.state.clients
            assert replayed.client_stats() == []
        finally:
            store.close()
        cluster.start_dispatcher()
        # They come back with the client's next heartbeat.
        wait_until(lambda: [c for c in cluster.dispatcher.core.client_stats() if c.client_id == client_id], 30,
                   "the report after the restart")
        gate.set()
        thread.join(60)
        assert sorted(int(x) for x in out) == list(range(5))


def test_bad_reports_are_refused_naming_the_field():
    config = DispatcherConfig()

    def heartbeat(**stats):
        return dispatcher_pb2.ClientHeartbeatRequest(client_id=1, stats=dispatcher_pb2.ReaderStatsReport(**stats))

    check_request("ClientHeartbeat", heartbeat(elements=5, bytes=40, stall_us=10**6, elapsed_us=2 * 10**6), config)
    cases = [
        (heartbeat(elements=-1), "stats.elements is -1"),
        (heartbeat(bytes=-8), "stats.bytes is -8"),
        (heartbeat(stall_us=-1, elapsed_us=10), "stats.stall_us is -1, outside [0, "),
        (heartbeat(elapsed_us=2 ** 63 - 1), "stats.elapsed_us is 9223372036854775807, outside"),
        (heartbeat(stall_us=3, elapsed_us=2), "stats.stall_us is 3, more than stats.elapsed_us (2)"),
    ]
    for request, message in cases:
        with pytest.raises(errors.InvalidRequestError, match=re.escape(message)):
            check_request("ClientHeartbeat", request, config)
    worker = dispatcher_pb2.WorkerHeartbeatRequest(worker_address="localhost:1", load=dispatcher_pb2.WorkerLoadReport(
        interval_us=10**6, busy_us=-5))
    with pytest.raises(errors.InvalidRequestError, match="WorkerHeartbeat: load.busy_us is -5, outside"):
        check_request("WorkerHeartbeat", worker, config)


# --- the scaling signal ----------------------------------------------------------------------------

_FAST = ScalingPolicy(cooldown_s=0.0, down_after_s=0.0)


@pytest.mark.parametrize("current, stall, busy, count, says", [
    # stalled consumers, saturated workers: up to current / (1 - stall), bounded to doubling
    (2, 0.5, 0.95, 4, "scaling up to 4"),
    (4, 0.2, 0.9, 5, "scaling up to 5"),          # ceil(4 / 0.8) = 5
    (2, 0.99, 1.0, 4, "scaling up to 4"),         # wants 20: one step at most doubles
    (1, 0.15, 0.85, 2, "scaling up to 2"),        # at least one more
    # stalled consumers, workers not saturated: more workers would not help
    (3, 0.6, 0.4, 3, "not saturated"),
    # idle: no stall, workers mostly blocked on full buffers: down towards busy / busy_up
    (8, 0.0, 0.1, 6, "scaling down to 6"),        # wants 1: one step removes at most a quarter
    (2, 0.01, 0.2, 1, "scaling down to 1"),
    (1, 0.0, 0.0, 1, "already at min_workers"),
    (3, None, 0.0, 2, "no client reads"),         # nobody reads: idle too
    # between the thresholds: hold (hysteresis)
    (3, 0.08, 0.9, 3, "steady"),                  # stall between stall_down and stall_up
    (3, 0.0, 0.6, 3, "steady"),                   # busy between busy_down and busy_up
    (3, 0.5, None, 3, "not saturated"),           # no worker reported its load
    # no worker at all
    (0, 0.9, None, 1, "no live worker"),
])
def test_policy_table(current, stall, busy, count, says):
    recommendation, _ = recommend(current, stall, busy, now=1000.0, policy=_FAST)
    assert recommendation.count == count and recommendation.current == current
    assert says in recommendation.reason


def test_policy_waits_before_scaling_down_and_after_a_change():
    policy = ScalingPolicy(down_after_s=60.0, cooldown_s=30.0)
    rec, state = recommend(4, 0.0, 0.1, now=0.0, policy=policy)
    assert rec.count == 4 and "scaling down after 60 s" in rec.reason
    rec, state = recommend(4, 0.0, 0.1, now=59.0, state=state, policy=policy)
    assert rec.count == 4
    rec, state = recommend(4, 0.3, 0.1, now=59.5, state=state, policy=policy)  # a stall resets the clock
    rec, state = recommend(4, 0.0, 0.1, now=70.0, state=state, policy=policy)
    assert rec.count == 4 and "for 0 s" in rec.reason
    rec, state = recommend(4, 0.0, 0.1, now=131.0, state=state, policy=policy)
    assert rec.count == 3
    # The cluster has not caught up yet: the same recommendation during the cooldown, whatever the load.
    rec, state = recommend(4, 0.9, 1.0, now=140.0, state=state, policy=policy)
    assert rec.count == 3 and "waiting 30 s" in rec.reason
    rec, state = recommend(3, 0.9, 1.0, now=141.0, state=state, policy=policy)  # caught up: decide again
    assert rec.count == 6


def test_policy_bounds_and_checks():
    rec, _ = recommend(4, 0.9, 1.0, now=0.0, policy=ScalingPolicy(max_workers=5, cooldown_s=0))
    assert rec.count == 5
    rec, _ = recommend(5, 0.9, 1.0, now=0.0, policy=ScalingPolicy(max_workers=5, cooldown_s=0))
    assert rec.count == 5 and "max_workers" in rec.reason
    rec, _ = recommend(3, 0.0, 0.0, now=0.0, policy=ScalingPolicy(min_workers=3, down_after_s=0))
    assert rec.count == 3 and "min_workers" in rec.reason
    assert recommend(1, 0.0, 0.9, now=0.0)[0] == WorkerRecommendation(1, 1, recommend(1, 0.0, 0.9, 0.0)[0].reason)
    with pytest.raises(ValueError, match="stall_up must be a fraction"):
        ScalingPolicy(stall_up=1.5)
    with pytest.raises(ValueError, match="must not exceed the up thresholds"):
        ScalingPolicy(stall_down=0.5, stall_up=0.2)
    with pytest.raises(ValueError, match="min_workers"):
        ScalingPolicy(min_workers=4, max_workers=2)
    assert ScalingState() == ScalingState(None, None, None)


def test_load_reports_window():
    reports = LoadReports(window_s=5.0)
    reports.client_reported(1, 10, 11, "", 0, 0, stall_s=0.0, elapsed_s=10.0, now=0.0, now_unix=0.0)
    reports.client_reported(1, 10, 11, "", 0, 0, stall_s=4.0, elapsed_s=14.0, now=4.0, now_unix=4.0)
    stats = reports.client_stats()[0]
    assert stats.stall_fraction == pytest.approx(4 / 14)           # over the whole read
    assert stats.recent_stall_fraction == pytest.approx(1.0)       # over the window: it only waited
    assert reports.recent_clients(now=9.5) == []                   # silent past the window
    reports.worker_reported("w:1", interval_s=1.0, busy_s=2.0, running_tasks=2, now=0.0)  # two tasks at once
    assert reports.worker_load("w:1").busy_fraction == 1.0
    reports.worker_reported("w:1", interval_s=1.0, busy_s=0.0, running_tasks=0, now=6.0)  # the first left the window
    assert reports.worker_load("w:1").busy_fraction == 0.0
    assert reports.worker_load("w:2").busy_fraction == -1.0
    reports.forget_client(1)
    assert reports.client_stats() == []


def test_worker_load_keeps_its_window_sums_exact_over_many_reports():
    """A worker's busy window keeps its sums between samples (a status read takes 2,000 under the lock):
    they must equal the window's samples summed afresh, as samples age out and as the 64 kept roll over."""
    reports = LoadReports(window_s=10.0)
    rng = np.random.default_rng(5)
    now = 0.0
    kept: list = []
    for _ in range(3_000):
        now += float(rng.choice([0.05, 0.5, 3.0]))  # bursts that overflow the 64 kept, and gaps that age out
        interval, busy = float(rng.uniform(0.1, 5.0)), float(rng.uniform(0.0, 5.0))
        reports.worker_reported("w:1", interval_s=interval, busy_s=busy, running_tasks=1, now=now)
        kept.append((now, interval, busy))
        while len(kept) > 1 and (len(kept) > 64 or now - kept[0][0] > 10.0):
            kept.pop(0)
        expected = min(1.0, sum(b for _, _, b in kept) / sum(i for _, i, _ in kept))
        assert reports.worker_load("w:1").busy_fraction == pytest.approx(expected, rel=1e-9)


def test_status_ranks_the_most_stalled_clients_first():
    """GetStatus ranks readers after letting the lock go (heapq over every report): the most stalled first, ties
    by client id, at most max_items of them."""
    core = DispatcherCore(DispatcherConfig())
    dataset = core.register_dataset(dispatcher_pb2.RegisterDatasetRequest(dataset_def=b"p")).dataset_id
    job = core.get_or_create_job(dispatcher_pb2.GetOrCreateJobRequest(
        dataset_id=dataset, job_name="j", processing_mode=state_pb2.PARALLEL_EPOCHS)).job_id
    stalls = [0.1, 0.7, 0.3, 0.7, 0.0, 0.9]
    ids = []
    for stall in stalls:
        it = core.get_or_create_iteration(dispatcher_pb2.GetOrCreateIterationRequest(job_id=job))
        ids.append(it.client_id)
        core.client_heartbeat(dispatcher_pb2.ClientHeartbeatRequest(
            client_id=it.client_id, read_key=it.read_key,
            stats=dispatcher_pb2.ReaderStatsReport(elements=1, bytes=8, stall_us=int(stall * 1e6),
                                                   elapsed_us=1_000_000)))
    status = core.get_status(dispatcher_pb2.GetStatusRequest(max_items=4))
    expected = sorted(zip(stalls, ids), key=lambda p: (-p[0], p[1]))[:4]
    assert [(round(c.stall_fraction, 6), c.client_id) for c in status.clients] == expected
    assert [c.client_id for c in core.client_stats()] == sorted(ids)  # by client id, as documented


def test_recommended_workers_rise_with_stalls_and_fall_when_idle(cluster, gate):
    core = cluster.dispatcher.core
    core.scaling_policy = _FAST
    core.load_reports = LoadReports(window_s=1.5)  # a short window, so the test follows changes quickly
    dataset = Dataset.range(20).map(_gated).apply(distribute("parallel_epochs", cluster.target))
    thread, out = _read_in_background(iter(dataset))
    # Both workers' producers are busy in the map and the consumer waits: saturated and stalling.
    up = wait_until(lambda: (lambda r: r if r.count > r.current else None)(core.recommended_workers()), 30,
                    "a recommendation to scale up")
    assert up.current == 2 and up.count == 4, up  # one step at most doubles
    assert "scaling up" in up.reason
    gate.set()
    thread.join(60)
    assert len(out) == 40
    # A consumer that reads one element and then holds the iterator: the producers fill their buffers and
    # block, nobody waits. Idle: fewer workers.
    idle = iter(Dataset.range(1_000_000).apply(distribute("parallel_epochs", cluster.target)))
    next(idle)
    down = wait_until(lambda: (lambda r: r if r.count < r.current else None)(core.recommended_workers()), 30,
                      "a recommendation to scale down")
    assert down.current == 2 and down.count == 1 and "idle" in down.reason
    loads = [core.load_reports.worker_load(w.address) for w in cluster.workers]
    assert all(load.busy_fraction >= 0 for load in loads), loads  # both reported
    assert sum(load.busy_fraction for load in loads) / len(loads) < _FAST.busy_down, loads
    idle.close()


def test_stats_behind_later_transformations_and_on_a_local_pipeline():
    from dataservice import Dataset, distribute
    from tests.cluster import TestCluster, run_with_deadline

    with TestCluster(num_workers=1) as cluster:
        ds = Dataset.range(100).apply(distribute("distributed_epoch", cluster.target)).map(lambda x: x + 1).prefetch(2)
        it = iter(ds)
        run_with_deadline(lambda: sum(1 for _ in it), 60)
        assert it.stats().elements == 100
    local = iter(Dataset.range(3))
    list(local)
    assert local.stats().elements == 0 and local.stats().bytes == 0


def test_a_parallel_epochs_read_refuses_to_save_its_position_and_names_what_resumes(cluster):
    from dataservice.errors import NotCheckpointableError

    it = iter(Dataset.range(10).apply(distribute("parallel_epochs", cluster.target)).map(lambda x: x + 1))
    try:
        run_with_deadline(lambda: next(it), 60)
        with pytest.raises(NotCheckpointableError,
                           match=r"distribute\(parallel_epochs.*cannot save its position.*only "
                                 r"processing_mode='distributed_epoch' reads resume"):
            it.state_dict()
    finally:
        it.close()
