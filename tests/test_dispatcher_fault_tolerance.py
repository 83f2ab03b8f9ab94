"""A fault-tolerant DispatchServer over real gRPC: restarts keep the state, a bad
work_dir or a corrupted journal stops the start, a failing journal write fails the
RPC and leaves the state as it was."""

from __future__ import annotations

import logging
import re
import socket
import time

import grpc
import pytest

from dataservice import (Dataset, DispatcherConfig, DispatchServer, errors, from_dataset_id, register_dataset)
from dataservice.dispatcher import journal as journal_mod
from dataservice.dispatcher.journal import JournalCorruptionError, JournalError
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.proto import dispatcher_pb2, dispatcher_pb2_grpc, state_pb2
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.rpc import make_channel
from tests.cluster import TestCluster, free_port
from tests.journals import comparable, fail_writes, named_job, replay

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def ft_config(work_dir, **overrides) -> DispatcherConfig:
    return DispatcherConfig(fault_tolerant_mode=True, work_dir=str(work_dir), **overrides)


@pytest.fixture
def dispatcher(tmp_path):
    server = DispatchServer(ft_config(tmp_path))
    try:
        yield server
    finally:
        server.stop()


def dataset_ids(server: DispatchServer) -> list[int]:
    with server.core._cond:
        return sorted(server.core.state.datasets)


def replayed_state(work_dir):
    """The state a dispatcher starting on ``work_dir`` would replay."""
    store = JournaledStore(str(work_dir))
    store.open()
    store.close()
    return store.state


# --- restarts ----------------------------------------------------------------------------------

def test_restart_keeps_datasets_jobs_and_ids(tmp_path):
    with TestCluster(num_workers=1, fault_tolerant_mode=True, work_dir=str(tmp_path)) as cluster:
        pipeline = Dataset.range(12)
        dataset_id = register_dataset(cluster.target, pipeline)
        job_reader = from_dataset_id("distributed_epoch", cluster.target, dataset_id, job_name="train")
        assert sorted(int(x) for x in job_reader) == list(range(12))
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=5_000)
        try:
            job_id = client.get_or_create_job(dataset_id, state_pb2.DISTRIBUTED_EPOCH, "train")
            old = cluster.dispatcher
            cluster.stop_dispatcher()
            with old.core._cond:
                expected = comparable(old.core.state)
                old_next_id = old.core.state.next_id()
                old_ids = set(old.core.state.datasets) | set(old.core.state.jobs) | set(old.core.state.tasks)
            replayed = replayed_state(tmp_path)
            assert comparable(replayed) == expected  # what a restart replays is what there was
            assert replayed.next_id() >= old_next_id

            restarted = cluster.start_dispatcher()
            assert restarted.core.incarnation != old.core.incarnation
            assert register_dataset(cluster.target, pipeline) == dataset_id
            assert client.get_or_create_job(dataset_id, state_pb2.DISTRIBUTED_EPOCH, "train") == job_id
            with restarted.core._cond:
                assert named_job(restarted.core.state, "train") == job_id
                assert "localhost:%d" % cluster.workers[0].port in restarted.core.state.workers

            # New objects get new ids, never one from before the restart.
            other_id = register_dataset(cluster.target, Dataset.range(5))
            assert other_id not in old_ids and other_id > max(old_ids)
            assert sorted(int(x) for x in from_dataset_id("parallel_epochs", cluster.target, other_id)) == \
                list(range(5))
        finally:
            client.close()


def test_replayed_worker_is_not_lost_at_once(tmp_path):
    """A worker known from the journal gets tasks in a new iteration right after a restart,
    before it has had the chance to heartbeat."""
    with TestCluster(num_workers=1, fault_tolerant_mode=True, work_dir=str(tmp_path)) as cluster:
        address = f"localhost:{cluster.workers[0].port}"
        dataset_id = register_dataset(cluster.target, Dataset.range(3))
        cluster.stop_worker(0)
        restarted = cluster.restart_dispatcher()
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=5_000)
        try:
            job_id = client.get_or_create_job(dataset_id, state_pb2.PARALLEL_EPOCHS, "")
            iteration_id = client.get_or_create_iteration(job_id, 0).iteration_id
        finally:
            client.close()
        with restarted.core._cond:
            state = restarted.core.state
            assert [state.tasks[t].worker_address for t in state.iterations[iteration_id].tasks] == [address]


