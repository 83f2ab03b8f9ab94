"""How elements flow: the client's memory bound, large and small elements, every
element type on the wire, workers joining, starting early, and dispatcher restarts."""

from __future__ import annotations

import collections
import logging
import threading
import tracemalloc

import numpy as np
import pytest

from dataservice import (Dataset, DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer, distribute, errors,
                         register_dataset)
from dataservice.client.transports import ReceivedFrame
from dataservice.client.reader import IterationReader
from dataservice.data.serialization import serialize_dataset
from dataservice.proto import state_pb2
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, free_port, run_with_deadline, wait_until
from tests.elements import ints

# A background thread (fetcher, heartbeat, task) dying of an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")




# --- max_outstanding_requests bounds the client's memory -----------------------------------------

def _buffered(reader: IterationReader) -> int:
    """Elements received by the client and not yet taken by the consumer."""
    with reader._out.mutex:
        frames = [item for item in reader._out.queue if isinstance(item, tuple)]
    return sum(len(frame[0]) for frame in frames) + len(reader._current) - reader._pos


def _credits_in_use(reader: IterationReader, total: int) -> int:
    with reader._credits._cond:
        return total - reader._credits._free


def test_max_outstanding_requests_bounds_what_the_client_buffers(cluster):
    limit, n = 4, 60
    dataset = Dataset.range(n)
    client = DispatcherClient(cluster.dispatcher_address, timeout_ms=5_000)
    reader = None
    try:
        dataset_id = client.register_dataset(serialize_dataset(dataset), dataset.num_splits())
        job_id = client.get_or_create_job(dataset_id, state_pb2.PARALLEL_EPOCHS, "")
        reader = IterationReader(client, job_id, 0, max_outstanding_requests=limit)
        total = 2 * n  # two workers, parallel epochs
        got = []
        high_water = 0
        while len(got) < total:
            # A slow consumer: before each step, let the fetchers fill every free credit
            # (both workers have far more than `limit` elements ready), sampling meanwhile.
            want = min(limit, total - len(got))

            def saturated():
                nonlocal high_water
                buffered = _buffered(reader)
                in_use = _credits_in_use(reader, limit)
                high_water = max(high_water, buffered, in_use)
                assert buffered <= in_use <= limit, (buffered, in_use)
                return buffered >= want

            wait_until(saturated, 10, f"the client to buffer {want} elements")
            got.append(int(next(reader)))
        assert high_water == limit  # the bound was reached, and never passed
        with pytest.raises(StopIteration):
            next(reader)
        assert sorted(got) == sorted(list(range(n)) * 2)
    finally:
        if reader is not None:
            reader.close()
        client.close()


def _client_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes still allocated by the client's code (receive buffers, frames, queues)."""
    client = snapshot.filter_traces([tracemalloc.Filter(True, "*dataservice/client/*", all_frames=True)])
    return sum(stat.size for stat in client.statistics("filename"))


