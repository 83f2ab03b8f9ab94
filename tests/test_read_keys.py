"""Readers read only their own iterations (issue #10).

The dispatcher gives each iteration a random read key: the readers that create or join it
get it from GetOrCreateIteration, each worker gets a key derived from it for each of its own
tasks, and a worker refuses a GetElements without its task's key before taking anything. An
anonymous job is private to the reader that created it; a named job is shared by every reader
of its name. The key survives journal replay and checkpoints, and GetStatus never shows it.

The attacker here holds the cluster token and talks to the dispatcher and the workers with
plain stubs and transports: it is an outsider to the reader, not a mock of our servers.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Optional

import grpc
import pytest

from dataservice import Dataset, distribute, errors
from dataservice.client.transports import TcpTransport, TransientError
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.journal import CHECKPOINT_FILE, read_records
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.dispatcher.state import DispatcherState
from dataservice.service.auth import task_read_key
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2, worker_pb2, worker_pb2_grpc
from dataservice.service.auth import TOKEN_ENV, TOKEN_FILE_ENV, ClusterAuth
from dataservice.service.config import DispatcherConfig
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.rpc import make_channel
from dataservice.worker.responses import ReadKeyError, prepare
from dataservice.worker.task_runner import TaskRunner
from tests.cluster import TestCluster, wait_until
from tests.journals import FakeClock, comparable

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

TOKEN = "read-keys-test-cluster-token-0123456789abcdef"
N = 3000
PE, DE = state_pb2.PARALLEL_EPOCHS, state_pb2.DISTRIBUTED_EPOCH


# --- helpers -------------------------------------------------------------------------------------

@pytest.fixture
def secured(monkeypatch):
    """A two-worker cluster whose every member, reader and attacker alike, holds the token."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    with TestCluster(num_workers=2) as cluster:
        yield cluster


class PausedReader:
    """Reads ``dataset`` on a thread, pausing after each count of elements in ``pause_at`` until
    ``resume()``: its tasks are then alive, with elements ready, while the attacker tries them."""

    def __init__(self, dataset: Dataset, pause_at: tuple = (1,)):
        self.items: list[int] = []
        self.error: Optional[BaseException] = None
        self._pause_at = set(pause_at)
        self.paused = threading.Event()
        self._resume = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(dataset,), daemon=True)
        self._thread.start()

    def _run(self, dataset: Dataset) -> None:
        try:
            for x in dataset:
                self.items.append(int(x))
                if len(self.items) in self._pause_at and not self._done:
                    self.paused.set()
                    self._resume.wait(60)
                    self._resume.clear()
        except BaseException as exc:  # reported by result()
            self.error = exc
        finally:
            self.paused.set()

    def wait_paused(self, timeout_s: float = 30.0) -> None:
        assert self.paused.wait(timeout_s), "the reader did not reach its pause"
        assert self.error is None, self.error
        assert self._thread.is_alive(), f"the reader ended early, with {len(self.items)} elements"

    def resume(self) -> None:
        self.paused.clear()
        self._resume.set()

    def result(self, timeout_s: float = 60.0) -> list[int]:
        self._done = True
        self.resume()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the reader did not finish"
        if self.error is not None:
            raise self.error
        return self.items


def assert_each(items: list[int], n: int, times: int) -> None:
    counts = collections.Counter(items)
    missing = [i for i in range(n) if counts[i] < times]
    extra = sorted((k, v) for k, v in counts.items() if v > times or not 0 <= k < n)
    assert not missing and not extra, (f"expected each of range({n}) {times}x; got {len(items)}: {len(missing)} short "
                                       f"(first {missing[:10]}), {len(extra)} over (first {extra[:10]})")


