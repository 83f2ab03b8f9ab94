"""Only the cluster's own members get in: the token on every gRPC port, protected defaults.

The servers here are real processes started with ``--auth-token-file``; the attacker
side uses raw gRPC stubs with no dataservice client, as an outsider would.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import grpc
import pytest

import dataservice as ds
from dataservice import errors
from dataservice.data.environment import versions
from dataservice.proto import dispatcher_pb2, dispatcher_pb2_grpc, pipeline_pb2, worker_pb2, worker_pb2_grpc
from dataservice.service.auth import ClusterAuth, credential_metadata, resolve_token
from dataservice.service.config import DispatcherConfig, WorkerConfig
from tests.processes import REPO, Processes, Server, subprocess_env, wait_until

TOKEN = "the-cluster-token-for-these-tests-0123456789"
WRONG = "another-clusters-token-0123456789abcdef"


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "auth_token"
    path.write_text(TOKEN + "\n")
    return str(path)


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch):
    monkeypatch.delenv("DATASERVICE_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("DATASERVICE_AUTH_TOKEN_FILE", raising=False)


def secured_cluster(procs: Processes, token_file: str, num_workers: int = 2) -> tuple[Server, list[Server]]:
    dispatcher = procs.dispatcher("--auth-token-file", token_file)
    workers = [procs.worker(dispatcher.port, "--auth-token-file", token_file, wait=False) for _ in range(num_workers)]
    return dispatcher, [procs.await_worker(w) for w in workers]


class _Marker:
    """Unpickling it writes a file: the payload of an attacker who sends pickles."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _payload(marker: str) -> bytes:
    # A dataset definition whose pickle runs a command while it is loaded, before it is even a pipeline.
    return pipeline_pb2.PipelineDef(pipeline=pickle.dumps(_Marker(marker)), versions=versions()).SerializeToString()


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


# --- the dispatcher's port ---------------------------------------------------------------------