def test_client_memory_is_bounded_by_max_outstanding_requests_times_element_size():
    # The bound: max_outstanding_requests x element size plus a fixed overhead. Large
    # arrays arrive each in a buffer of its own, so an element the consumer drops (as a training
    # loop does) frees or recycles its memory at once, whatever frame it came in. One worker, so
    # that the first response carries `limit` elements in one frame.
    limit, n, element_bytes = 8, 40, 256 * 1024
    dataset = Dataset.range(n).map(lambda x: np.full(element_bytes // 8, x, np.float64))
    with TestCluster(num_workers=1) as one:
        client = DispatcherClient(one.dispatcher_address, timeout_ms=5_000)
        reader = None
        tracemalloc.start()
        try:
            dataset_id = client.register_dataset(serialize_dataset(dataset), dataset.num_splits())
            job_id = client.get_or_create_job(dataset_id, state_pb2.PARALLEL_EPOCHS, "")
            reader = IterationReader(client, job_id, 0, max_outstanding_requests=limit)
            got, peak = 0, 0
            while got < n:
                want = min(limit, n - got)
                wait_until(lambda: _buffered(reader) >= want, 10, f"the client to buffer {want} elements")
                peak = max(peak, _client_bytes(tracemalloc.take_snapshot()))
                element = next(reader)
                assert element[0] == element[-1] == got and element.nbytes == element_bytes
                del element
                got += 1
            # One element more than the limit: the one the consumer holds (its buffer is recycled once
            # dropped). The fixed part: the connection's 64 KiB scratch buffer, prefixes, bookkeeping.
            fixed_overhead = 128 * 1024
            bound = (limit + 1) * element_bytes + fixed_overhead
            assert limit * element_bytes <= peak <= bound, f"peak {peak} bytes, bound {bound}"
        finally:
            tracemalloc.stop()
            if reader is not None:
                reader.close()
            client.close()


def test_max_outstanding_requests_of_one_still_reads_everything(cluster):
    dataset = Dataset.range(50).apply(distribute("distributed_epoch", cluster.target, max_outstanding_requests=1))
    assert sorted(ints(dataset)) == list(range(50))


# --- element sizes ---------------------------------------------------------------------------

def test_element_larger_than_a_grpc_message_arrives_intact():
    size = 100 * 1024 * 1024  # larger than the 64 MiB message limit

    def big(_):
        return np.resize(np.arange(251, dtype=np.uint8), size)  # byte k holds k % 251

    with TestCluster(num_workers=1) as one:
        dataset = Dataset.range(1).map(big).apply(distribute("parallel_epochs", one.target))
        (element,) = list(dataset)
    assert element.dtype == np.uint8 and element.shape == (size,)
    for start in (0, 251 * 1000 + 7, 64 * 1024 * 1024 - 3, size - 300):
        np.testing.assert_array_equal(element[start:start + 300], (np.arange(start, start + 300) % 251))
    full, rest = divmod(size, 251)
    assert int(element.sum(dtype=np.int64)) == full * (250 * 251 // 2) + rest * (rest - 1) // 2


def test_many_small_elements_travel_many_to_a_response(cluster, monkeypatch):
    frame_sizes = []
    decode = ReceivedFrame.decode

    def counting_decode(frame):
        elements = decode(frame)
        frame_sizes.append(len(elements))
        return elements

    monkeypatch.setattr(ReceivedFrame, "decode", counting_decode)
    n = 50_000
    dataset = Dataset.range(n).apply(distribute("distributed_epoch", cluster.target))
    assert sorted(ints(dataset)) == list(range(n))
    assert sum(frame_sizes) == n
    assert max(frame_sizes) >= 100 and len(frame_sizes) < n // 10


Point = collections.namedtuple("Point", ["x", "y"])

ELEMENTS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.arange(12, dtype=np.int16).reshape(3, 4).T,  # not contiguous
    np.zeros((0, 3), dtype=np.float64),
    np.array(7, dtype=np.int8),  # 0-d
    np.array([True, False]),
    np.array([1 + 2j, 3 - 4j], dtype=np.complex128),
    np.array([b"ab", b"c\x00"], dtype=object),
    np.float16(1.5),
    np.uint64(2 ** 63 + 5),
    np.bool_(True),
    b"raw\x00bytes",
    b"",
    "unicode ✓ string",
    {"image": np.ones((2, 2), dtype=np.uint8), "label": np.int64(3), "name": "cat"},
    (np.int32(1), (b"nested", {"deep": (np.arange(3), "x")})),
    Point(np.float64(1.0), np.float64(2.0)),
    None,
]


def _assert_same(got, want, path="element"):
    assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        if want.dtype == object:
            assert got.tolist() == want.tolist(), path
        else:
            np.testing.assert_array_equal(got, want, err_msg=path)
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype and got == want, path
    elif isinstance(want, tuple):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            _assert_same(got[k], want[k], f"{path}[{k!r}]")
    else:
        assert got == want, path


@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_every_kind_of_element_arrives_intact(mode):
    elements = ELEMENTS
    with TestCluster(num_workers=1) as one:
        dataset = Dataset.range(len(elements)).map(lambda i: elements[int(i)]).apply(distribute(mode, one.target))
        got = list(dataset)
    assert len(got) == len(elements)
    for i, (g, w) in enumerate(zip(got, elements)):
        _assert_same(g, w, f"element {i}")


def test_batches_of_scalars_and_arrays_arrive_intact(cluster):
    dataset = Dataset.range(100).map(lambda x: (x, np.full((3,), x, dtype=np.float32))).batch(10)
    batches = list(dataset.apply(distribute("distributed_epoch", cluster.target)))
    # Each worker batches the splits it reads, so batches need not be aligned to 10.
    seen = []
    for xs, arrays in batches:
        assert xs.dtype == np.int64 and xs.ndim == 1 and 1 <= len(xs) <= 10
        assert arrays.shape == (len(xs), 3) and arrays.dtype == np.float32
        np.testing.assert_array_equal(arrays, np.repeat(xs[:, None], 3, axis=1).astype(np.float32))
        seen += xs.tolist()
    assert sorted(seen) == list(range(100))


# --- workers ---------------------------------------------------------------------------------

def test_worker_added_mid_job_joins_the_parallel_epochs_job():
    n = 200
    with TestCluster(num_workers=1) as c:
        dataset = Dataset.range(n).apply(distribute("parallel_epochs", c.target, max_outstanding_requests=4))
        it = iter(dataset)
        got = [int(next(it)) for _ in range(5)]  # the job is running; the only task cannot have ended
        c.add_worker()
        got += run_with_deadline(lambda: [int(x) for x in it], 20)
    assert sorted(got) == sorted(list(range(n)) * 2)


def test_restarted_worker_serves_new_jobs(cluster):
    assert sorted(ints(Dataset.range(5).apply(distribute("parallel_epochs", cluster.target)))) == sorted(
        list(range(5)) * 2)
    old_port = cluster.workers[0].port
    worker = cluster.restart_worker(0)
    assert worker.port == old_port
    # The restarted worker re-registers under the same address, and both workers serve a new job.
    reregistered = ("register_worker", {"worker": worker.address, "restarted": True})
    wait_until(lambda: reregistered in list(cluster.dispatcher.core.events), 10, "the restarted worker")
    dataset = Dataset.range(6).apply(distribute("parallel_epochs", cluster.target))
    assert sorted(ints(dataset)) == sorted(list(range(6)) * 2)


def test_stopped_worker_gets_no_task_in_a_new_job():
    with TestCluster(num_workers=2, worker_timeout_ms=300) as c:
        core = c.dispatcher.core
        lost = c.workers[1].address
        c.stop_worker(1)
        wait_until(lambda: core._worker_lost(lost), 10, "the dispatcher to notice the stopped worker")
        # Only the live worker serves the new job: nobody waits on the stopped one.
        dataset = Dataset.range(10).apply(distribute("parallel_epochs", c.target))
        assert run_with_deadline(lambda: ints(dataset), 10) == list(range(10))


class _Flag(logging.Handler):
    """Sets an event when a log message containing ``text`` is emitted."""

    def __init__(self, text: str):
        super().__init__(logging.DEBUG)
        self.text = text
        self.seen = threading.Event()

    def emit(self, record):
        if self.text in record.getMessage():
            self.seen.set()


def test_worker_started_before_the_dispatcher_registers_and_serves():
    port = free_port()
    flag = _Flag("cannot reach its dispatcher")  # the worker's warning (worker/server.py)
    worker_log = logging.getLogger("dataservice.worker")
    worker_log.addHandler(flag)
    worker = WorkerServer(WorkerConfig(dispatcher_address=f"localhost:{port}", heartbeat_interval_ms=100,
                                       dispatcher_timeout_ms=300), start=False)
    dispatcher = None
    starter = threading.Thread(target=worker.start, daemon=True)
    try:
        starter.start()
        assert flag.seen.wait(10), "the worker never tried the dispatcher"
        dispatcher = DispatchServer(DispatcherConfig(port=port))
        wait_until(lambda: len(dispatcher.core.state.workers) == 1, 10, "the early worker to register")
        starter.join(10)
        dataset = Dataset.range(10).apply(distribute("parallel_epochs", dispatcher.target))
        assert ints(dataset) == list(range(10))
    finally:
        worker_log.removeHandler(flag)
        starter.join(10)
        worker.stop()
        if dispatcher is not None:
            dispatcher.stop()


# --- dispatcher restarts without fault tolerance ---------------------------------------------------

def test_new_read_after_a_dispatcher_restart_works(cluster):
    dataset = Dataset.range(10).apply(distribute("parallel_epochs", cluster.target))
    assert sorted(ints(dataset)) == sorted(list(range(10)) * 2)
    cluster.restart_dispatcher()
    cluster.wait_for_workers(2)
    # A new distribute() registers the pipeline with the new dispatcher (an old one keeps the old id).
    dataset = Dataset.range(10).apply(distribute("parallel_epochs", cluster.target))
    assert sorted(ints(dataset)) == sorted(list(range(10)) * 2)
    assert register_dataset(cluster.target, Dataset.range(3)) > 0


def test_another_pipeline_after_a_dispatcher_restart_is_not_confused_with_the_old_one(cluster):
    # The new dispatcher must not hand out the old one's ids again: workers cache
    # pipelines by dataset id and still hold the old incarnation's tasks.
    before = Dataset.range(5).apply(distribute("parallel_epochs", cluster.target))
    assert sorted(ints(before)) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    cluster.restart_dispatcher()
    cluster.wait_for_workers(2)
    after = Dataset.range(100, 103).apply(distribute("parallel_epochs", cluster.target))
    assert sorted(ints(after)) == [100, 100, 101, 101, 102, 102]


def test_in_flight_client_gets_a_clear_error_after_a_dispatcher_restart(cluster):
    dataset = Dataset.range(1_000).apply(distribute("parallel_epochs", cluster.target, max_outstanding_requests=4))
    it = iter(dataset)
    first = [int(next(it)) for _ in range(3)]
    assert len(first) == 3
    cluster.restart_dispatcher()
    cluster.wait_for_workers(2)

    def drain():
        return [int(x) for x in it]

    # The new dispatcher does not know the client (nor its tasks): it says so.
    with pytest.raises(errors.NotFoundError, match="unknown to the dispatcher|not running on worker"):
        run_with_deadline(drain, 20)


def test_dispatcher_gone_for_good_is_service_unavailable_not_a_hang(cluster):
    dataset = Dataset.range(1_000).apply(distribute("parallel_epochs", cluster.target, max_outstanding_requests=4,
                                                    timeout_ms=1_000))
    it = iter(dataset)
    next(it)
    cluster.stop_dispatcher()
    with pytest.raises(errors.ServiceUnavailableError, match="unreachable"):
        run_with_deadline(lambda: [int(x) for x in it], 15)
    # Workers stopping while their dispatcher is away exit quietly (no thread dies on a closed channel).
    for i in range(len(cluster.workers)):
        cluster.stop_worker(i)


def test_in_flight_client_and_a_new_read_after_a_dispatcher_restart(cluster):
    # The old client's ids mean nothing to the new dispatcher, which hands out ids of its own:
    # the old client must fail, and must not take elements meant for a new reader.
    pipeline = Dataset.range(400)
    old = iter(pipeline.apply(distribute("parallel_epochs", cluster.target, max_outstanding_requests=4)))
    assert int(next(old)) in range(400)
    cluster.restart_dispatcher()
    cluster.wait_for_workers(2)

    new = iter(pipeline.apply(distribute("parallel_epochs", cluster.target, max_outstanding_requests=4)))
    got_new = [int(next(new))]

    def drain_old():
        return [int(x) for x in old]

    with pytest.raises(errors.NotFoundError):
        run_with_deadline(drain_old, 20)
    got_new += run_with_deadline(lambda: [int(x) for x in new], 20)
    assert sorted(got_new) == sorted(list(range(400)) * 2)


# --- both data-transfer protocols ---------------------------------------------------------------

def _mixed_element(x):
    # A large array (out of band), one larger than a gRPC chunk now and then, small ones, text.
    size = 5 * 1024 * 1024 if x % 10 == 0 else 100_000
    return {"big": np.full(size // 4, x, np.float32), "small": np.arange(x % 7), "label": np.int64(x),
            "name": f"e{x}"}


@pytest.mark.parametrize("protocol,client_protocol", [("tcp", None), ("tcp", "tcp"), ("tcp", "grpc"),
                                                      ("grpc", None), ("grpc", "tcp")])
def test_every_data_transfer_path_delivers_the_same_elements(protocol, client_protocol):
    # Worker offers TCP: in-process, the default copies large arrays from the worker's memory;
    # "tcp" reads them from the socket; "grpc" uses gRPC. A gRPC-only worker is read over gRPC.
    with TestCluster(num_workers=0) as one:
        worker = one.add_worker(data_transfer_protocol=protocol)
        one.wait_for_workers(1)
        assert bool(worker.data_address) == (protocol == "tcp")
        dataset = Dataset.range(30).map(_mixed_element).apply(
            distribute("distributed_epoch", one.target, data_transfer_protocol=client_protocol))
        elements = sorted(dataset, key=lambda e: int(e["label"]))
    assert [int(e["label"]) for e in elements] == list(range(30))
    for x, e in enumerate(elements):
        assert e["name"] == f"e{x}"
        np.testing.assert_array_equal(e["small"], np.arange(x % 7))
        assert e["big"].dtype == np.float32 and e["big"].flags.writeable
        assert e["big"][0] == e["big"][-1] == x and e["big"].nbytes == (5 << 20 if x % 10 == 0 else 100_000)
