"""Shared batches (worker.shared_batches, client.shared_segments): a worker builds large batches in memfd
segments that a reader on its host maps instead of copying; a segment is written again only once its
reader returned it and the worker holds no reference to it, and never after its connection closed."""

from __future__ import annotations

import gc
import mmap
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from dataservice import Dataset
from dataservice.client.shared_segments import MappedSegments
from dataservice.client.transports import TcpTransport, TransientError
from dataservice.data import batch_memory, structure
from dataservice.proto import worker_pb2
from dataservice.service import cross_memory
from dataservice.service.config import DEFAULT_SHARED_BATCH_BYTES, WorkerConfig
from dataservice.worker import shared_batches
from dataservice.worker.data_server import DataServer
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.shared_batches import SharedBatches
from tests.test_data_transfer import REPO, TASK_ID, OneTaskWorker, connected, serve  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not (shared_batches.available() and cross_memory.available()),
                                reason="memfd and process_vm_readv are Linux-only")

ROWS = 256 * 1024  # float32: 1 MiB per element, so a batch of 2 or more is built in a segment


def element(x):
    return np.full(ROWS, x, np.float32)


def batches(n: int, size: int = 2) -> Dataset:
    return Dataset.range(n).map(element).batch(size)


def next_batch(transport: TcpTransport) -> tuple:
    """One answer of at most one element: (end_of_sequence, the elements)."""
    header, frame = transport.get(worker_pb2.GetElementsRequest(task_id=TASK_ID, max_elements=1, max_bytes=1 << 30,
                                                                wait_ms=2000))
    return header, frame.decode()


