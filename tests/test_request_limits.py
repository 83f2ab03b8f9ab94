"""Bounds on every request field (issue 11): out of bounds is INVALID_ARGUMENT naming the field.

Through the real client API where one reaches the field (``register_dataset`` of a pipeline
over ``max_dataset_def_bytes``, ``distribute`` with a long ``job_name``, a heartbeat of 800,000
ranges), through plain stubs on a real dispatcher and worker otherwise: no client of ours sends
a negative id. Also: refusals and bugs are logged at most once a minute per method and kind,
never per call, and every call is timed into the dispatcher's RPC latency statistics.
"""

from __future__ import annotations

import logging

import grpc
import numpy as np
import pytest

import dataservice as ds
from dataservice import errors
from dataservice.dispatcher import request_checks as rc
from dataservice.dispatcher.core import MAX_WORKER_ADDRESS_CHARS
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import dispatcher_pb2_grpc, state_pb2, worker_pb2, worker_pb2_grpc
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.log_limits import RateLimitedLog
from dataservice.service.rpc import add_service, create_server, make_channel
from dataservice.data.serialization import serialize_dataset
from tests.cluster import TestCluster, run_with_deadline

#: The cluster's max_dataset_def_bytes: small, so a pipeline over it is cheap to build.
DEF_LIMIT = 64 * 1024
PE = state_pb2.PARALLEL_EPOCHS


@pytest.fixture(scope="module")
def limited():
    with TestCluster(num_workers=1, max_dataset_def_bytes=DEF_LIMIT) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def stubs(limited):
    dispatcher_channel = make_channel(limited.dispatcher_address)
    worker_channel = make_channel(limited.workers[0].address)
    yield dispatcher_pb2_grpc.DispatcherStub(dispatcher_channel), worker_pb2_grpc.WorkerStub(worker_channel)
    dispatcher_channel.close()
    worker_channel.close()


def refusal(call) -> str:
    """The details of the INVALID_ARGUMENT ``call()`` must end with."""
    with pytest.raises(grpc.RpcError) as info:
        run_with_deadline(call, 15)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (info.value.code(), info.value.details())
    return info.value.details()


# --- the pipeline definition ------------------------------------------------------------------------------

def test_a_pipeline_over_max_dataset_def_bytes_is_refused_naming_the_limit_and_how_to_raise_it(limited):
    big = ds.Dataset.from_tensor_slices(np.arange(100_000))   # the array travels in the definition: 800 KB
    with pytest.raises(errors.InvalidRequestError) as info:
        ds.register_dataset(limited.target, big, timeout_ms=10_000)
    message = str(info.value)
    for part in ("dataset_def is 8", f"{DEF_LIMIT:,}", "DispatcherConfig.max_dataset_def_bytes",
                 "--max-dataset-def-bytes", "read it from a file"):
        assert part in message, message
    # distribute registers it too: the same error from the first iteration, not a hang.
    with pytest.raises(errors.InvalidRequestError, match="max_dataset_def_bytes"):
        run_with_deadline(lambda: list(big.apply(ds.distribute("parallel_epochs", limited.target,
                                                               timeout_ms=10_000))), 30)
    # Within the limit: registered and read as ever.
    small = ds.Dataset.from_tensor_slices(np.arange(100))
    assert len(serialize_dataset(small)) < DEF_LIMIT
    assert sorted(int(x) for x in small.apply(ds.distribute("parallel_epochs", limited.target))) == list(range(100))


def test_a_definition_no_dispatcher_accepts_is_refused_before_it_is_sent(limited):
    client = DispatcherClient(limited.dispatcher_address, timeout_ms=10_000)
    try:
        with pytest.raises(errors.InvalidRequestError, match="more than any dispatcher accepts.*read it from a file"):
            client.register_dataset(b"x" * (61 << 20), 1)  # gRPC would refuse to send it, naming neither
    finally:
        client.close()


def test_a_job_name_over_the_bound_is_refused_through_distribute(limited):
    dataset = ds.Dataset.range(3).apply(ds.distribute("parallel_epochs", limited.target, job_name="j" * 300,
                                                      timeout_ms=10_000))
    with pytest.raises(errors.InvalidRequestError, match=r"job_name has 300 characters, more than 256"):
        run_with_deadline(lambda: list(dataset), 30)


# --- each field ----------------------------------------------------------------------------------------

_DEF = b"a pipeline"
_KEY = bytes(rc.MAX_KEY_BYTES + 1)