def test_torn_tail_at_start_is_dropped_with_a_warning(tmp_path, caplog):
    server = DispatchServer(ft_config(tmp_path))
    first = register_dataset(server.target, Dataset.range(3))
    server.stop()
    journal_file = tmp_path / journal_mod.JOURNAL_FILE
    valid_end = journal_file.stat().st_size
    with open(journal_file, "ab") as f:
        f.write(b"\x13" * 21)  # a crash in the middle of the next write

    with caplog.at_level(logging.WARNING, logger="dataservice.dispatcher.journal"):
        server = DispatchServer(ft_config(tmp_path))
    try:
        assert f"torn tail at offset {valid_end}" in caplog.text
        assert dataset_ids(server) == [first]
        second = register_dataset(server.target, Dataset.range(4))
    finally:
        server.stop()
    assert sorted(u.register_dataset.dataset_id for u in replay(tmp_path)) == [first, second]


# --- a start that must fail -------------------------------------------------------------------

@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_unwritable_work_dir_fails_the_start_at_once(tmp_path, where):
    if where == "under-a-file":
        (tmp_path / "regular").write_text("not a directory")
        work_dir = str(tmp_path / "regular" / "journal")
    else:
        work_dir = "/proc/dataservice-journal"
    port = free_port()
    started = time.monotonic()
    with pytest.raises(JournalError, match=re.escape(f"work_dir {work_dir!r} is not writable")):
        DispatchServer(ft_config(work_dir, port=port))
    assert time.monotonic() - started < 2
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::", port))  # nothing was bound


def test_corruption_before_the_tail_fails_the_start(tmp_path):
    server = DispatchServer(ft_config(tmp_path))
    for n in range(3):
        register_dataset(server.target, Dataset.range(n + 1))
    server.stop()
    journal_file = tmp_path / journal_mod.JOURNAL_FILE
    data = bytearray(journal_file.read_bytes())
    data[journal_mod._HEADER.size + 3] ^= 0x08  # inside the first record
    journal_file.write_bytes(bytes(data))

    with pytest.raises(JournalCorruptionError, match=f"offset 0 in {re.escape(str(journal_file))}"):
        DispatchServer(ft_config(tmp_path))


def test_fault_tolerant_mode_requires_a_work_dir():
    with pytest.raises(ValueError, match="work_dir"):
        DispatcherConfig(fault_tolerant_mode=True)


# --- a failing journal write -------------------------------------------------------------------

def test_failed_journal_write_fails_the_rpc_and_rolls_back(dispatcher):
    first = register_dataset(dispatcher.target, Dataset.range(3))
    fail_writes(dispatcher.core.store.journal)
    channel = make_channel(f"localhost:{dispatcher.port}")
    try:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.RegisterDataset(dispatcher_pb2.RegisterDatasetRequest(dataset_def=b"another", num_splits=1),
                                 timeout=10)
    finally:
        channel.close()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # the caller may retry
    assert "journal write failed" in info.value.details()
    assert "No space left on device" in info.value.details()
    assert dataset_ids(dispatcher) == [first]

    # The journal was reopened on a fresh descriptor: the next change goes through.
    second = register_dataset(dispatcher.target, Dataset.range(4), timeout_ms=5_000)
    assert dataset_ids(dispatcher) == [first, second]


def test_journal_that_stays_unwritable_fails_changes_with_a_clear_error(dispatcher, tmp_path):
    pipeline = Dataset.range(3)
    first = register_dataset(dispatcher.target, pipeline)
    fail_writes(dispatcher.core.store.journal)
    probe = tmp_path / journal_mod.PROBE_FILE
    probe.mkdir()  # the work_dir stops taking writes: the journal cannot be reopened

    # The first attempt fails on the write, the retries on reopening the journal.
    with pytest.raises(errors.ServiceUnavailableError, match="journal cannot be written after a failed write"):
        register_dataset(dispatcher.target, Dataset.range(7), timeout_ms=300)
    assert dataset_ids(dispatcher) == [first]

    # Reads of the rolled-back state are still answered.
    assert register_dataset(dispatcher.target, pipeline, timeout_ms=2_000) == first
    client = DispatcherClient(f"localhost:{dispatcher.port}", timeout_ms=2_000)
    try:
        assert [d.dataset_id for d in client.get_status().datasets] == [first]
    finally:
        client.close()

    probe.rmdir()  # the disk recovers: changes go through again
    second = register_dataset(dispatcher.target, Dataset.range(7), timeout_ms=5_000)
    assert dataset_ids(dispatcher) == [first, second]