def owner(array: np.ndarray):
    """What finally holds an array's memory: an mmap for a mapped segment, else an ndarray."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    if isinstance(array, memoryview):
        return array.obj
    return array


def check(batch: np.ndarray, first: int, size: int = 2) -> None:
    assert batch.shape == (size, ROWS)
    for row, x in enumerate(range(first, first + size)):
        assert batch[row, 0] == x and batch[row, -1] == x and np.all(batch[row] == x)


def test_a_batch_is_built_in_a_segment_and_mapped_by_the_reader_not_copied(serve):  # noqa: F811
    pool = SharedBatches(64 << 20)
    server = serve(batches(8), pool)
    with connected(server.port) as transport:
        header, (batch,) = next_batch(transport)
        assert transport.memory_pid == os.getpid()
        assert len(header.buffer_segments) == 1 and header.buffer_segments[0] > 0
        assert isinstance(owner(batch), mmap.mmap)  # the reader's own mapping of the segment
        check(batch, 0)
        batch[0, 0] = -1.0  # a training loop may change its batch in place
        assert pool.created >= 1  # and the batches the task made ahead


def test_shared_batches_off_the_batch_is_copied(serve):  # noqa: F811
    server = serve(batches(4), None)
    with connected(server.port) as transport:
        header, (batch,) = next_batch(transport)
        assert not header.buffer_segments and len(header.buffer_addresses) == 1  # copied by address
        assert isinstance(owner(batch), np.ndarray)
        check(batch, 0)


def test_a_segment_is_reused_once_the_reader_dropped_its_batch_and_never_while_held(serve):  # noqa: F811
    pool = SharedBatches(64 << 20)
    # A budget of a byte: the task makes its next batch only once the last was taken, so each batch is made
    # after the request that returned the one before it (and the test does not hang on timing).
    server = serve(batches(40), pool, budget=MemoryBudget(1))
    kept = []
    with connected(server.port) as transport:
        for i in range(20):
            header, (batch,) = next_batch(transport)
            check(batch, 2 * i)
            if i % 4 == 0:
                kept.append((2 * i, batch))  # held by the training loop while the rest flows
            del batch
        assert pool.reused >= 8, pool.reused  # 12-13 of the 20: most batches follow a dropped one
        # Every batch still held reads what it was built with: no segment was written under it.
        for first, batch in kept:
            check(batch, first)
        lent_to_us = pool.bytes  # segments lent, and free ones
        assert lent_to_us <= 64 << 20


def test_closing_the_connection_orphans_what_its_reader_still_holds(serve):  # noqa: F811
    pool = SharedBatches(64 << 20)
    server = serve(batches(12), pool)
    with connected(server.port) as transport:
        held = [next_batch(transport)[1][0] for _ in range(3)]
    # The worker learns of the close asynchronously: poll, with a deadline, for the orphaned segments.
    deadline = threading.Event()
    for _ in range(200):
        if pool.orphaned >= 3:
            break
        deadline.wait(0.01)
    assert pool.orphaned >= 3
    with connected(server.port) as transport:
        rest = []
        while True:
            header, elements = next_batch(transport)
            rest.extend(elements)
            if header.end_of_sequence:
                break
    for i, batch in enumerate(held + rest):
        check(batch, 2 * i)  # the orphaned ones were never written again


def test_a_segment_the_reader_cannot_map_is_given_back_and_comes_as_bytes(serve):  # noqa: F811
    pool = SharedBatches(64 << 20)
    server = serve(batches(8), pool)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with connected(server.port) as transport:
        transport._connect()
        transport.memory_pid = gone.pid  # /proc/<pid>/fd of a process that exited: the mapping fails
        with pytest.raises(TransientError, match="mapping the worker's shared batch failed"):
            next_batch(transport)
        # The batch went back to the task; the copy from the same pid fails too; then bytes over TCP.
        got = []
        for _ in range(10):
            try:
                header, elements = next_batch(transport)
            except TransientError as exc:
                assert "copying from the worker's memory failed" in str(exc)
                continue
            got.extend(elements)
            if header.end_of_sequence:
                break
        assert transport.memory_pid is None
    for i, batch in enumerate(got):
        check(batch, 2 * i)
    assert len(got) == 4  # every batch once: none lost, none twice


def serve_batches_in_this_process() -> None:
    """A DataServer with shared batches for a subprocess test: prints its port, serves until stdin closes."""
    pool = SharedBatches(64 << 20)
    server = DataServer(OneTaskWorker(batches(16), pool), host="127.0.0.1", shared_batches=pool)
    server.start()
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


def test_a_worker_in_another_process_is_mapped_through_proc():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, "-c",
                              "import tests.test_shared_batches as t; t.serve_batches_in_this_process()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        port = int(child.stdout.readline())
        with connected(port) as transport:
            got = []
            while True:
                header, elements = next_batch(transport)
                got.extend(elements)
                if elements:
                    assert header.buffer_segments[0] > 0 and isinstance(owner(elements[0]), mmap.mmap)
                if header.end_of_sequence:
                    break
            assert transport.memory_pid == child.pid
        for i, batch in enumerate(got):
            check(batch, 2 * i)
        assert len(got) == 8
    finally:
        child.stdin.close()
        child.wait(timeout=30)


# --- the pool on its own --------------------------------------------------------------------------------------

def test_the_pool_reuses_a_segment_only_when_it_is_free():
    pool = SharedBatches(64 << 20)
    shape, dtype = (4, ROWS), np.dtype(np.float32)
    first = pool.allocate(shape, dtype)
    segment = pool.find(first.ctypes.data, first.nbytes)
    assert segment is not None and pool.created == 1
    assert pool.lend(segment, "conn") == segment.fd
    del first
    second = pool.allocate(shape, dtype)  # lent: a new segment
    assert pool.created == 2
    pool.give_back([segment.id], "other")  # not lent to "other": ignored
    third = pool.allocate(shape, dtype)
    assert pool.created == 3 and pool.find(third.ctypes.data, third.nbytes) is not segment
    del second, third
    pool.give_back([segment.id], "conn")
    gc.collect()
    again = pool.allocate(shape, dtype)
    assert pool.find(again.ctypes.data, again.nbytes) is segment and pool.reused == 1


def test_the_pool_stays_within_its_bytes_and_lets_free_segments_go():
    size = 4 * ROWS * 4
    pool = SharedBatches(2 * size)
    shape, dtype = (4, ROWS), np.dtype(np.float32)
    a = pool.allocate(shape, dtype)
    b = pool.allocate(shape, dtype)
    assert pool.allocate(shape, dtype) is None and pool.declined == 1  # both in use: the caller stacks as usual
    del a
    c = pool.allocate(shape, dtype)  # a's segment, free again
    assert c is not None and pool.reused == 1
    del b, c
    small = pool.allocate((2, ROWS), dtype)  # another size: the least recently used free segment goes
    assert small is not None and pool.bytes <= 2 * size
    assert pool.allocate((1 << 30,), dtype) is None  # larger than the whole pool


def test_a_closed_connection_orphans_its_segments_for_good():
    pool = SharedBatches(64 << 20)
    array = pool.allocate((4, ROWS), np.dtype(np.float32))
    segment = pool.find(array.ctypes.data, array.nbytes)
    pool.lend(segment, "conn")
    pool.drop_connection("conn")
    assert pool.orphaned == 1 and segment.fd == -1 and pool.bytes == 0
    assert pool.find(array.ctypes.data, array.nbytes) is None and pool.lend(segment, "conn") == -1
    array[:] = 1.0  # the memory itself stays valid for whoever still views it
    pool.give_back([segment.id], "conn")  # a late return changes nothing
    assert pool.allocate((4, ROWS), np.dtype(np.float32)) is not None and pool.created == 2


def test_batches_go_into_the_allocator_only_in_its_thread_and_only_when_large():
    given = []

    def allocate(shape, dtype):
        out = np.empty(shape, dtype)
        given.append(out)
        return out

    large = [np.full(ROWS, i, np.float32) for i in range(2)]
    with batch_memory.batches_into(allocate):
        stacked = structure.stack(large)
        assert stacked is given[0]
        np.testing.assert_array_equal(stacked[1], large[1])
        structure.stack([np.zeros(10, np.float32)] * 2)  # small: as usual
        structure.stack([large[0], large[1].astype(np.float64)])  # mixed dtypes: numpy decides, as usual
        other = []
        thread = threading.Thread(target=lambda: other.append(structure.stack(large)))
        thread.start()
        thread.join()
    structure.stack(large)  # outside the block: as usual
    assert len(given) == 1 and other[0] is not given[0]


def test_mapped_segments_check_the_inode_and_tell_what_can_be_returned():
    fd = os.memfd_create("test-segment")
    try:
        os.ftruncate(fd, 1 << 16)
        inode = os.fstat(fd).st_ino
        segments = MappedSegments()
        buffer = segments.view(os.getpid(), 5, fd, inode, 4096, 8192)
        assert buffer.nbytes == 8192 and buffer.flags.writeable
        view = buffer.view(np.float64)
        del buffer
        assert segments.returnable() == [] and segments.lent == 1
        del view
        assert segments.returnable() == [5] and segments.lent == 0
        with pytest.raises(OSError, match="no longer the worker's shared segment"):
            segments.view(os.getpid(), 6, fd, inode + 1, 0, 8)
        with pytest.raises(OSError, match="holds 65536 bytes"):
            segments.view(os.getpid(), 5, fd, inode, 0, 1 << 20)
    finally:
        os.close(fd)


def test_shared_batch_bytes_default_and_validation():
    config = WorkerConfig(dispatcher_address="localhost:5000", memory_budget_bytes=1 << 40)
    assert config.shared_batch_bytes == DEFAULT_SHARED_BATCH_BYTES
    assert WorkerConfig(dispatcher_address="localhost:5000", memory_budget_bytes=1 << 20).shared_batch_bytes == 1 << 20
    assert WorkerConfig(dispatcher_address="localhost:5000", shared_batch_bytes=0).shared_batch_bytes == 0
    with pytest.raises(ValueError, match="shared_batch_bytes must be a number of bytes >= 0"):
        WorkerConfig(dispatcher_address="localhost:5000", shared_batch_bytes=-1)