DISPATCHER_CASES = [
    ("RegisterDataset", pb.RegisterDatasetRequest(dataset_def=b"", num_splits=1), "dataset_def is empty"),
    ("RegisterDataset", pb.RegisterDatasetRequest(dataset_def=_DEF, num_splits=-3), "num_splits is -3, less than -2"),
    ("GetDatasetDef", pb.GetDatasetDefRequest(dataset_id=0), "dataset_id is 0: ids are positive"),
    ("GetOrCreateJob", pb.GetOrCreateJobRequest(dataset_id=-1, processing_mode=PE), "dataset_id is -1"),
    ("GetOrCreateJob", pb.GetOrCreateJobRequest(dataset_id=1, processing_mode=7), "processing_mode is 7, not a known"),
    ("GetOrCreateJob", pb.GetOrCreateJobRequest(dataset_id=1, processing_mode=PE, job_name="n" * 257),
     "job_name has 257 characters, more than 256"),
    ("GetOrCreateJob", pb.GetOrCreateJobRequest(dataset_id=1, processing_mode=PE, job_name="a\nb"),
     "unprintable character '\\n'"),
    ("GetOrCreateIteration", pb.GetOrCreateIterationRequest(job_id=0), "job_id is 0"),
    ("GetOrCreateIteration", pb.GetOrCreateIterationRequest(job_id=1, repetition=-1),
     "repetition is -1, outside [0, 2,147,483,647]"),
    ("GetOrCreateIteration", pb.GetOrCreateIterationRequest(job_id=1, repetition=2 ** 62), "repetition is"),
    ("GetOrCreateIteration", pb.GetOrCreateIterationRequest(job_id=1, request_token=_KEY),
     "request_token is 65 bytes, more than 64"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=0), "client_id is 0"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, read_key=_KEY), "read_key is 65 bytes, more than 64"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, stopped_tasks=[7] * (rc.MAX_TASK_IDS + 1)),
     "stopped_tasks has 100,001 task ids, more than 100,000"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, stopped_tasks=[7, -7]),
     "stopped_tasks holds the task id -7"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, progress=[state_pb2.SplitProgress(ranges=[0, 5, 9])]),
     "progress[0].ranges has 3 numbers, an odd count"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, progress=[
        state_pb2.SplitProgress(ranges=[0, 5]), state_pb2.SplitProgress(ranges=[0, 5, 9, 9])]),
     "progress[1].ranges[2:4] is [9, 9): a range must have 0 <= start < end"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, progress=[state_pb2.SplitProgress(ranges=[-4, 5])]),
     "progress[0].ranges[0:2] is [-4, 5)"),
    # Past 16 ranges the check runs in numpy: the same message.
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, progress=[
        state_pb2.SplitProgress(ranges=[v for i in range(20) for v in (10 * i, 10 * i + 5)] + [300, 299])]),
     "progress[0].ranges[40:42] is [300, 299): a range must have 0 <= start < end"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, progress=[state_pb2.SplitProgress(total=-2)]),
     "progress[0].total is -2, less than -1"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, progress=[state_pb2.SplitProgress(split_index=-1)]),
     "progress[0].split_index is -1"),
    ("ReleaseIterationClient", pb.ReleaseIterationClientRequest(client_id=-5), "client_id is -5"),
    ("ReleaseIterationClient", pb.ReleaseIterationClientRequest(client_id=1, read_key=_KEY), "read_key is 65 bytes"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="h" * 300 + ":1"),
     f"worker_address has 302 characters, more than {MAX_WORKER_ADDRESS_CHARS}"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="host:1", data_address="no port"), "data_address"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="host:1", worker_uid="u" * 65),
     "worker_uid has 65 characters, more than 64"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="host:1", current_tasks=[1] * 100_001),
     "current_tasks has 100,001 task ids"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="host:1", finished_tasks=[0]),
     "finished_tasks holds the task id 0"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="host:1", wait_ms=-1), "wait_ms is -1"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="host:1", wait_ms=2 ** 40),
     "wait_ms is 1099511627776, outside [0, 3,600,000]"),
    ("GetSplit", pb.GetSplitRequest(iteration_id=0, task_id=1), "iteration_id is 0"),
    ("GetSplit", pb.GetSplitRequest(iteration_id=1, task_id=-1), "task_id is -1"),
    ("GetSplit", pb.GetSplitRequest(iteration_id=1, task_id=1, request_id=-1), "request_id is -1, less than 0"),
    ("GetStatus", pb.GetStatusRequest(max_items=-1), "max_items is -1, less than 0"),
    # Issue 18's fields: read options, coordinated rounds, worker tags and host.
    ("GetOrCreateJob", pb.GetOrCreateJobRequest(dataset_id=1, processing_mode=PE, num_consumers=-1),
     "num_consumers is -1, outside [0, 100,000]"),
    ("GetOrCreateJob", pb.GetOrCreateJobRequest(dataset_id=1, processing_mode=PE, target_workers="x" * 100),
     "target_workers 'xxxx"),
    ("GetOrCreateIteration", pb.GetOrCreateIterationRequest(job_id=1, consumer_index=-1), "consumer_index is -1"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, current_round=-1), "current_round is -1"),
    ("ClientHeartbeat", pb.ClientHeartbeatRequest(client_id=1, acknowledged_block_round=-1),
     "acknowledged_block_round is -1"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="host:1", worker_tags=["a,b"]),
     "worker_tags: the tag 'a,b': a worker has at most 32 tags, each a non-empty string of at most 64"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="host:1", worker_tags=["t"] * 33),
     "worker_tags: 33 tags, more than 32"),
    ("WorkerHeartbeat", pb.WorkerHeartbeatRequest(worker_address="host:1", host_id="node 7"),
     "host_id must be a non-empty string of at most 128 printable characters without whitespace"),
]