class Attacker:
    """A client with the cluster token and no part in the reader's iteration."""

    def __init__(self, cluster: TestCluster):
        self.auth = ClusterAuth.resolve(TOKEN)
        self.dispatcher = DispatcherClient(cluster.dispatcher_address, timeout_ms=5_000, auth=self.auth)
        self.data_addresses = {w.address: w.data_address for w in cluster.workers}
        self.attempts = collections.Counter()
        self._channels: dict[str, grpc.Channel] = {}

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self.dispatcher.close()

    def running_tasks(self) -> list[tuple[str, int]]:
        """(worker address, task id) of every running task, as GetStatus shows them."""
        return [(w.address, t) for w in self.dispatcher.get_status().workers for t in w.tasks]

    def keys_to_try(self, task_id: int, own_key: bytes) -> list[bytes]:
        """No key, a random one, and keys valid elsewhere: its own iteration's key, raw and derived."""
        return [b"", os.urandom(32), own_key, task_read_key(own_key, task_id)]

    def grpc_get(self, address: str, request: worker_pb2.GetElementsRequest) -> grpc.StatusCode:
        """The status code of a GetElements on the worker's gRPC port (OK: it answered, with no elements)."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = make_channel(address, self.auth)
        stub = worker_pb2_grpc.WorkerStub(channel)
        self.attempts["grpc"] += 1
        try:
            chunks = list(stub.GetElements(request, timeout=15))
        except grpc.RpcError as exc:
            return exc.code()
        assert not any(c.num_elements for c in chunks), f"stolen over gRPC: {chunks[0].num_elements} elements"
        return grpc.StatusCode.OK

    def tcp_get(self, address: str, request: worker_pb2.GetElementsRequest) -> str:
        """What the worker's TCP data port answered: the header's error_type, "PermissionDeniedError" if
        the transport raised that, "transient" if it raised TransientError (the worker closed the
        connection, or answered NotFound)."""
        transport = TcpTransport(self.data_addresses[address], memory_reads=False, auth=self.auth)
        self.attempts["tcp"] += 1
        try:
            header, _ = transport.get(request)
        except errors.PermissionDeniedError:
            return "PermissionDeniedError"
        except TransientError:
            return "transient"
        finally:
            transport.close()
        assert not header.num_elements, f"stolen over TCP: {header.num_elements} elements"
        return header.error_type

    def try_to_steal(self, tasks: list[tuple[str, int]], own_key: bytes) -> None:
        """Every way in, for every (running) task: each must be refused for its key (PERMISSION_DENIED,
        not NOT_FOUND), and no element may come out."""
        for address, task_id in tasks:
            for key in self.keys_to_try(task_id, own_key):
                request = worker_pb2.GetElementsRequest(task_id=task_id, client_id=task_id + 1, max_elements=1000,
                                                        max_bytes=1 << 20, wait_ms=50, read_key=key)
                assert self.grpc_get(address, request) == grpc.StatusCode.PERMISSION_DENIED
                # Never elements. (Until the data server answers a wrong key with its PermissionDenied
                # header, it closes the connection: "transient"; see the test of the header below.)
                assert self.tcp_get(address, request) in ("PermissionDenied", "PermissionDeniedError", "transient")


def only_job(attacker: Attacker) -> int:
    jobs = wait_until(lambda: [j for j in attacker.dispatcher.get_status().jobs if j.iterations], 10,
                      "the reader's job")
    assert len(jobs) == 1
    return jobs[0].job_id


def steal_during_read(cluster: TestCluster, mode: str, copies: int) -> None:
    # Paused at the start, in the middle and near the end of the read: the attacker tries every task
    # while it runs with elements ready (the reader's fetchers hold their credits' worth meanwhile).
    pauses = (1, N // 2, copies * N - 10)
    reader = PausedReader(Dataset.range(N).apply(distribute(mode, cluster.target)), pause_at=pauses)
    attacker = Attacker(cluster)
    own = None
    try:
        reader.wait_paused()
        only_job(attacker)
        tasks = wait_until(attacker.running_tasks, 10, "the reader's tasks")  # all its: the only job
        assert len(tasks) == 2
        # A key valid for another iteration: its own, of its own job over the same dataset.
        dataset_id = attacker.dispatcher.get_status().datasets[0].dataset_id
        own = attacker.dispatcher.get_or_create_iteration(
            attacker.dispatcher.get_or_create_job(dataset_id, PE, ""), 0)
        assert len(own.read_key) >= 16
        for pause in pauses:
            if pause != pauses[0]:
                reader.resume()
                reader.wait_paused()
            for _ in range(3):
                attacker.try_to_steal(tasks, own.read_key)
        items = reader.result()
    finally:
        reader.resume()
        if own is not None:
            attacker.dispatcher.release_iteration_client(own.client_id, read_key=own.read_key)
        attacker.close()
    assert attacker.attempts["grpc"] == attacker.attempts["tcp"] == 3 * 3 * 2 * 4  # pauses, rounds, tasks, keys
    assert_each(items, N, copies)


# --- the attack ------------------------------------------------------------------------------------

def test_no_one_else_takes_elements_of_a_parallel_epochs_read(secured):
    steal_during_read(secured, "parallel_epochs", copies=2)  # every worker produces the whole range


def test_no_one_else_takes_elements_of_a_distributed_epoch_read(secured):
    steal_during_read(secured, "distributed_epoch", copies=1)


def test_the_tcp_data_port_refuses_with_a_permission_denied_header(secured):
    """Over TCP a refusal is an answer (error header "PermissionDenied", which the transport may turn
    into PermissionDeniedError), not a closed connection, which a transport takes for a transient failure
    and retries. Needs the data server to map ReadKeyError to that header."""
    reader = PausedReader(Dataset.range(N).apply(distribute("parallel_epochs", secured.target)))
    attacker = Attacker(secured)
    try:
        reader.wait_paused()
        only_job(attacker)
        (address, task_id), _ = wait_until(attacker.running_tasks, 10, "the reader's tasks")
        request = worker_pb2.GetElementsRequest(task_id=task_id, max_elements=10, wait_ms=50, read_key=b"guess")
        assert attacker.tcp_get(address, request) in ("PermissionDenied", "PermissionDeniedError")
        reader.resume()
        assert_each(reader.result(), N, 2)
    finally:
        reader.resume()
        attacker.close()


def test_an_anonymous_jobs_iteration_cannot_be_joined(secured):
    reader = PausedReader(Dataset.range(N).apply(distribute("distributed_epoch", secured.target)))
    attacker = Attacker(secured)
    try:
        reader.wait_paused()
        job_id = only_job(attacker)
        with pytest.raises(errors.PermissionDeniedError, match="private to the reader that created it.*job_name"):
            attacker.dispatcher.get_or_create_iteration(job_id, 0)
        (job,) = [j for j in attacker.dispatcher.get_status().jobs if j.job_id == job_id]
        assert job.num_clients == 1  # the refused join left no client behind
        assert_each(reader.result(), N, 1)
    finally:
        reader.resume()
        attacker.close()


def test_a_named_jobs_readers_share_it(secured):
    """Every reader of a job_name joins its iteration (tf.data's semantics): together they read
    every element once."""
    first = PausedReader(Dataset.range(N).apply(distribute("distributed_epoch", secured.target, job_name="shared",
                                                           max_outstanding_requests=8)))
    second = None
    try:
        first.wait_paused()
        second = PausedReader(Dataset.range(N).apply(distribute("distributed_epoch", secured.target,
                                                                job_name="shared")))
        second.wait_paused()
        first.resume()
        second.resume()
        a, b = first.result(), second.result()
    finally:
        first.resume()
        if second is not None:
            second.resume()
    assert a and b
    assert_each(a + b, N, 1)


# --- the dispatcher's side, without a network -------------------------------------------------------

@pytest.fixture
def core():
    return DispatcherCore(DispatcherConfig(job_gc_timeout_ms=10_000, client_timeout_ms=5_000), clock=FakeClock())


def setup(core, name: str = "", mode=PE, token: bytes = b"") -> tuple[int, pb.GetOrCreateIterationResponse]:
    for w in ("w1:1", "w2:1"):
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=w, worker_uid="u"))
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"pipeline", num_splits=4)).dataset_id
    job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=dataset_id, processing_mode=mode,
                                                             job_name=name)).job_id
    return job_id, join(core, job_id, token)


def join(core, job_id: int, token: bytes = b"", repetition: int = 0) -> pb.GetOrCreateIterationResponse:
    return core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, repetition=repetition,
                                                                       request_token=token))


def test_each_iteration_gets_a_random_key_and_its_creator_gets_it(core):
    job_id, it = setup(core, name="j")
    later = join(core, job_id, repetition=1)
    assert len(it.read_key) == 32 and len(later.read_key) == 32 and it.read_key != later.read_key
    assert core.state.iterations[it.iteration_id].read_key == it.read_key
    assert repr(it.read_key) not in repr(core.state.iterations[it.iteration_id])


def test_an_anonymous_job_is_private_and_a_named_job_shared(core):
    job_id, it = setup(core, name="", token=b"creator-token-0123")
    for token in (b"", b"another-token-000", b"creator-token-012"):
        with pytest.raises(errors.PermissionDeniedError, match="private to the reader that created it"):
            join(core, job_id, token)
    assert core.state.iterations[it.iteration_id].clients == {it.client_id}
    # The creator's retry (its first answer lost) carries its request's token: it gets in.
    retry = join(core, job_id, b"creator-token-0123")
    assert retry.read_key == it.read_key and retry.iteration_id == it.iteration_id
    # Another repetition of someone's anonymous job is an iteration of one's own, with its own key.
    other = join(core, job_id, repetition=1)
    assert other.read_key != it.read_key

    named_job, first = setup(core, name="shared")
    second = join(core, named_job)
    assert second.iteration_id == first.iteration_id and second.existing
    assert second.read_key == first.read_key


def test_a_creator_without_a_token_has_no_retry_either(core):
    job_id, _ = setup(core, name="")
    with pytest.raises(errors.PermissionDeniedError):
        join(core, job_id, b"")


@pytest.mark.parametrize("mode", [PE, DE])
def test_workers_get_a_key_per_task_and_clients_none(core, mode):
    job_id, it = setup(core, mode=mode)
    tasks = core.state.iterations[it.iteration_id].tasks
    assert len(tasks) == 2
    keys = {}
    for address in ("w1:1", "w2:1"):
        (task,) = core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid="u")).new_tasks
        assert task.read_key == task_read_key(it.read_key, task.task_id)
        keys[task.task_id] = task.read_key
    # A worker's keys open its own tasks only: not the iteration, not the other worker's task.
    assert len(set(keys.values())) == 2 and it.read_key not in keys.values()
    beat = core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key))
    assert len(beat.tasks) == 2 and all(t.read_key == b"" for t in beat.tasks)
    status = core.get_status(pb.GetStatusRequest()).SerializeToString()
    for secret in (it.read_key, *keys.values()):
        assert secret not in status
    assert not any(repr(it.read_key) in repr(event) for event in core.events)


def test_task_keys_are_derived_from_the_iteration_key():
    key = os.urandom(32)
    assert task_read_key(key, 7) == task_read_key(key, 7)
    assert task_read_key(key, 7) != task_read_key(key, 8)
    assert task_read_key(os.urandom(32), 7) != task_read_key(key, 7)
    assert task_read_key(b"", 7) == b""  # an iteration from an old journal: no key to check


# --- journal replay and checkpoints ------------------------------------------------------------------

def journaled_core(work_dir, checkpoint_records: int = 10_000) -> tuple[DispatcherCore, JournaledStore]:
    store = JournaledStore(str(work_dir), checkpoint_records=checkpoint_records)
    store.open()
    return DispatcherCore(DispatcherConfig(), store=store), store


def reopened(work_dir) -> DispatcherState:
    store = JournaledStore(str(work_dir))
    store.open()
    store.close()
    return store.state


def it_job(core, it) -> int:
    return core.state.iterations[it.iteration_id].job_id


def test_the_key_survives_journal_replay(tmp_path):
    core, store = journaled_core(tmp_path)
    _, it = setup(core, token=b"creator-token-0123")
    store.wait_durable()
    expected = comparable(core.state)
    store.close()
    state = reopened(tmp_path)
    assert comparable(state) == expected
    replayed = state.iterations[it.iteration_id]
    assert replayed.read_key == it.read_key and replayed.creator_token == b"creator-token-0123"

    # The restarted dispatcher hands workers the same task keys, and the creator's retry still gets in.
    store = JournaledStore(str(tmp_path))
    store.open()
    try:
        restarted = DispatcherCore(DispatcherConfig(), store=store)
        (task,) = restarted.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="w1:1", worker_uid="u")
                                             ).new_tasks
        assert task.read_key == task_read_key(it.read_key, task.task_id)
        assert join(restarted, it_job(restarted, it), b"creator-token-0123").read_key == it.read_key
    finally:
        store.close()


def test_the_key_survives_a_checkpoint(tmp_path):
    core, store = journaled_core(tmp_path, checkpoint_records=5)
    job_id, it = setup(core, name="j", token=b"creator-token-0123")
    for _ in range(20):  # records enough for checkpoints well past the iteration's creation
        join(core, job_id)
    store.wait_durable()
    expected = comparable(core.state)
    store.close()

    records, _ = read_records(os.path.join(str(tmp_path), CHECKPOINT_FILE), tolerate_torn_tail=False)
    created = [u.create_iteration for u in (state_pb2.Update.FromString(p) for _, p in records)
               if u.WhichOneof("kind") == "create_iteration"]
    assert [(c.iteration_id, c.read_key, c.creator_token) for c in created] == [
        (it.iteration_id, it.read_key, b"creator-token-0123")]
    state = reopened(tmp_path)
    assert comparable(state) == expected
    assert state.iterations[it.iteration_id].read_key == it.read_key


def test_an_iteration_from_an_old_journal_has_no_key():
    """Journals written before read keys: the iteration replays with an empty key, its tasks get none,
    and their workers serve any reader (its readers, from before the upgrade, have no key to send)."""
    state = DispatcherState()
    for update in (
            state_pb2.Update(register_dataset=state_pb2.RegisterDatasetUpdate(dataset_id=1, fingerprint="f",
                                                                              dataset_def=b"p", num_splits=4)),
            state_pb2.Update(create_job=state_pb2.CreateJobUpdate(job_id=2, dataset_id=1, processing_mode=PE)),
            state_pb2.Update(create_iteration=state_pb2.CreateIterationUpdate(iteration_id=3, job_id=2))):
        state.apply(update)
    assert state.iterations[3].read_key == b"" and state.iterations[3].creator_token == b""


# --- the worker's check --------------------------------------------------------------------------------

class OneTask:
    """A TaskSource holding one parallel_epochs task (which needs no dispatcher)."""

    address = "localhost:0"

    def __init__(self, read_key: bytes):
        task = pb.TaskDef(task_id=7, processing_mode=PE, stream_id=7, read_key=read_key)
        self.runner = TaskRunner(task, Dataset.range(10), dispatcher=None, worker_address=self.address)

    def find_task(self, task_id: int, wait_s: float) -> Optional[TaskRunner]:
        return self.runner if task_id == 7 else None


def test_a_wrong_key_takes_nothing_from_the_task():
    key = os.urandom(32)
    worker = OneTask(key)
    try:
        for wrong in (b"", os.urandom(32), key[:-1], key + b"\0"):
            with pytest.raises(ReadKeyError, match="read key"):
                prepare(worker, worker_pb2.GetElementsRequest(task_id=7, max_elements=5, wait_ms=1000,
                                                              read_key=wrong))
        prepared = prepare(worker, worker_pb2.GetElementsRequest(task_id=7, max_elements=100, wait_ms=1000,
                                                                 read_key=key))
        assert prepared.header.runs[0].first_offset == 0  # nothing was taken before
    finally:
        worker.runner.stop()


def test_a_task_without_a_key_serves_anyone():
    worker = OneTask(b"")
    try:
        prepared = prepare(worker, worker_pb2.GetElementsRequest(task_id=7, max_elements=100, wait_ms=1000,
                                                                 read_key=b"anything"))
        assert prepared.header.num_elements > 0
    finally:
        worker.runner.stop()