@pytest.mark.slow
def test_the_dispatcher_refuses_every_call_without_the_right_token(procs, token_file):
    dispatcher, _ = secured_cluster(procs, token_file, num_workers=0)
    with pytest.raises(errors.PermissionDeniedError, match="carries no auth token"):
        ds.register_dataset(dispatcher.target, ds.Dataset.range(3), timeout_ms=5_000)
    with pytest.raises(errors.PermissionDeniedError, match="different auth token"):
        ds.register_dataset(dispatcher.target, ds.Dataset.range(3), timeout_ms=5_000, auth_token=WRONG)
    assert ds.register_dataset(dispatcher.target, ds.Dataset.range(3), timeout_ms=5_000, auth_token=TOKEN) > 0

    channel = grpc.insecure_channel(f"localhost:{dispatcher.port}")
    stub = dispatcher_pb2_grpc.DispatcherStub(channel)
    try:
        for method, request in [("GetStatus", dispatcher_pb2.GetStatusRequest()),
                                ("GetDatasetDef", dispatcher_pb2.GetDatasetDefRequest(dataset_id=1)),
                                ("RegisterDataset", dispatcher_pb2.RegisterDatasetRequest(dataset_def=b"x")),
                                ("WorkerHeartbeat", dispatcher_pb2.WorkerHeartbeatRequest(worker_address="evil:1")),
                                ("GetSplit", dispatcher_pb2.GetSplitRequest(iteration_id=1, task_id=1))]:
            assert _code(lambda: getattr(stub, method)(request, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED, method
            wrong = credential_metadata(ClusterAuth(WRONG))
            assert _code(lambda: getattr(stub, method)(request, timeout=5, metadata=wrong)) == \
                grpc.StatusCode.UNAUTHENTICATED, method
        # The health service stays open, for probes and orchestrators.
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()


@pytest.mark.slow
def test_status_needs_the_token(procs, token_file):
    dispatcher, _ = secured_cluster(procs, token_file, num_workers=1)
    env = subprocess_env()
    refused = subprocess.run([sys.executable, "-m", "dataservice", "status", "--dispatcher",
                              f"localhost:{dispatcher.port}"], capture_output=True, text=True, env=env, cwd=REPO,
                             timeout=30)
    assert refused.returncode == 2 and "no auth token" in refused.stderr and "Traceback" not in refused.stderr
    ok = subprocess.run([sys.executable, "-m", "dataservice", "status", "--dispatcher", f"localhost:{dispatcher.port}",
                         "--auth-token-file", token_file], capture_output=True, text=True, env=env, cwd=REPO,
                        timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert "workers: 1" in ok.stdout


@pytest.mark.slow
def test_a_pickled_payload_sent_without_the_token_never_runs(procs, token_file, tmp_path):
    dispatcher, workers = secured_cluster(procs, token_file, num_workers=1)
    marker = tmp_path / "pwned"
    channel = grpc.insecure_channel(f"localhost:{dispatcher.port}")
    stub = dispatcher_pb2_grpc.DispatcherStub(channel)
    try:
        # An outsider registers the payload and asks for a job over it: both refused.
        for metadata in (None, credential_metadata(ClusterAuth(WRONG))):
            assert _code(lambda: stub.RegisterDataset(dispatcher_pb2.RegisterDatasetRequest(
                dataset_def=_payload(str(marker)), num_splits=-2), timeout=5, metadata=metadata)) == \
                grpc.StatusCode.UNAUTHENTICATED
            assert _code(lambda: stub.GetOrCreateJob(dispatcher_pb2.GetOrCreateJobRequest(
                dataset_id=1, processing_mode=1), timeout=5, metadata=metadata)) == grpc.StatusCode.UNAUTHENTICATED
        # The workers hold no task: nothing was loaded, and the marker is absent.
        status = procs.status(dispatcher.port, token_file=token_file)
        assert status["datasets"] == [] and all(not w["tasks"] for w in status["workers"]), status
        assert not marker.exists()

        # The payload is live: a member holding the token does make a worker load it (that is the product —
        # whoever holds the token runs code on the workers), so only the refusal kept it from running.
        member = credential_metadata(ClusterAuth(TOKEN))
        dataset_id = stub.RegisterDataset(dispatcher_pb2.RegisterDatasetRequest(
            dataset_def=_payload(str(marker)), num_splits=-2), timeout=5, metadata=member).dataset_id
        job_id = stub.GetOrCreateJob(dispatcher_pb2.GetOrCreateJobRequest(
            dataset_id=dataset_id, processing_mode=1), timeout=5, metadata=member).job_id
        stub.GetOrCreateIteration(dispatcher_pb2.GetOrCreateIterationRequest(job_id=job_id), timeout=5,
                                  metadata=member)
        wait_until(marker.exists, 20, "a worker to load the member's pipeline")
    finally:
        channel.close()


@pytest.mark.slow
def test_a_fake_worker_without_the_token_is_refused(procs, token_file):
    dispatcher, workers = secured_cluster(procs, token_file, num_workers=1)
    channel = grpc.insecure_channel(f"localhost:{dispatcher.port}")
    stub = dispatcher_pb2_grpc.DispatcherStub(channel)
    try:
        fake = dispatcher_pb2.WorkerHeartbeatRequest(worker_address="localhost:1", worker_uid="fake",
                                                     data_address="localhost:2")
        assert _code(lambda: stub.WorkerHeartbeat(fake, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: stub.WorkerHeartbeat(fake, timeout=5, metadata=credential_metadata(ClusterAuth(WRONG)))) \
            == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    status = procs.status(dispatcher.port, token_file=token_file)
    assert [w["address"] for w in status["workers"]] == [workers[0].address]
    # ... and reads go on, with every element from the real worker.
    dataset = ds.Dataset.range(500).apply(ds.distribute("parallel_epochs", dispatcher.target, auth_token=TOKEN,
                                                        timeout_ms=20_000))
    assert sorted(int(x) for x in dataset) == list(range(500))


# --- a worker's gRPC port ------------------------------------------------------------------------

@pytest.mark.slow
def test_a_workers_grpc_port_refuses_get_elements_without_the_token(procs, token_file):
    dispatcher, workers = secured_cluster(procs, token_file, num_workers=1)
    channel = grpc.insecure_channel(f"localhost:{workers[0].port}")
    stub = worker_pb2_grpc.WorkerStub(channel)
    try:
        request = worker_pb2.GetElementsRequest(task_id=1, max_elements=10)
        for metadata in (None, credential_metadata(ClusterAuth(WRONG))):
            assert _code(lambda: list(stub.GetElements(request, timeout=5, metadata=metadata))) == \
                grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    # A client without the token, reading over the worker's gRPC port: refused, named, no hang.
    with pytest.raises(errors.PermissionDeniedError):
        list(ds.Dataset.range(10).apply(ds.distribute("parallel_epochs", dispatcher.target, timeout_ms=10_000,
                                                      data_transfer_protocol="grpc")))


# --- a worker's data-transfer port -----------------------------------------------------------------

@pytest.mark.slow
def test_a_workers_data_port_refuses_peers_without_the_token(procs, token_file):
    import socket

    from dataservice.client.transports import TcpTransport
    from dataservice.service.data_transfer import REQUEST_HEADER, RESPONSE_HEADER, recv_into_exact
    from tests.cluster import free_port

    dispatcher = procs.dispatcher("--auth-token-file", token_file)
    data_port = free_port()
    procs.worker(dispatcher.port, "--auth-token-file", token_file, "--data-transfer-port", str(data_port))
    request = worker_pb2.GetElementsRequest(task_id=1, max_elements=10)

    # No token: a request without the handshake gets an Unauthenticated header (a protobuf, never a pickle)
    # and the connection closes.
    with socket.create_connection(("127.0.0.1", data_port), timeout=10) as sock:
        body = request.SerializeToString()
        sock.sendall(REQUEST_HEADER.pack(len(body)) + body)
        fixed = bytearray(RESPONSE_HEADER.size)
        assert recv_into_exact(sock, memoryview(fixed))
        header_len, prefix_len, frame_len = RESPONSE_HEADER.unpack(fixed)
        raw = bytearray(header_len)
        assert recv_into_exact(sock, memoryview(raw))
        header = worker_pb2.ElementChunk.FromString(bytes(raw))
        assert header.error_type == "Unauthenticated" and (prefix_len, frame_len) == (0, 0)
        assert "requires the cluster's auth token" in header.error_message
        assert sock.recv(1) == b""  # closed
    # Another token: the handshake fails, and nothing is read.
    for token in (None, WRONG):
        transport = TcpTransport(f"localhost:{data_port}", auth=ClusterAuth(token) if token else None,
                                 memory_reads=False)
        try:
            with pytest.raises(errors.PermissionDeniedError):
                transport.get(request)
        finally:
            transport.close()


# --- reads with the token ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
@pytest.mark.parametrize("protocol", [None, "grpc"], ids=["default-data-path", "grpc"])
def test_members_read_in_both_modes(procs, token_file, mode, protocol):
    dispatcher, workers = secured_cluster(procs, token_file)
    dataset = ds.Dataset.range(2_000).map(lambda x: x * 3).apply(ds.distribute(
        mode, dispatcher.target, auth_token=TOKEN, timeout_ms=20_000, data_transfer_protocol=protocol))
    got = sorted(int(x) for x in dataset)
    copies = 2 if mode == "parallel_epochs" else 1
    assert got == sorted([x * 3 for x in range(2_000)] * copies)


CLIENT_WITH_ENV_TOKEN = """
import sys
import dataservice as ds

# No auth_token argument: the token comes from DATASERVICE_AUTH_TOKEN_FILE.
dataset = ds.Dataset.range(100).apply(ds.distribute("distributed_epoch", sys.argv[1], timeout_ms=20_000))
print(sum(int(x) for x in dataset))
"""


@pytest.mark.slow
def test_a_training_script_takes_the_token_from_the_environment(procs, token_file):
    dispatcher, _ = secured_cluster(procs, token_file, num_workers=1)
    env = {**subprocess_env(), "DATASERVICE_AUTH_TOKEN_FILE": token_file}
    result = subprocess.run([sys.executable, "-c", CLIENT_WITH_ENV_TOKEN, dispatcher.target], capture_output=True,
                            text=True, env=env, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(sum(range(100)))


# --- protected defaults ------------------------------------------------------------------------------

def test_servers_listen_on_loopback_unless_given_a_token_or_insecure(monkeypatch):
    assert DispatcherConfig().host == "localhost" and WorkerConfig("localhost:1").host == "localhost"
    for make in (lambda **kw: DispatcherConfig(**kw), lambda **kw: WorkerConfig("localhost:1", **kw)):
        with pytest.raises(ValueError, match="without an auth token: anyone who can reach it could run code"):
            make(host="0.0.0.0")
        with pytest.raises(ValueError, match="without an auth token"):
            make(host="::")
        assert make(host="0.0.0.0", insecure=True).insecure
        assert make(host="0.0.0.0", auth_token=TOKEN).auth_token == TOKEN
        assert make(host="127.0.0.1").host == "127.0.0.1"
        monkeypatch.setenv("DATASERVICE_AUTH_TOKEN", TOKEN)
        assert make(host="0.0.0.0").auth_token == TOKEN  # from the environment
        monkeypatch.delenv("DATASERVICE_AUTH_TOKEN")
    with pytest.raises(ValueError, match="without an auth token"):
        ds.DispatchServer(DispatcherConfig(host="0.0.0.0"))
    assert "auth_token" not in repr(DispatcherConfig(auth_token=TOKEN))  # no secret in logs


def test_a_token_must_be_long_enough_and_files_must_exist(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="at least 16"):
        resolve_token("short")
    monkeypatch.setenv("DATASERVICE_AUTH_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="cannot read the auth token file"):
        resolve_token(None)
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("DATASERVICE_AUTH_TOKEN_FILE", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="is empty"):
        resolve_token(None)
    with pytest.raises(ValueError, match="is empty"):
        ds.distribute("parallel_epochs", "localhost:1")  # at once, not mid-read


@pytest.mark.slow
@pytest.mark.parametrize("command", ["dispatcher", "worker"])
def test_the_cli_refuses_every_interface_without_a_token_and_warns_when_insecure(procs, token_file, command):
    args = ["-m", "dataservice", command, "--port", "0", "--host", "0.0.0.0"]
    if command == "worker":
        args += ["--dispatcher", "localhost:1", "--dispatcher-timeout-ms", "1000"]
    refused = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=subprocess_env(), cwd=REPO,
                             timeout=30)
    assert refused.returncode == 2, refused.stderr
    assert "without an auth token" in refused.stderr and "--insecure" in refused.stderr
    assert "Traceback" not in refused.stderr

    insecure = procs.spawn(*args, "--insecure", name=f"insecure-{command}")
    insecure.wait_for_line(rf"^{command} listening on ")
    wait_until(lambda: "WITHOUT an auth token (insecure)" in insecure.stderr, 10, "the insecure warning")

    secured = procs.spawn(*args, "--auth-token-file", token_file, name=f"secured-{command}")
    secured.wait_for_line(rf"^{command} listening on ")
    assert "WITHOUT an auth token" not in secured.stderr