@pytest.mark.parametrize("method, request_, expected", DISPATCHER_CASES,
                         ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(DISPATCHER_CASES)])
def test_a_dispatcher_field_out_of_bounds_is_invalid_argument_naming_it(stubs, method, request_, expected):
    dispatcher, _ = stubs
    details = refusal(lambda: getattr(dispatcher, method)(request_, timeout=10))
    assert details.startswith(f"{method}: ") and expected in details, details


WORKER_CASES = [
    (worker_pb2.GetElementsRequest(task_id=0, max_elements=1), "task_id is 0: ids are positive"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=0), "max_elements is 0, less than 1"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, client_id=-1), "client_id is -1"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, max_bytes=-1), "max_bytes is -1"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, wait_ms=-1), "wait_ms is -1"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, read_key=_KEY), "read_key is 65 bytes, more than 64"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, consumer_index=-1), "consumer_index is -1"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, round_index=-1), "round_index is -1"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, trainer_id="t" * 257),
     "trainer_id has 257 characters, more than 256"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, compression="L" * 17),
     "compression has 17 characters, more than 16"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, receive_bytes_per_s=2 ** 64 - 1),
     "receive_bytes_per_s is 18446744073709551615"),
    (worker_pb2.GetElementsRequest(task_id=1, max_elements=1, decompress_bytes_per_s=10 ** 13 + 1),
     "decompress_bytes_per_s is 10000000000001"),
]


@pytest.mark.parametrize("request_, expected", WORKER_CASES, ids=[e.split(" ")[0] for _, e in WORKER_CASES])
def test_a_get_elements_field_out_of_bounds_is_invalid_argument_naming_it(stubs, request_, expected):
    _, worker = stubs
    details = refusal(lambda: list(worker.GetElements(request_, timeout=10)))
    assert details.startswith("GetElements: ") and expected in details, details


@pytest.mark.parametrize("request_, expected", WORKER_CASES, ids=[e.split(" ")[0] for _, e in WORKER_CASES])
def test_the_data_port_refuses_the_same_fields_out_of_bounds(limited, request_, expected):
    from tests.test_data_transfer_auth import raw_connection, read_response, request_bytes

    with raw_connection(int(limited.workers[0].data_address.rsplit(":", 1)[1]), timeout_s=10) as sock:
        sock.sendall(request_bytes(request_))
        header = read_response(sock)
    assert header.error_type == "InvalidArgument" and expected in header.error_message, header


def test_a_heartbeat_of_800k_ranges_is_accepted_and_past_2m_ranges_refused(limited):
    client = DispatcherClient(limited.dispatcher_address, timeout_ms=10_000)
    try:
        # Endless, so that the iteration is still running when the heartbeat comes.
        dataset_id = client.register_dataset(serialize_dataset(ds.Dataset.range(10).repeat()), 1)
        iteration = client.get_or_create_iteration(client.get_or_create_job(dataset_id, PE, ""), 0)
        # What a reader holding every other element of a split, received in reverse order, reports.
        flat = [v for k in range(800_000, 0, -1) for v in (2 * k, 2 * k + 1)]
        progress = [state_pb2.SplitProgress(stream_id=1, split_index=0, ranges=flat, total=-1)]
        assert 4_500_000 < pb.ClientHeartbeatRequest(client_id=iteration.client_id, progress=progress).ByteSize()
        client.client_heartbeat(iteration.client_id, progress, read_key=iteration.read_key)
        core = limited.dispatcher.core
        with core._cond:  # the core's lock: a consistent view of the state
            held = core.state.iterations[iteration.iteration_id].progress[(1, 0)]
            assert len(held.ranges) == 800_000
        too_many = [v for k in range(rc.MAX_PROGRESS_RANGES + 1) for v in (3 * k, 3 * k + 1)]
        with pytest.raises(errors.InvalidRequestError, match=r"progress holds more than 2,000,000 ranges"):
            client.client_heartbeat(iteration.client_id, [state_pb2.SplitProgress(ranges=too_many)],
                                    read_key=iteration.read_key)
    finally:
        client.close()


# --- logging and timing -------------------------------------------------------------------------------------

def test_refusals_are_logged_once_per_method_and_kind_without_a_traceback(caplog):
    caplog.set_level(logging.WARNING, logger="dataservice")
    with TestCluster(num_workers=0) as fresh:  # its log limits have seen nothing yet
        channel = make_channel(fresh.dispatcher_address)
        dispatcher = dispatcher_pb2_grpc.DispatcherStub(channel)
        raw = channel.unary_unary("/dataservice.Dispatcher/GetDatasetDef")  # no serializer: bytes as they are
        try:
            for _ in range(20):
                refusal(lambda: dispatcher.GetDatasetDef(pb.GetDatasetDefRequest(dataset_id=-1), timeout=10))
                refusal(lambda: raw(b"\xff\xff\xff", timeout=10))
        finally:
            channel.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("GetDatasetDef")]
    assert len(lines) == 2, lines
    assert not any(r.exc_info for r in caplog.records)
    assert any("dataset_id is -1" in line for line in lines), lines
    assert any("not a valid dataservice.GetDatasetDefRequest (3 bytes): Wire format was corrupt" in line
               for line in lines), lines


def test_every_call_is_timed_into_the_rpc_latency_of_the_status(stubs, limited):
    dispatcher, _ = stubs
    status = DispatcherClient(limited.dispatcher_address)
    try:
        before = {m.method: m.calls for m in status.get_status().rpc_latency}
        for _ in range(3):
            with pytest.raises(grpc.RpcError):  # NOT_FOUND: still a call the dispatcher answered
                dispatcher.GetSplit(pb.GetSplitRequest(iteration_id=12345, task_id=1), timeout=10)
            refusal(lambda: dispatcher.GetSplit(pb.GetSplitRequest(iteration_id=0, task_id=1), timeout=10))
        after = {m.method: m for m in status.get_status().rpc_latency}
    finally:
        status.close()
    assert after["GetSplit"].calls - before.get("GetSplit", 0) == 6
    assert after["GetStatus"].calls >= 1 and after["GetSplit"].max_ms > 0


def test_a_bug_is_internal_and_logged_with_its_traceback_once_a_minute(caplog):
    """A real server with an implementation that raises: INTERNAL with the exception's type, one
    log line with the traceback for many calls, and a line per exception type."""
    caplog.set_level(logging.ERROR, logger="test.bug")
    calls = {"n": 0}

    def broken(request):
        calls["n"] += 1
        raise (KeyError if calls["n"] > 10 else RuntimeError)("boom")

    service = pb.DESCRIPTOR.services_by_name["Dispatcher"]
    server, port = create_server("127.0.0.1:0")
    add_service(server, service, {m.name: broken for m in service.methods}, logging.getLogger("test.bug"))
    server.start()
    channel = make_channel(f"127.0.0.1:{port}")
    try:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        for _ in range(15):
            with pytest.raises(grpc.RpcError) as info:
                stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "boom" in info.value.details() and "KeyError" in info.value.details()
    finally:
        channel.close()
        server.stop(None)
    records = [r for r in caplog.records if r.name == "test.bug"]
    assert [(r.exc_info[0].__name__, "GetStatus failed with" in r.getMessage()) for r in records] == \
        [("RuntimeError", True), ("KeyError", True)]


# --- the rate-limited log ------------------------------------------------------------------------------------

def test_rate_limited_log_holds_back_lines_and_says_how_many(caplog):
    now = [100.0]
    limited = RateLimitedLog(logging.getLogger("test.limits"), interval_s=60, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="test.limits")
    assert limited.warning("a", "first %d", 1)
    assert not limited.warning("a", "second %d", 2)
    assert limited.warning("b", "other key")        # keys are limited apart
    now[0] += 59.9
    assert not limited.warning("a", "third")
    assert limited.held_back("a") == 2
    now[0] += 0.2
    assert limited.warning("a", "fourth %s", "x")
    assert [r.getMessage() for r in caplog.records] == [
        "first 1", "other key", "fourth x (2 more like it in the last 60 s not logged)"]
    assert limited.held_back("a") == 0
